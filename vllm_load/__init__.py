"""vllm-load: distributed, exact load testing for vLLM and OpenAI-compatible servers, on Locust.

Packages, from a request outwards: ``client`` (one streaming request), ``workload`` (what is sent),
``metrics`` (the numbers and their judgement), ``rundir`` (the run's files), ``report`` (rendering) and
``plugin`` (the only one that imports Locust). The user classes are exported lazily, so that importing
vllm_load (the report CLI does) does not import Locust and its monkey-patching.
"""

import os
from typing import Any

# transformers prints "PyTorch was not found …" on import; vllm-load only needs its tokenizers
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from vllm_load.version import __version__  # noqa: F401  (the version, once: vllm_load/version.py)
_USERS = ("LLMUser", "ChatUser", "CompletionsUser")


def __getattr__(name: str) -> Any:
    if name in _USERS:
        from vllm_load.plugin.load import users

        return getattr(users, name)
    if name == "Reply":
        from vllm_load.client.reply import Reply

        return Reply
    if name == "on_fault":  # a locustfile's own fault action (--fault 'AT: call: NAME')
        from vllm_load.plugin.watch.fault_plan import on_fault

        return on_fault
    if name == "UsageError":
        from vllm_load.errors import UsageError

        return UsageError
    raise AttributeError(f"module 'vllm_load' has no attribute {name!r}")
