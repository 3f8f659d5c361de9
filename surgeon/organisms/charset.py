"""A character-level tokenizer for the model organisms.

Every printable ASCII character and the newline is one token, so any case text can be tokenized
and an answer such as " 9.11" is several tokens, as with real tokenizers.
"""
from __future__ import annotations

import string
from pathlib import Path

SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = ["\n"] + [c for c in string.printable if c.isprintable()]


def vocab() -> dict[str, int]:
    return {tok: i for i, tok in enumerate(SPECIAL + CHARS)}


def build_tokenizer(name: str = "surgeon-charset"):
    """A `transformers.PreTrainedTokenizerFast` over single characters (BOS added by the caller)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return wrap(tok, name)


def wrap(tok, name: str):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        name_or_path=name,
        add_bos_token=True,
        padding_side="right",
    )


def load_tokenizer(path: Path, name: str):
    from tokenizers import Tokenizer

    return wrap(Tokenizer.from_file(str(path)), name)
