"""Edge-level circuit work on a GPT-2-small-shaped model: surgeon's core vs one hooked forward per edge / circuit.

The model is made here (12 layers x 12 heads, d_model 768, d_mlp 3072, random weights; 32,491 edges in its
graph) with the organisms' character tokenizer; 32 items of ~20 tokens in two formats of different lengths
(the case's setting: aligned at the last prompt token and the answer). Measured side by side in one run
(this machine is noisy: compare the ratios):

  EAP      every edge's attribution (surgeon, everything it runs: the clean runs of both formats + one forward
           and one backward of the masked core) vs the floor: one forward + backward of the failing run with the
           same TransformerLens blocks, weights frozen (gradients w.r.t. activations only, as EAP needs), logits
           only where the metric reads (bench/careful.py); also the floor plus the other run's forward;
  exact    the top edges by EAP score each patched alone, edges in the batch dimension, only the patched
           positions recomputed over a cache of the prefix, vs one full `run_with_hooks` forward per edge
           adding that sender's difference to that receiver's input (timed on a sample of the edges; the
           scores are checked to agree to 1e-4);
  curve    the 10 circuits of MIB's faithfulness curve in one batch vs one hooked forward per circuit
           (an independent implementation of the circuit semantics: edges out of the input carry the other
           run's embedding, edges inside pass on current values, edges outside are frozen to this run's);
           scores checked to agree.
Then the memory the edge buffers take, here and for Llama-3.1-8B.

    python bench/edges.py [--items 32] [--top 200] [--loop-edges 40] [--threads 2] [--save]
"""
from __future__ import annotations

import argparse
import random
import string
import time

import numpy as np
import torch

FORMATS = ("Q: {a} or {b}?\nA:", "Question: {a} or {b}?\nAnswer:")


