"""The metrics sidecar: scrapes vLLM's /metrics (or its log lines) into one schema and serves the
series on the client's request. Run: python -m server.sidecar"""
