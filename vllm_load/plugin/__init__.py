"""The Locust plugin, the only package that imports Locust: options, listeners, the per-process runtime,
users, the sweep shape, the web UI tab, and the child servers it starts."""