def best_time(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def make_model():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from surgeon.organisms.charset import build_tokenizer

    tok = build_tokenizer("bench-gpt2-shape")
    cfg = HookedTransformerConfig(n_layers=12, d_model=768, n_heads=12, d_head=64, d_mlp=3072, n_ctx=64,
                                  d_vocab=len(tok), act_fn="gelu_new", normalization_type="LN", seed=0,
                                  default_prepend_bos=True)
    model = HookedTransformer(cfg, tokenizer=tok)
    model.eval()
    return model


class Reference:
    """One hooked TransformerLens forward per patch, over all rows at once (all rows have equal length)."""

    def __init__(self, model, site, base_rows, source_rows, how):
        from surgeon.sites.edges import split_inputs
        from surgeon.case.encoding import align

        self.model, self.site = model, site
        assert len({len(r.tokens) for r in base_rows}) == 1 and len({len(r.tokens) for r in source_rows}) == 1
        self.rows = base_rows
        self.tokens = torch.tensor([r.tokens for r in base_rows])
        src_tokens = torch.tensor([r.tokens for r in source_rows])
        pairs = [align(b, s, how) for b, s in zip(base_rows, source_rows)]
        self.pb = torch.tensor([p[0] for p in pairs])  # [R, A]
        ps = torch.tensor([p[1] for p in pairs])
        self.split = split_inputs
        with torch.no_grad():
            base = self.sender_outputs(self.tokens, self.pb)
            src = self.sender_outputs(src_tokens, ps)
        self.base, self.delta = base, src - base  # [R, A, S, d]: each sender's output at the aligned positions
        n_items = max(r.item for r in base_rows) + 1
        self.item_of = torch.tensor([r.item for r in base_rows])
        self.n_items = n_items

    def sender_outputs(self, tokens, pos):
        m, cfg = self.model, self.model.cfg
        # the input sender: what the first block reads (embedding, plus positional embedding where there is one)
        names = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.attn.hook_z" for l in range(cfg.n_layers)] + [
            f"blocks.{l}.hook_mlp_out" for l in range(cfg.n_layers)]
        _, cache = m.run_with_cache(tokens, names_filter=names)
        R = torch.arange(len(tokens))[:, None]
        out = [cache["blocks.0.hook_resid_pre"][R, pos]]
        for s in self.site.senders[1:]:
            if s.kind == "head":
                z = cache[f"blocks.{s.layer}.attn.hook_z"][R, pos, s.unit]
                out.append(z @ m.blocks[s.layer].attn.W_O[s.unit])
            else:
                out.append(cache[f"blocks.{s.layer}.hook_mlp_out"][R, pos])
        return torch.stack(out, 2)

    def hook_name(self, r):
        if r.kind == "logits":
            return f"blocks.{self.model.cfg.n_layers - 1}.hook_resid_post", None
        if r.kind == "mlp":
            return f"blocks.{r.layer}.hook_mlp_in", None
        return f"blocks.{r.layer}.hook_{r.kind}_input", r.unit

    def score(self, logits):
        logp = logits.float().log_softmax(-1)
        per_row = torch.stack([sum(sign * logp[i, p, t] for p, t, sign in r.targets) for i, r in enumerate(self.rows)])
        return torch.zeros(self.n_items).index_add_(0, self.item_of, per_row)

    def edge(self, e, split_all: bool = False):
        """Item scores with edge e alone patched: its receiver's input += the sender's difference. Per-head
        q/k/v inputs only in the receiver's block, or (`split_all`) in every block, as TransformerLens's
        `set_use_split_qkv_input(True)` does and edge-patching code usually runs."""
        s, r = self.site.edges[e]
        name, unit = self.hook_name(self.site.receivers[r])
        R = torch.arange(len(self.rows))[:, None]
        d = self.delta[:, :, s]

        def hook(act, hook):
            act = act.clone()
            if unit is None:
                act[R, self.pb] += d
            else:
                act[R, self.pb, unit] += d
            return act

        # per-head inputs only in the receiver's block (elsewhere they would only slow the baseline down)
        rec = self.site.receivers[r]
        layers = None if split_all else ({rec.layer} if rec.kind in "qkv" else set())
        with self.split(self.model, layers), torch.no_grad():
            return self.score(self.model.run_with_hooks(self.tokens, fwd_hooks=[(name, hook)]))

    def circuit(self, edges, chain: bool):
        """Item scores of the circuit of `edges`. chain (align="index"): at each receiver, the edges outside it are
        frozen to this run's sender outputs, the edges inside carry current ones, and edges out of the input carry
        the other run's; edge set (other alignments): its edges carry the other run's sender outputs."""
        site, m, cfg = self.site, self.model, self.model.cfg
        S, Rn = len(site.senders), len(site.receivers)
        inside = torch.zeros(S, Rn)
        for e in edges:
            s, r = site.edges[e]
            inside[s, r] = 1
        R = torch.arange(len(self.rows))[:, None]
        # every sender's current output at the aligned positions, [R, A, S, d]; senders not computed yet hold
        # this run's value, which a receiver before them never reads
        cur = self.base.clone()
        heads = {layer: torch.tensor([i for i, s in enumerate(site.senders) if s.kind == "head" and s.layer == layer])
                 for layer in range(cfg.n_layers)}
        mlps = {s.layer: i for i, s in enumerate(site.senders) if s.kind == "mlp"}
        W_O = m.W_O  # [L, H, d_head, d]

        def capture_z(z, hook):
            layer = int(hook.name.split(".")[1])
            cur[:, :, heads[layer]] = torch.einsum("rahk,hkd->rahd", z[R, self.pb], W_O[layer])

        def capture_mlp(x, hook):
            cur[:, :, mlps[int(hook.name.split('.')[1])]] = x[R, self.pb]

        target = self.base + self.delta  # the other run's sender outputs

        def patch(ri, unit):
            if chain:  # the input edge carries the other run's embedding; edges outside are frozen
                w_in, w_out = inside[0, ri], 1 - inside[:, ri]
            else:  # edge set: its edges carry the other run's sender outputs, the rest current values
                w_sets = inside[:, ri]

            def hook(act, hook):
                act = act.clone()
                if chain:
                    fix = self.delta[:, :, 0] * w_in + torch.einsum("s,rasd->rad", w_out, self.base - cur)
                else:
                    fix = torch.einsum("s,rasd->rad", w_sets, target - cur)
                if unit is None:
                    act[R, self.pb] += fix
                else:
                    act[R, self.pb, unit] += fix
                return act
            return hook

        hooks = []
        for ri, r in enumerate(site.receivers):
            name, unit = self.hook_name(r)
            hooks.append((name, patch(ri, unit)))
        for layer in range(cfg.n_layers):
            hooks += [(f"blocks.{layer}.attn.hook_z", capture_z), (f"blocks.{layer}.hook_mlp_out", capture_mlp)]
        # at a block, the receivers read before the block's senders write: q/k/v inputs, then z, then mlp_in
        with self.split(m), torch.no_grad():
            return self.score(m.run_with_hooks(self.tokens, fwd_hooks=hooks))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--top", type=int, default=200, help="edges verified exactly")
    ap.add_argument("--loop-edges", type=int, default=40, help="of those, timed with one forward per edge")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/edges.txt (the README's)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from saving import saved

    with saved("edges", args.save):
        return run(args)


def kept_from_the_patched_run(c, site, sets):
    """[P, items] each edge set run as a kept circuit (MIB's) from the patched run's side: its edges out of the input
    carry the other run's embedding, its other edges current values, every edge outside is frozen (equal to the
    source run with every edge outside ablated: tests/circuits/test_ablations.py)."""
    from surgeon.sites.ablations import FREEZE

    inside = site.mask([list(x) for x in sets])
    from_input = torch.tensor([site.senders[s].kind == "input" for s, _ in site.edges]).float()
    with torch.no_grad():
        return c.run({site: inside * from_input, site.variant(ablation=FREEZE): 1 - inside}).cpu().numpy()


def run(args) -> int:
    from surgeon import Item
    from surgeon.analyses.circuit import CURVE, edge_scores
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.edges import EdgeSite
    from surgeon.case.encoding import encode_rows

    model = make_model()
    site = EdgeSite.of(model.cfg)
    rng = random.Random(0)
    word = lambda: "".join(rng.choice(string.ascii_lowercase) for _ in range(3))  # noqa: E731
    items = [Item({"a": word(), "b": word()}, correct=" x", incorrect=" y") for _ in range(args.items)]
    base = encode_rows(FORMATS[0], items, model.tokenizer, True)
    source = encode_rows(FORMATS[1], items, model.tokenizer, True)
    how = "last"
    E = len(site.edges)
    print(f"GPT-2-small-shaped random model: 12 layers x 12 heads, d_model 768; {E:,} edges; {args.items} items of "
          f"{len(base[0].tokens)} tokens (failing format) and {len(source[0].tokens)} (other), aligned at the last "
          f"prompt token and the answer ({len(base[0].tokens) - base[0].n_prompt + 1} positions); {args.threads} threads")

    # ------------------------------------------------------------------ EAP vs one forward + backward
    from careful import forward_backward, read_at, read_logprobs

    tokens = torch.tensor([r.tokens for r in base])
    src_tokens = torch.tensor([r.tokens for r in source])
    pos, tok = read_at(base)
    src_pos, _ = read_at(source)

    def floor():  # one forward + backward of the failing run: weights frozen, logits only where the metric reads
        forward_backward(model, tokens, pos, tok)

    def least():  # and the other run's forward (EAP needs both runs' activations: nothing less computes it)
        with torch.no_grad():
            read_logprobs(model, model(src_tokens, stop_at_layer=model.cfg.n_layers), src_pos[:, :1])
        forward_backward(model, tokens, pos, tok)

    t_floor, _ = best_time(floor, args.repeat + 1)
    t_least, _ = best_time(least, args.repeat + 1)

    def contrast():
        return Contrast(model, base, source, how, sites=site.node_sites())

    t_clean, c = best_time(contrast, args.repeat)
    t_eap, eap = best_time(lambda: edge_scores(c, site, "eap"), args.repeat)
    ratio = (t_clean + t_eap) / t_floor
    print("\n== EAP, every edge (each side: TransformerLens's blocks, weights frozen, logits only at the read positions)")
    for label, t in (("floor: one forward + backward of the failing run", t_floor),
                     ("floor + one forward of the other run (both runs' activations)", t_least),
                     ("surgeon: clean runs of both formats (Contrast)", t_clean),
                     ("surgeon: EAP forward + backward of the masked core", t_eap)):
        print(f"  {label:64s}{t:8.3f} s")
    print(f"  surgeon, everything (clean runs + EAP) / floor: {ratio:.2f}x (target <= 2x: {'met' if ratio <= 2 else 'MISSED'}); "
          f"/ (floor + other forward): {(t_clean + t_eap) / t_least:.2f}x; EAP's own forward + backward / floor: "
          f"{t_eap / t_floor:.2f}x")

    # ------------------------------------------------------------------ exact top edges
    ref = Reference(model, site, base, source, how)
    top = [int(e) for e in np.argsort(-np.abs(eap))[: args.top]]
    onehot = torch.zeros(len(top), E)
    onehot[torch.arange(len(top)), top] = 1

    def ours_exact():
        with torch.no_grad():
            return c.run({site: onehot})  # [top, items]

    t_ours, ours = best_time(ours_exact, args.repeat)
    sample = top[:: max(1, len(top) // args.loop_edges)][: args.loop_edges]
    t0 = time.perf_counter()
    loop = torch.stack([ref.edge(e) for e in sample])
    t_loop = (time.perf_counter() - t0) / len(sample)
    t0 = time.perf_counter()
    loop_all = torch.stack([ref.edge(e, split_all=True) for e in sample])
    t_loop_all = (time.perf_counter() - t0) / len(sample)
    err = float(max((ours[[top.index(e) for e in sample]] - x).abs().max() for x in (loop, loop_all)))
    print(f"\n== exact effect of the top {len(top)} edges, each patched alone")
    print(f"  surgeon, edges in the batch dimension       {t_ours:8.3f} s  ({t_ours / len(top) * 1e3:.1f} ms per edge)")
    print(f"  one hooked forward per edge, per-head inputs in every block (TL's set_use_split_qkv_input; {len(sample)} timed)"
          f"  {t_loop_all * len(top):8.3f} s  ({t_loop_all * 1e3:.1f} ms per edge): {t_loop_all * len(top) / t_ours:.1f}x")
    print(f"  one hooked forward per edge, per-head inputs only in the receiver's block ({len(sample)} timed)"
          f"  {t_loop * len(top):8.3f} s  ({t_loop * 1e3:.1f} ms per edge): {t_loop * len(top) / t_ours:.1f}x")
    r_ex = t_loop * len(top) / t_ours
    print(f"  speed-up against the receiver-block loop: {r_ex:.1f}x (target >= 10x: {'met' if r_ex >= 10 else 'MISSED'}) "
          f"(against the every-block loop {t_loop_all * len(top) / t_ours:.1f}x); max |difference| {err:.1e} (target <= 1e-4)")

    # ------------------------------------------------------------------ faithfulness curve
    order = [int(e) for e in np.argsort(-np.abs(eap))]
    sets = [order[: max(1, round(f * E))] for f in CURVE]
    t_curve, scores = best_time(lambda: kept_from_the_patched_run(c, site, sets), args.repeat)
    t0 = time.perf_counter()
    loop_c = torch.stack([ref.circuit(s, True) for s in sets])
    t_loop_c = time.perf_counter() - t0
    err_c = float((torch.tensor(scores) - loop_c).abs().max())
    print(f"\n== faithfulness curve, {len(sets)} circuits ({', '.join(f'{x:g}' for x in CURVE)} of the edges)")
    print(f"  surgeon, circuits in the batch dimension    {t_curve:8.3f} s")
    print(f"  one hooked forward per circuit (vectorised hooks) {t_loop_c:8.3f} s")
    print(f"  speed-up: {t_loop_c / t_curve:.1f}x (target >= 5x: {'met' if t_loop_c / t_curve >= 5 else 'MISSED'}); "
          f"max |difference| {err_c:.1e}")
    lo, hi = float(c.clean_base.mean()), float(c.clean_source.mean())
    print("  f at each fraction: " + ", ".join(f"{(x - lo) / (hi - lo):.2f}" for x in scores.mean(1)))

    limit_section(model, site, base, tokens, c, contrast, top, sample, sets, ref, floor, least,
                  {"eap": t_clean + t_eap, "floor": t_floor, "least": t_least, "exact": t_ours,
                   "loop": t_loop * len(top), "curve": t_curve, "curve loop": t_loop_c})
    memory(site, model.cfg, len(base), len(base[0].tokens) - base[0].n_prompt + 1, len(top))
    return 0 if err <= 1e-4 and err_c <= 1e-4 else 1


def limit_section(model, site, base, tokens, c, contrast, top, sample, sets, ref, floor, least, t: dict) -> None:
    """Each side's work (matrix-multiply FLOPs of one more run under torch's FlopCounterMode, apart from the timings)
    against the least its method needs, and its share of this machine's peak at the model's shapes."""
    from limit import (Limit, block_flops, count_flops, distinct_positions, edge_dot_least, edge_patch_least,
                       last_read, model_shapes, read_positions, unembed_flops, work_section)

    from surgeon.analyses.circuit import edge_scores

    cfg = model.cfg
    L = cfg.n_layers
    lp = block_flops(model, tokens)
    span = distinct_positions(base, lambda r: r.n_prompt - 1, last_read)  # the aligned positions on
    reads = read_positions(base)
    recs = [site.receivers[site.edges[e][1]] for e in top]
    with torch.no_grad():
        loop = count_flops(lambda: [ref.edge(e) for e in sample]) * len(top) / len(sample)
        exact = count_flops(lambda: c.run({site: torch.eye(len(site.edges))[top]}))
        curve = count_flops(lambda: kept_from_the_patched_run(c, site, sets))
        curve_loop = count_flops(lambda: [ref.circuit(s_, True) for s_ in sets])
    least_flops = count_flops(least)
    eap_least = least_flops + edge_dot_least(len(site.edges), span, cfg.d_model)  # and the edges' dot products
    # a circuit changes every layer at the positions from the first aligned one (the last layer only where read)
    circuits = len(sets) * ((span * (L - 1) + reads) * lp + reads * unembed_flops(cfg))
    sides = [("EAP (clean runs + EAP)", "surgeon", t["eap"],
              count_flops(lambda: edge_scores(contrast(), site, "eap")),
              eap_least),
             ("", "floor", t["floor"], count_flops(floor), eap_least),
             (f"exact top-{len(top)} (clean runs apart)", "surgeon", t["exact"], exact,
              edge_patch_least(cfg, lp, recs, span, reads, 0)),
             ("", "loop", t["loop"], loop, edge_patch_least(cfg, lp, recs, span, reads, 0)),
             (f"curve ({len(sets)} circuits)", "surgeon", t["curve"], curve, circuits),
             ("", "loop", t["curve loop"], curve_loop, circuits)]
    lim = Limit.measure(model_shapes(cfg, tokens.numel(), reads))
    work_section("work and speed against this machine's limit (work: matrix-multiply FLOPs of one more run of each "
                 "side under torch's FlopCounterMode, apart from the timings, the per-edge loop's on its timed sample "
                 "and scaled; least: EAP's, the floor, the other run's forward and each edge's dot product of its "
                 "receiver's gradient with its sender's difference there (bench/limit.py's edge_dot_least); an edge's, "
                 f"its receiver's layer on (only the MLP for an MLP input) at the {span:,} distinct row-positions from the first aligned "
                 "one to the last read, and the logits read; a circuit's, every layer there)", lim, sides,
                 ["EAP's least here is what the floor runs and the dot products: a surgeon EAP under it skips what no "
                  "score needs (the positions before the first aligned one need no gradient, the other run none after "
                  "it)"])


def memory(site, cfg, rows: int, positions: int, top: int):
    """What the edge buffers hold, here and for Llama-3.1-8B (computed from the graph, 4 bytes per float32)."""
    from transformer_lens import HookedTransformerConfig

    from surgeon.sites.edges import EdgeSite

    def line(name, site, d_model, n_heads, rows, positions, bytes_per=4):
        S, E = len(site.senders), len(site.edges)
        senders = 2 * rows * positions * S * d_model * bytes_per  # base and source outputs, aligned positions
        split = rows * positions * n_heads * d_model * bytes_per  # one layer's per-head q input while patched
        print(f"  {name}: {S:,} senders, {len(site.receivers):,} receivers, {E:,} edges; sender outputs of both runs "
              f"{senders / 2**20:,.0f} MiB for {rows} rows x {positions} aligned positions; a mask of {top} edge sets "
              f"{top * E * 4 / 2**20:,.1f} MiB (and its gradient as much); a layer's per-head query input "
              f"{split / 2**20:,.0f} MiB per row batch")

    print("\n== memory of the edge buffers (scales with rows x aligned positions x senders x d_model)")
    line("this model", site, cfg.d_model, cfg.n_heads, rows, positions)
    llama = HookedTransformerConfig(n_layers=32, d_model=4096, n_heads=32, d_head=128, n_key_value_heads=8,
                                    d_mlp=14336, n_ctx=128, d_vocab=128256, act_fn="silu", gated_mlp=True,
                                    normalization_type="RMS", positional_embedding_type="rotary")
    line("Llama-3.1-8B, bfloat16", EdgeSite.of(llama), 4096, 32, rows, positions, bytes_per=2)


if __name__ == "__main__":
    raise SystemExit(main())
