"""Real tokenizers without a download: mistral-common's SentencePiece model, and a byte-level BPE
trained here with `tokenizers` on text this machine already has (Python's own sources)."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

CHATML = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|eos|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")


def build_byte_level_bpe(out: Path, vocab: int = 4096) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(glob.glob(os.path.join(sys.base_prefix, "lib", "python3*", "*.py")))[:60]

    def corpus():
        for f in files:
            with open(f, encoding="utf-8", errors="ignore") as fh:
                for line in fh:
                    if line.strip():
                        yield line.strip()

    specials = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainer=trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B",
                                                       special_tokens=[("<|bos|>", bos)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                 pad_token="<|pad|>", model_max_length=4096)
    hf.chat_template = CHATML
    hf.save_pretrained(str(out))
    return out
