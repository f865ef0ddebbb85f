#!/usr/bin/env bash
# A real non-vLLM OpenAI server for the tests: `transformers serve` (Hugging Face transformers), CPU, offline.
#
#   T=DIR bash transformers-serve.sh install                 # venv + torch (CPU) + transformers[serving] (~2 min)
#   T=DIR PORT=P bash transformers-serve.sh serve MODEL_DIR [flags...]
#                                                            # start on 127.0.0.1:P, wait for /v1/models (~5 s)
#   T=DIR PORT=P bash transformers-serve.sh stop             # stop it (its process group)
#
# Its streams end after the chunk that carries finish_reason and usage (no `data: [DONE]`), its /v1/models says
# owned_by "local", and it refuses vLLM's body fields (ignore_eos, min_tokens) with 422.
set -euo pipefail
T=${T:-$HOME/.cache/vllm-load/transformers-serve}
PORT=${PORT:-8021}
mkdir -p "$T/tmp" "$T/cache"
export TMPDIR=$T/tmp XDG_CACHE_HOME=$T/cache HF_HOME=$T/cache/hf HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       DO_NOT_TRACK=1 PIP_NO_CACHE_DIR=1

case "${1:-}" in
  install)
    python3 -m venv "$T/venv"
    # the local CPU torch wheel (without the pin pip pulls a CUDA build)
    timeout 1500 "$T/venv/bin/pip" install -q 'torch==2.13.0+cpu' 'transformers[serving]'
    "$T/venv/bin/transformers" --help >/dev/null
    ;;
  serve)
    model=${2:?MODEL_DIR}; shift 2
    setsid "$T/venv/bin/transformers" serve "$model" --host 127.0.0.1 --port "$PORT" --device cpu "$@" \
      > "$T/serve-$PORT.log" 2>&1 < /dev/null &
    echo $! > "$T/serve-$PORT.pid"
    for _ in $(seq 1 240); do
      if curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1; then echo "ready (pid $(cat "$T/serve-$PORT.pid"))"; exit 0; fi
      kill -0 "$(cat "$T/serve-$PORT.pid")" 2>/dev/null || { tail -20 "$T/serve-$PORT.log"; exit 1; }
      sleep 0.5
    done
    tail -20 "$T/serve-$PORT.log"; exit 1
    ;;
  stop)
    pid=$(cat "$T/serve-$PORT.pid" 2>/dev/null || true)
    [ -n "$pid" ] || exit 0
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$T/serve-$PORT.pid" "$T/serve-$PORT.log"
    ;;
  *) echo "usage: T=DIR bash $0 install|serve MODEL_DIR [flags]|stop" >&2; exit 2 ;;
esac
