# vllm-load: the Locust master/workers and the sidecar (vLLM itself runs from vLLM's own image).
FROM python:3.11-slim
WORKDIR /app
COPY setup.py setup.cfg pyproject.toml README.md ./
COPY vllm_load ./vllm_load
COPY server ./server
COPY locustfiles ./locustfiles
# gcc builds the native receive thread (vllm_load/client/_rxnative.c) and the histograms' recorder
# (vllm_load/metrics/_hdrnative.c); the slim image has Python's headers.
# The build is checked: without it every stream would be timed by the Python reader.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir . \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
    && vllm-load native | grep -q "native reader: in use" \
    && python -c "import vllm_load.metrics._hdrnative"
ENV HF_HUB_OFFLINE=0
