"""The vLLM emulator: vLLM's OpenAI HTTP API, SSE chunk shapes and /metrics, over a fixed schedule
or a continuous-batching model (KV blocks, preemption, prefix cache). Run: python -m server.emulator"""
