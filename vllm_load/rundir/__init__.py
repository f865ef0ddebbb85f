"""The run directory's files: the per-request log and the sweep's per-step directories."""
