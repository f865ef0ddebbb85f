"""Load the target model's tokenizer and count tokens exactly the way vLLM's OpenAI server does.

vLLM tokenizes a /v1/completions prompt with the tokenizer's special tokens (BOS) and a chat request
by rendering the chat template to text (with the generation prompt) and tokenizing that text with
``add_special_tokens=False``. ``Tokenizer.count_completion`` / ``count_chat`` mirror those two paths,
so a prompt built here has the length the server will report in ``usage.prompt_tokens``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.workload.builtin_backend import CONFIG, TOKENIZER_JSON, BuiltinBackend

#: The Mistral 7B v0.1 SentencePiece model that the ``mistral-common`` wheel ships, with the
#: Mistral instruct chat template. It is the emulator's model, so no hub is ever needed.
BUILTIN_MISTRAL = "builtin:mistral-7b-v0.1"
#: mistral-common's Tekken (tiktoken-style byte-level BPE) file, loaded through transformers'
#: MistralCommonBackend, which counts chat tokens the way vLLM's ``--tokenizer-mode mistral`` does.
BUILTIN_TEKKEN = "builtin:mistral-tekken"
EMULATOR_MODEL = "emulator/mistral-7b-v0.1"
#: Mistral's instruct template, with the v3 tokenizer's tool markers spelled as text (v0.1's vocabulary has
#: no control tokens for them): the tools offered, an assistant's tool calls and the tool results all count. A
#: system message goes before the last user message's text, as Mistral's v0.3 template puts it (v0.1's had no
#: system branch and counted it as 0 tokens).
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}{{ '[AVAILABLE_TOOLS] ' + (tools | tojson) + ' [/AVAILABLE_TOOLS]' }}{% endif %}"
    "{% set ns = namespace(system='', last_user=-1) %}"
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{% set ns.system = ns.system + message['content'] %}"
    "{% elif message['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{% if loop.index0 == ns.last_user and ns.system %}"
    "{{ '[INST] ' + ns.system + '\\n\\n' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}"
    "{% elif message['role'] == 'assistant' %}"
    "{% if message.get('tool_calls') %}{{ '[TOOL_CALLS] ' + (message['tool_calls'] | tojson) + eos_token }}"
    "{% else %}{{ (message['content'] or '') + eos_token }}{% endif %}"
    "{% elif message['role'] == 'tool' %}{{ '[TOOL_RESULTS] ' + message['content'] + ' [/TOOL_RESULTS]' }}"
    "{% endif %}{% endfor %}"
)
_ALIASES = {EMULATOR_MODEL: BUILTIN_MISTRAL, "mistral-7b": BUILTIN_MISTRAL, "builtin": BUILTIN_MISTRAL}


def _cache_dir() -> Path:
    """Where the built-in tokenizers' folders are kept between runs (public data, named by content): the user's
    cache folder, else the temp folder."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-load"
    try:
        base.mkdir(parents=True, exist_ok=True)
        return base
    except OSError:
        return Path(tempfile.gettempdir())


