"""Server side of vllm-load: the vLLM emulator and the metrics sidecar."""
