"""The Locust plugin, the only package that imports Locust: options, listeners, the worker<->master wire, the generator and collector of each process,
users, the sweep shape, the web UI tab, and the child servers it starts."""
