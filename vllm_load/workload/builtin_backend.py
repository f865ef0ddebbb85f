"""The built-in Mistral tokenizer without transformers: its Rust tokenizer (``tokenizers``) and its chat template
(Jinja2, in the sandbox and with the filters transformers renders chat templates with).

Why: every Locust process, worker and embedded emulator loads this tokenizer (it is the default). Through
transformers that cost 2.3 s of CPU each on this project's 2-core host: 1.1 s to import transformers (its lazy
import structure reads the 3,344 files of ``transformers/models``), 0.8 s more when ``AutoTokenizer`` imports
``transformers.models`` (the same scan again) and 0.4 s converting the SentencePiece model. Here it is the
``tokenizer.json`` converted once, when the folder is made, and a template compiled once. The ids and the rendered
text equal transformers' (tests/test_builtin_tokenizer.py checks both against ``AutoTokenizer`` on the same folder).
Only the built-in folder loads this way: a user's tokenizer folder goes through transformers, whose templates use
more than this one does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the folder's files: ``tokenizer_config.json`` (transformers' view, kept for ``--tokenizer FOLDER`` users and
#: the tests) and the converted ``tokenizer.json`` this backend reads
CONFIG = "tokenizer_config.json"
TOKENIZER_JSON = "tokenizer.json"


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """transformers' ``tojson`` filter (Jinja's own escapes HTML characters, which would change the count)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class BuiltinBackend:
    """The part of a transformers tokenizer that ``Tokenizer`` uses: the Rust backend (``_tokenizer``), the
    vocabulary, the template and its rendering, and ``__call__`` for ids."""

    def __init__(self, folder: Path) -> None:
        import jinja2.ext
        import tokenizers
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        config = json.loads((folder / CONFIG).read_text())
        self._tokenizer = tokenizers.Tokenizer.from_file(str(folder / TOKENIZER_JSON))
        self.chat_template: str = config["chat_template"]
        self.model_max_length = int(config["model_max_length"])
        self._special = {k: config[k] for k in ("bos_token", "eos_token", "unk_token")}
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        self._template = env.from_string(self.chat_template)

    @property
    def eos_token(self) -> str:
        return str(self._special["eos_token"])

    @property
    def all_special_tokens(self) -> list[str]:
        """As transformers': the special tokens' texts (``<s>``, ``</s>``, ``<unk>``)."""
        return [str(v) for v in self._special.values() if v]

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
                            tokenize: bool = False, tools: list | None = None) -> str:
        if tokenize:
            raise ValueError("the built-in backend renders text; Tokenizer.encode_chat encodes it")
        return self._template.render(messages=messages, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt, **self._special)

    def __call__(self, texts: str | list[str], add_special_tokens: bool) -> dict[str, Any]:
        """transformers' shape: one text's ids, or each text's."""
        many = [texts] if isinstance(texts, str) else texts
        ids = [e.ids for e in self._tokenizer.encode_batch(many, add_special_tokens=add_special_tokens)]
        return {"input_ids": ids[0] if isinstance(texts, str) else ids}
