"""Streaming /v1/chat/completions load: `locust -f locustfiles/chat.py [--host URL]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.

The same file ships in the package (vllm_load/locustfiles/chat.py): `locust -f "$(vllm-load locustfile chat)"`.
"""

from vllm_load.locustfiles.chat import *  # noqa: F401,F403  (Locust collects the classes of this module)
