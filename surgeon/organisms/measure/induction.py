"""Measuring organism:induction with the engine and plain TransformerLens hooks (above the engine; nothing below imports it)."""
from __future__ import annotations

import random

from surgeon.organisms.induction import ALPHABET, GAPS, PERIODS, sample


def _attention(model, tokens):
    import torch

    names = [f"blocks.{L}.attn.hook_pattern" for L in range(model.cfg.n_layers)]
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=names)
    return logits, [cache[n] for n in names]  # each [batch, head, query, key]


def measure(model, n: int = 32, seed: int = 1234) -> dict:
    """Measured on held-out sequences (n per period x gap cell, random prefixes):

    - per layer-0 head, the mean attention from each position p >= 2 to p - 1; the best is the
      previous-token head;
    - per layer-1 head, the mean attention from each token of the second copy (but its last) to the
      token after that token's first occurrence; the best is the induction head;
    - the loss on the second copy (its first token excluded: nothing predicts it), per period and per
      gap, and the loss when the previous-token head's output is zeroed (the path is needed).
    """
    import torch

    rng = random.Random(seed)
    tok = model.tokenizer
    device = next(model.parameters()).device
    H = model.cfg.n_heads
    prev = torch.zeros(H)
    ind = torch.zeros(H)
    prev_cnt = ind_cnt = 0
    loss_by_period: dict[int, list[float]] = {p: [] for p in PERIODS}
    loss_by_gap: dict[int, list[float]] = {g: [] for g in GAPS}
    batches = []
    for period in PERIODS:
        for gap in GAPS:
            seqs = [sample(rng, period, gap) for _ in range(n)]
            # pad the prefix so one batch has one length: every row of a cell is as long
            width = max(len(p) for p, _, _ in seqs)
            rows, starts = [], []
            for pre, a, g in seqs:
                pre = "".join(rng.sample([c for c in ALPHABET if c not in a + g + pre], width - len(pre))) + pre
                text = pre + a + g + a
                rows.append([tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"])
                starts.append((1 + len(pre), 1 + len(pre) + period + gap))  # first and second copy
            batches.append((period, gap, torch.tensor(rows, device=device), starts))
    for period, gap, tokens, starts in batches:
        logits, pats = _attention(model, tokens)
        T = tokens.shape[1]
        p0 = pats[0]  # [b, head, q, k]
        q = torch.arange(2, T, device=device)
        prev += p0[:, :, q, q - 1].mean(dim=(0, 2)).cpu() * len(q) * tokens.shape[0]
        prev_cnt += len(q) * tokens.shape[0]
        s1, s2 = starts[0]
        qpos = torch.arange(s2, s2 + period - 1, device=device)  # second copy, all but its last token
        kpos = torch.arange(s1 + 1, s1 + period, device=device)  # the token after each first occurrence
        ind += pats[1][:, :, qpos, kpos].sum(dim=(0, 2)).cpu()
        ind_cnt += len(qpos) * tokens.shape[0]
        logp = logits.log_softmax(-1)
        # positions s2 .. s2 + period - 2 predict the second copy's tokens 1 .. period - 1
        pred = logp[:, qpos].gather(-1, tokens[:, qpos + 1, None])[..., 0]
        loss = -pred.mean().item()
        loss_by_period[period].append(loss)
        loss_by_gap[gap].append(loss)
    prev, ind = prev / prev_cnt, ind / ind_cnt
    ph, ih = int(prev.argmax()), int(ind.argmax())

    # the previous-token head is needed: zero its output and measure the loss again
    def ablate(z, hook):
        z[:, :, ph] = 0
        return z

    ablated = []
    for period, gap, tokens, starts in batches[:: max(1, len(batches) // 20)]:
        s2 = starts[0][1]
        qpos = torch.arange(s2, s2 + period - 1, device=device)
        with torch.no_grad():
            lp = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", ablate)]).log_softmax(-1)
        ablated.append(-lp[:, qpos].gather(-1, tokens[:, qpos + 1, None])[..., 0].mean().item())
    mean = lambda xs: sum(xs) / len(xs)
    return {
        "previous_token_head": [0, ph],
        "previous_token_attention": float(prev[ph]),
        "previous_token_attention_per_head": [round(float(x), 4) for x in prev],
        "induction_head": [1, ih],
        "induction_attention": float(ind[ih]),
        "induction_attention_per_head": [round(float(x), 4) for x in ind],
        "repeat_loss_by_period": {str(p): round(mean(v), 5) for p, v in loss_by_period.items()},
        "repeat_loss_by_gap": {str(g): round(mean(v), 5) for g, v in loss_by_gap.items()},
        "repeat_loss_max": max(max(mean(v) for v in loss_by_period.values()), max(mean(v) for v in loss_by_gap.values())),
        "repeat_loss_with_previous_token_head_zeroed": mean(ablated),
        "n_per_cell": n,
        "seed": seed,
    }
