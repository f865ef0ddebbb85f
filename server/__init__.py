"""Server side of vllm-load: the vLLM emulator and the metrics sidecar."""

import os

# transformers prints "PyTorch was not found …" on import; the emulator only needs its tokenizers
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
