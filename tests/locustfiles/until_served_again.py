"""multiturn.py's conversations (chat.py's single turns with $VLLM_LOAD_TEST_USERS=chat) through a fleet, held at
``-u`` users until the replica at $VLLM_LOAD_TEST_RESTARTED (its URL) has gone down and, started again, served
$VLLM_LOAD_TEST_SERVED_AGAIN requests by its own counter (a restarted vLLM counts from 0); then the run ends (``-t``
caps it). A real vLLM restarts in
18 s on a quiet 2-core machine and took over 50 s beside 4 users sending without a pause: a fixed -t either ended
before the restart on a busy host or idled on a quiet one."""

import os
import urllib.request

from locust import LoadTestShape

if os.environ.get("VLLM_LOAD_TEST_USERS") == "chat":  # single-turn chats: their requests as long as asked
    from vllm_load.locustfiles.chat import *  # noqa: F401,F403  (Locust collects the classes of this module)
else:
    from vllm_load.locustfiles.multiturn import *  # noqa: F401,F403

URL = os.environ.get("VLLM_LOAD_TEST_RESTARTED", "")
AGAIN = int(os.environ.get("VLLM_LOAD_TEST_SERVED_AGAIN", "5"))


def served(url: str) -> float | None:
    """The replica's vllm:request_success_total (every label set), or None while it does not answer."""
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=2).read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


class UntilServedAgain(LoadTestShape):
    use_common_options = True  # -u, -r and -t as given

    def __init__(self) -> None:
        super().__init__()
        self.went_down = False

    def tick(self):
        count = served(URL)
        if count is None:
            self.went_down = True
        elif self.went_down and count >= AGAIN:
            return None
        opts = self.runner.environment.parsed_options
        if opts.run_time and self.get_run_time() > opts.run_time:
            return None
        return opts.num_users, opts.spawn_rate
