"""vllm-load: distributed, exact load testing for vLLM and OpenAI-compatible servers, on Locust."""

__version__ = "0.1.0"
