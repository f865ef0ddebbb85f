"""The shipped locustfiles, installed with the package: `locust -f "$(vllm-load locustfile chat)"`."""
