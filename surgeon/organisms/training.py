"""Deterministic training of the model organisms (CPU by default, any device works)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterator

TextStream = Callable[[random.Random], Iterator[tuple[str, str]]]


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 200
    head_dropout: float = 0.0  # probability of zeroing each head's output (hook_z) per example
    # an auxiliary loss sharpening a previous-token head: weight * -log(attention from p to p-1) of head
    # (layer, head), averaged over positions >= 2, from step `previous_token_from` on; head None: the head of
    # that layer attending most to p-1 at that step (what the rest of the model does with it is learned)
    previous_token_head: tuple[int, int | None] | None = None
    previous_token_weight: float = 0.0
    previous_token_from: int = 0
    seed: int = 0


def encode_batch(tokenizer, examples: list[tuple[str, str]], bos_id: int):
    """Right-padded token ids and a mask that is 1 where the *next* token is a continuation token."""
    import torch

    rows, masks = [], []
    for prompt, cont in examples:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
        c = tokenizer(cont, add_special_tokens=False)["input_ids"]
        ids = [bos_id] + p + c
        rows.append(ids)
        # position i predicts token i+1; train where token i+1 belongs to the continuation
        masks.append([0] * len(p) + [1] * len(c))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    tokens = torch.full((len(rows), width), pad, dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width - 1))
    for i, (r, m) in enumerate(zip(rows, masks)):
        tokens[i, : len(r)] = torch.tensor(r)
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    return tokens, loss_mask


def train(model, texts: TextStream, cfg: TrainConfig, progress: bool = True) -> list[float]:
    """Train `model` (a HookedTransformer) in place on `texts`; returns the loss curve."""
    import torch  # here, not at the top: case files import the organisms and must load without torch
    from tqdm.auto import tqdm

    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    stream = texts(rng)
    tok = model.tokenizer
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * max(0.05, 1 - s / cfg.steps)
    )
    hooks = []
    if cfg.head_dropout > 0:
        gen = torch.Generator().manual_seed(cfg.seed + 1)

        def drop_heads(z, hook):
            keep = torch.rand((z.shape[0], 1, z.shape[2], 1), generator=gen) >= cfg.head_dropout
            return z * keep.to(z.device, z.dtype) / (1 - cfg.head_dropout)

        hooks = [(f"blocks.{layer}.attn.hook_z", drop_heads) for layer in range(model.cfg.n_layers)]
    device = next(model.parameters()).device
    losses: list[float] = []
    model.train()
    bar = tqdm(range(cfg.steps), desc="training", disable=not progress)
    head = None  # the sharpened previous-token head, once chosen
    for step in bar:
        batch = [next(stream) for _ in range(cfg.batch_size)]
        tokens, mask = encode_batch(tok, batch, tok.bos_token_id)
        tokens, mask = tokens.to(device), mask.to(device)
        seen: list = []
        step_hooks = list(hooks)
        if cfg.previous_token_head is not None and step >= cfg.previous_token_from:
            layer = cfg.previous_token_head[0]
            step_hooks.append((f"blocks.{layer}.attn.hook_pattern", lambda p, hook: seen.append(p)))
        logits = model.run_with_hooks(tokens, fwd_hooks=step_hooks) if step_hooks else model(tokens)
        logp = logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]
        loss = lm_loss = -(logp * mask).sum() / mask.sum()
        if seen:
            q = torch.arange(2, tokens.shape[1], device=device)
            real = (tokens[:, q] != tok.pad_token_id).float()
            if head is None:
                head = cfg.previous_token_head[1]
                if head is None:  # the layer's head that attends most to p-1 now
                    head = int(((seen[0][:, :, q, q - 1] * real[:, None]).sum((0, 2))).argmax())
            prev = seen[0][:, head, q, q - 1].clamp_min(1e-6).log()
            loss = loss - cfg.previous_token_weight * (prev * real).sum() / real.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(lm_loss.item())  # the next-token loss (without the auxiliary term)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{lm_loss.item():.4f}")
    model.eval()
    return losses
