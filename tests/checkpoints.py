"""Tiny random Hugging Face checkpoints of real architectures, saved to disk like a user's checkpoint."""
from __future__ import annotations

import string
from pathlib import Path

from surgeon import Case, Item

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

PAIRS = [("9.8", "9.11"), ("3.7", "3.52"), ("12.4", "12.38"), ("5.9", "5.61"), ("7.6", "7.25"), ("2.8", "2.74"),
         ("4.2", "17.45"), ("8.3", "2.71")]
# the case the bridge tests and bench/bridge.py run: 8 decimal items (6 traps), a plain and a Q&A format
BRIDGE_CASE = Case(
    name="bridge_decimal",
    formats={"simple": "Which is bigger: {a} or {b}?\nAnswer:", "qa": "Q: Which is bigger: {a} or {b}?\nA:"},
    good="simple", bad=["qa"], align="last",
    items=[Item({"a": a, "b": b}, correct=f" {max(a, b, key=float)}", incorrect=f" {min(a, b, key=float)}",
                tag="trap" if i < 6 else "control") for i, (a, b) in enumerate(PAIRS)],
)


def char_bpe_tokenizer(specials: list[str], chat_template: str | None = None):
    """A character-level BPE tokenizer without an unknown token (unknown characters vanish, as in
    tokenizers without byte fallback), with special tokens and optionally a chat template."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = ["\n"] + [c for c in string.printable if c.isprintable()]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0], eos_token=specials[1],
                                   pad_token=specials[1])
    if chat_template:
        fast.chat_template = chat_template
    return fast


def _save(model, tok, path: Path) -> Path:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_llama(path: Path, n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2, hidden: int = 64) -> Path:
    """A tiny Llama; make_llama(p, 32, 32, 8) has Llama-3.1-8B's layer and head layout (at hidden=64, heads of 2
    dimensions)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = char_bpe_tokenizer(["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"],
                             LLAMA3_TEMPLATE)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=128, num_hidden_layers=n_layers,
                      num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, max_position_embeddings=256,
                      rope_theta=500000.0, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    return _save(LlamaForCausalLM(cfg), tok, path)


def make_gpt2(path: Path) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = char_bpe_tokenizer(["<|endoftext|>", "<|pad|>"])
    cfg = GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=128,
                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return _save(GPT2LMHeadModel(cfg), tok, path)


def make_qwen2(path: Path) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = char_bpe_tokenizer(["<|endoftext|>", "<|im_end|>"])
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    return _save(Qwen2ForCausalLM(cfg), tok, path)


def make_gemma2(path: Path) -> Path:
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    tok = char_bpe_tokenizer(["<bos>", "<eos>"])
    cfg = Gemma2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                       sliding_window=64, query_pre_attn_scalar=16)
    torch.manual_seed(0)
    return _save(Gemma2ForCausalLM(cfg), tok, path)


def word_tokenizer(texts, specials=("<|endoftext|>",)):
    """GPT-2-style pre-tokenization (byte-level, 'Ġ' for spaces) with one token per pre-token seen in
    `texts`: a stand-in that splits the case's words like GPT-2 does (names are one token each)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words = sorted({w for t in texts for w, _ in pre.pre_tokenize_str(t)})
    vocab = {t: i for i, t in enumerate(list(specials) + ["<unk>"] + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0], eos_token=specials[0],
                                   unk_token="<unk>")


def case_texts(case):
    from surgeon.case.encoding import render

    out = []
    for it in case.items:
        out += [render(f, it.values, None)[0] for f in case.formats.values()] + [it.correct, it.incorrect]
    return out


def make_gpt2_standin(path: Path, case) -> Path:
    """GPT-2 small's layout (12 layers x 12 heads) with tiny widths and a vocabulary of the case's words."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = word_tokenizer(case_texts(case))
    cfg = GPT2Config(vocab_size=len(tok), n_embd=96, n_layer=12, n_head=12, n_positions=128, bos_token_id=0,
                     eos_token_id=0)
    torch.manual_seed(0)
    return _save(GPT2LMHeadModel(cfg), tok, path)
