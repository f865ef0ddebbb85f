"""A test locustfile (not shipped): chat.py's users, and each worker's "all my users spawned" instant appended to
the file $SPAWN_LOG as "<worker index> <time.time()>" (start-up test: the first request follows it)."""

import os
import time

from locust import events
from locust.runners import WorkerRunner

from vllm_load.locustfiles.chat import *  # noqa: F401,F403  (Locust collects the classes of this module)


@events.init.add_listener
def _on_init(environment, **_kw):
    def spawned(**_kw2):
        if isinstance(environment.runner, WorkerRunner):
            with open(os.environ["SPAWN_LOG"], "a") as fh:
                fh.write(f"{environment.runner.worker_index} {time.time():.6f}\n")

    environment.events.spawning_complete.add_listener(spawned)