def _builtin_tekken_dir() -> Path:
    import mistral_common

    src = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    target = _cache_dir() / f"vllm-load-tekken-{hashlib.sha1(src.read_bytes()).hexdigest()[:12]}"
    if not (target / "tekken.json").exists():
        tmp = Path(tempfile.mkdtemp(prefix="vllm-load-tok-", dir=target.parent))  # os.replace: same filesystem
        shutil.copy(src, tmp / "tekken.json")
        try:
            os.replace(tmp, target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _builtin_mistral_dir() -> Path:
    """Materialise a Hugging Face tokenizer folder around mistral-common's SentencePiece file, with its conversion
    to a ``tokenizer.json`` (made once, through transformers; every load after reads it without transformers:
    workload/builtin_backend.py)."""
    try:
        import mistral_common
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise UsageError("the built-in tokenizer needs mistral-common: pip install mistral-common") from exc
    src = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    digest = hashlib.sha1(src.read_bytes() + MISTRAL_CHAT_TEMPLATE.encode() + TOKENIZER_JSON.encode()).hexdigest()[:12]
    target = _cache_dir() / f"vllm-load-tokenizer-{digest}"
    if not (target / TOKENIZER_JSON).exists():
        tmp = Path(tempfile.mkdtemp(prefix="vllm-load-tok-", dir=target.parent))  # os.replace: same filesystem
        shutil.copy(src, tmp / "tokenizer.model")
        config = {
            "tokenizer_class": "LlamaTokenizer",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": False,
            "legacy": False,
            "model_max_length": 32768,
            "chat_template": MISTRAL_CHAT_TEMPLATE,
        }
        (tmp / CONFIG).write_text(json.dumps(config))
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.AutoTokenizer.from_pretrained(str(tmp)).backend_tokenizer.save(str(tmp / TOKENIZER_JSON))
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race; its folder is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@dataclass(eq=False)
class Tokenizer:
    """A loaded tokenizer plus the two counting paths of vLLM's server."""

    name: str
    hf: Any
    mistral_common: bool = False  # chat is encoded by mistral-common, not by a Jinja template

    def __post_init__(self) -> None:
        # A fast tokenizer's Rust side, called as transformers' __call__ calls it, minus its ~17 us of Python
        # per call (57 -> 40 us for 81 tokens): the prompt thread holds the GIL for that Python, and the event
        # loop waits. encode_batch, not encode: only the batch call releases the GIL (encode held it for 345 ms
        # of a 100k-word text). Only where __call__ would not change the backend's state first (it turns off
        # truncation and padding that a tokenizer.json may set).
        backend = getattr(self.hf, "_tokenizer", None)
        usable = (backend is not None and hasattr(backend, "encode_batch") and not self.mistral_common
                  and getattr(backend, "truncation", 0) is None and getattr(backend, "padding", 0) is None)
        # encode_batch_fast, where the installed tokenizers has it, skips the character offsets nobody here
        # reads: the same ids (checked against __call__ in the tests), 34.5 -> 24.1 us for a 24-token prompt,
        # 200 -> 138 ms for 120k tokens, and it releases the GIL as encode_batch does. That is CPU the prompt
        # thread takes from the loop's core. None: through __call__.
        self._encode_many = (getattr(backend, "encode_batch_fast", None) or backend.encode_batch) if usable else None

    @property
    def has_chat_template(self) -> bool:
        return self.mistral_common or bool(getattr(self.hf, "chat_template", None))

    @functools.cached_property
    def special_texts(self) -> tuple[str, ...]:
        """The special tokens' texts (``</s>``, ``<|im_end|>``): none of them belongs in an answer's content. Those
        of a single character or of plain words are left out (a byte-level tokenizer may name ``a`` special)."""
        found = set(getattr(self.hf, "all_special_tokens", None) or ())
        for tok in (getattr(self.hf, "added_tokens_decoder", None) or {}).values():
            if getattr(tok, "special", False):
                found.add(str(tok.content))
        return tuple(sorted(t for t in found if len(t) > 1 and not t.isalnum()))

    @property
    def model_max_length(self) -> int:
        value = int(getattr(self.hf, "model_max_length", 0) or 0)
        return value if 0 < value < 10**9 else 0

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.encode_batch([text], add_special_tokens)[0]

    def encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        """The ids of each text, in one call: the Rust backend directly (one release of the GIL for the whole
        batch) where transformers' ``__call__`` would only forward to it, else ``__call__``."""
        if self._encode_many is not None:
            return [e.ids for e in self._encode_many(texts, add_special_tokens=add_special_tokens)]
        return self.hf(texts, add_special_tokens=add_special_tokens)["input_ids"]

    def render_chat(self, messages: list[dict[str, Any]], tools: list | None = None) -> str:
        """The chat template's text, as vLLM renders it (generation prompt; ``tools`` passed to the template)."""
        if not self.has_chat_template:
            raise UsageError(
                f"tokenizer {self.name!r} has no chat template: use locustfiles/completions.py "
                "or a tokenizer folder whose tokenizer_config.json has chat_template"
            )
        extra = {"tools": tools} if tools else {}
        return self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)

    def count_completion(self, prompt: str) -> int:
        return len(self.encode(prompt, add_special_tokens=True))

    def encode_chat(self, messages: list[dict[str, Any]], tools: list | None = None) -> list[int]:
        if self.mistral_common:
            if not self.has_chat_template:
                self.render_chat(messages)
            extra = {"tools": tools} if tools else {}
            return list(self.hf.apply_chat_template(messages, tokenize=True, **extra)["input_ids"])
        return self.encode(self.render_chat(messages, tools), add_special_tokens=False)

    def count_chat(self, messages: list[dict[str, Any]], tools: list | None = None) -> int:
        return len(self.encode_chat(messages, tools))

    def count_responses(self, messages: list[dict[str, Any]], tools: list | None = None) -> int:
        """The input tokens of a Responses API request: vLLM 0.32 renders the chat template and encodes it
        with the tokenizer's special tokens (a BOS-adding tokenizer: one more than the same chat request)."""
        return self.count_chat(messages, tools) + self.special_tokens_added

    @functools.cached_property
    def special_tokens_added(self) -> int:
        """How many tokens encoding with special tokens adds to a text (0 with a mistral-common tokenizer): counted
        once, for every Responses request after."""
        if self.mistral_common:
            return 0
        return len(self.encode("a", add_special_tokens=True)) - len(self.encode("a", add_special_tokens=False))

    def count_chat_batch(self, conversations: list[list[dict[str, str]]]) -> list[int]:
        if self.mistral_common:
            return [self.count_chat(m) for m in conversations]
        return self.count_batch([self.render_chat(m) for m in conversations], add_special_tokens=False)

    def count_batch(self, texts: list[str], add_special_tokens: bool) -> list[int]:
        """Token counts of many texts in one call (the Rust side parallelises it until
        ``encode_in_calling_thread``)."""
        return [len(ids) for ids in self.encode_batch(texts, add_special_tokens)]


