# vllm-load: the Locust master/workers and the sidecar (vLLM itself runs from vLLM's own image).
FROM python:3.11-slim
WORKDIR /app
COPY setup.cfg pyproject.toml README.md ./
COPY vllm_load ./vllm_load
COPY server ./server
COPY locustfiles ./locustfiles
RUN pip install --no-cache-dir .
ENV HF_HUB_OFFLINE=0
