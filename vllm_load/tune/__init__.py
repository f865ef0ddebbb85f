"""vllm-load tune: the capacity search over server configurations (search, server lifecycle, probes, report)."""