#: tokenizers' switch for its Rust thread pool (rayon), read at every batch call
PARALLELISM_ENV = "TOKENIZERS_PARALLELISM"


def encode_in_calling_thread() -> None:
    """From now on this process's tokenizer calls run in the thread that makes them. A batch call otherwise
    runs on tokenizers' own thread pool, whose threads keep the priority of the thread that first used it:
    the event loop's. The prompt thread runs at nice 10 so that the loop goes first. At 256 streams turning
    over 2,500 requests/s on one core, its encodes ran in a nice-0 pool thread instead (15 % of the core),
    and the loop stalled over 2 ms 11 times in 10 s (median of 3 runs of turnover.py), 5 times with this
    (median of 5).
    Called once a load generator's prompt pools are ready: the start-up probes, a batch over the whole
    vocabulary, still run in parallel."""
    os.environ[PARALLELISM_ENV] = "false"


def resolve_name(name: str) -> str:
    return _ALIASES.get(name, name)


#: how long the hub gets to answer one connection before a tokenizer id neither local nor cached is refused
HUB_PROBE_S = 3.0


def hub_reachable_or_cached(repo: str, name: str) -> None:
    """A Hugging Face id whose files are not in the local cache, with the hub out of reach (offline mode, or one
    connection refused or timed out), is refused at once in one line: huggingface_hub's own retries took 50 s of
    warnings first. Cached files need no hub (the load then runs offline)."""
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = any(isinstance(try_to_load_from_cache(repo, f), str)
                     for f in ("tokenizer_config.json", "tokenizer.json", "tekken.json"))
    except Exception:  # noqa: BLE001 - not a repository id at all: the hub would refuse it too
        cached = False
    if cached:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        return
    hint = f"pass --tokenizer with a local folder (the server's tokenizer files) or {BUILTIN_MISTRAL}"
    if repo.startswith(("/", ".", "~")) or repo.count("/") > 1:  # a path, not a hub id (ORG/NAME)
        raise UsageError(f"cannot load tokenizer {name!r}: no such folder: {hint}")
    where = f"cannot load tokenizer {name!r}: no local folder and not in the Hugging Face cache"
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise UsageError(f"{where}, and the hub is off (HF_HUB_OFFLINE): {hint}")
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=HUB_PROBE_S).close()
    except OSError as exc:
        raise UsageError(f"{where}, and {constants.ENDPOINT} cannot be reached ({exc.strerror or exc}): {hint}") from None


def check_name(name: str) -> str:
    """``name`` as it is loaded (a built-in's folder, a local folder, a hub id), refused in one line (UsageError)
    where it cannot be: an unknown built-in, a missing folder, a hub id neither cached nor reachable. The options'
    check calls it for a given --tokenizer before anything starts (an embedded emulator was started first)."""
    resolved = resolve_name(name)
    if resolved.startswith("builtin:") and resolved not in (BUILTIN_MISTRAL, BUILTIN_TEKKEN):
        raise UsageError(f"--tokenizer {name!r} is no built-in tokenizer: the built-ins are {BUILTIN_MISTRAL} and "
                         f"{BUILTIN_TEKKEN}")
    if resolved == BUILTIN_MISTRAL:
        path = str(_builtin_mistral_dir())
    elif resolved == BUILTIN_TEKKEN:
        path = str(_builtin_tekken_dir())
    else:
        path = resolved
    if Path(path).exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    else:
        hub_reachable_or_cached(path, name)
    return path


@functools.lru_cache(maxsize=8)
def load_tokenizer(name: str) -> Tokenizer:
    """Load by built-in name, local folder, or Hugging Face id (offline when the files are local)."""
    resolved = resolve_name(name)
    os.environ.setdefault(PARALLELISM_ENV, "true")
    path = check_name(name)
    local = Path(path)
    is_tekken = local.is_dir() and (local / "tekken.json").exists() and not (local / "tokenizer.json").exists()
    if resolved == BUILTIN_MISTRAL:
        return Tokenizer(name=name, hf=BuiltinBackend(local))
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        if is_tekken:
            from transformers.tokenization_mistral_common import MistralCommonBackend

            hf = MistralCommonBackend.from_pretrained(path)
        else:
            hf = transformers.AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises OSError/ValueError/HF errors alike
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"cannot load tokenizer {name!r} ({first[:160]}): pass --tokenizer with a local folder, "
            f"a reachable Hugging Face id, or {BUILTIN_MISTRAL}"
        ) from None
    return Tokenizer(name=name, hf=hf, mistral_common=is_tekken)
