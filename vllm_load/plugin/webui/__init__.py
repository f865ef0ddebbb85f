"""Locust's web UI: the vllm-load tab, its live view and charts, the form, and the gate that refuses foreign Hosts and origins."""
