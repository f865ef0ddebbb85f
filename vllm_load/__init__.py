"""vllm-load: distributed, exact load testing for vLLM and OpenAI-compatible servers, on Locust."""

import os

# transformers prints "PyTorch was not found …" on import; vllm-load only needs its tokenizers
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

__version__ = "0.1.0"
