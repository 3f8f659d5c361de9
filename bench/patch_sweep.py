"""Per-head patching sweep (every layer x head, last prompt position) on the decimal organism.

Three ways, same patches, measured side by side in one run (this machine is noisy: compare ratios):
  surgeon   the intervention core: prefix computed once, only layers >= L at positions >= p recomputed,
            all heads of a layer in the batch dimension;
  (a) TL    transformer_lens.patching.generic_activation_patch over `z` with `layer_pos_head_vector_patch_setter`
            and an `index_df` holding exactly the (layer, position, head) cells surgeon patches (what a
            TransformerLens user writes for this sweep: one forward per row of the index);
  (b) loop  one full TransformerLens forward per (layer, head) with a hook doing exactly our patch;
  (c) careful  what a TransformerLens user who knows the patch writes (bench/careful.py): the positions before the
            patched one run once into a frozen `TransformerLensKeyValueCache`, layers before the patched one are
            skipped (`start_at_layer` from the clean residual stream), the logits cut after the last position read,
            and the heads of a layer in the batch dimension (the frozen cache repeated once per head).
TL's utility needs equal-length prompts, so the source run is the same Q&A prompt with the two numbers
swapped (equal length, the organism's own format). The numbers are checked to agree.

Two modes: `sequence` scores whole answers (multi-token) and patches the last prompt token;
`decision` scores the first-token logit difference and patches the last input position, the one
whose logits are read (the classic single-token setting).

    python bench/patch_sweep.py [--mode both] [--items 256] [--threads 2] [--skip-tl] [--save]
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-tl", action="store_true", help="skip (a)")
    ap.add_argument("--save", action="store_true", help="also write bench/results/patch_sweep.txt (the README's)")
    ap.add_argument("--repeat", type=int, default=3, help="time surgeon and (b) this many times, keep the fastest")
    ap.add_argument("--mode", choices=["sequence", "decision", "both"], default="both",
                    help="sequence: whole answers scored, patch at the last prompt token; decision: first-token "
                         "logit difference, patch at the last position of the input (the one whose logits are read)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from saving import saved

    ok = True
    with saved("patch_sweep", args.save, organisms=("decimal",)):
        for mode in (["sequence", "decision"] if args.mode == "both" else [args.mode]):
            print(f"\n== mode {mode}")
            ok &= run(mode, args)
    return 0 if ok else 1


def fastest(fn, repeat: int):
    """(the fastest of `repeat` timed calls of fn under no_grad, its result)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run(mode: str, args) -> bool:
    from transformer_lens import patching

    from surgeon.engine.contrast import Contrast
    from surgeon.models.loading import load_model
    from surgeon.organisms import decimal as org
    from surgeon.organisms.decimal import held_out_items as decimal_items
    from surgeon.sites.nodes import Site
    from surgeon.case.encoding import encode_rows

    model = load_model("organism:decimal")
    items = decimal_items(n_trap=args.items // 2, n_control=2 * args.items)
    if mode == "decision":  # the first differing token must exist: drop pairs like 14.9 / 14.96
        items = [it for it in items if not it.correct.startswith(it.incorrect) and not it.incorrect.startswith(it.correct)]
    items = items[: args.items // 2] + [it for it in items if it.tag == "control"][: args.items - args.items // 2]
    qa = org.FORMATS["qa"]
    swapped = qa.replace("{a}", "{X}").replace("{b}", "{a}").replace("{X}", "{b}")
    score, align = ("sequence", "end") if mode == "sequence" else ("first_token", "decision")
    base = encode_rows(qa, items, model.tokenizer, True, score)
    source = encode_rows(swapped, items, model.tokenizer, True, score)
    L, H, n = model.cfg.n_layers, model.cfg.n_heads, len(items)
    where = "the last prompt token" if mode == "sequence" else "the last input position"
    print(f"decimal organism: {L} layers x {H} heads, {n} items ({len(base)} rows), patch z at {where}")

    # --- surgeon (everything from the token rows on, caches included)
    def surgeon():
        with torch.no_grad():
            c = Contrast(model, base, source, align, batch_size=512, sites=[Site.of("z", l) for l in range(L)])
            return torch.stack([c.run({Site.of("z", l): torch.eye(H)}).mean(-1) for l in range(L)])

    t_ours, ours = fastest(surgeon, args.repeat)

    # rows grouped by length, as TL needs equal-length batches
    groups = defaultdict(list)
    for i, r in enumerate(base):
        groups[(len(r.tokens), len(r.targets), r.n_prompt, r.targets[0][0])].append(i)

    def bucket(ids):
        toks = torch.tensor([base[i].tokens for i in ids])
        src = torch.tensor([source[i].tokens for i in ids])
        tp = torch.tensor([[p for p, _, _ in base[i].targets] for i in ids])
        tt = torch.tensor([[k for _, k, _ in base[i].targets] for i in ids])
        ts = torch.tensor([[s for _, _, s in base[i].targets] for i in ids])
        idx = torch.arange(len(ids))[:, None]

        def metric(logits):  # this bucket's contribution to the mean item score
            return (logits.log_softmax(-1)[idx, tp, tt] * ts).sum() / n

        pos = base[ids[0]].n_prompt - 1 if mode == "sequence" else base[ids[0]].targets[0][0]
        return toks, src, metric, pos

    # --- (b) one TL forward per (layer, head)
    @torch.no_grad()
    def tl_loop():
        loop = torch.zeros(L, H)
        for ids in groups.values():
            toks, src, metric, pos = bucket(ids)
            _, cache = model.run_with_cache(src, names_filter=lambda name: name.endswith("hook_z"))
            for l in range(L):
                hook_name = f"blocks.{l}.attn.hook_z"
                for h in range(H):
                    def hook(z, hook, h=h):
                        z[:, pos, h] = cache[hook_name][:, pos, h]
                        return z
                    loop[l, h] += metric(model.run_with_hooks(toks, fwd_hooks=[(hook_name, hook)]))
        return loop

    t_loop, loop = fastest(tl_loop, args.repeat)
    err_loop = (ours - loop).abs().max().item()

    # --- (c) the careful TL user: prefix cached, layers below skipped, a layer's heads in the batch dimension
    from careful import prefix_cache, repeated, suffix_residual

    @torch.no_grad()
    def tl_careful():
        out = torch.zeros(L, H)
        heads = torch.arange(H)
        for ids in groups.values():
            toks, src, _, pos = bucket(ids)
            r0 = base[ids[0]]
            tp = torch.tensor([p for p, _, _ in r0.targets]) - pos  # the same in the bucket
            assert (tp >= 0).all()
            tt = torch.tensor([[k for _, k, _ in base[i].targets] for i in ids])
            ts = torch.tensor([[s for _, _, s in base[i].targets] for i in ids])
            suffix = toks[:, pos: int(tp.max()) + pos + 1]
            _, cache = model.run_with_cache(src[:, : pos + 1], names_filter=lambda name: name.endswith("hook_z"))
            kv = prefix_cache(model, toks[:, :pos])
            kv_h = repeated(kv, H)
            m = len(ids)
            for l in range(L):
                resid = suffix_residual(model, suffix, kv, l).repeat(H, 1, 1)
                patch = cache[f"blocks.{l}.attn.hook_z"][:, pos].transpose(0, 1)  # [head, row, d_head]

                def hook(z, hook, patch=patch):
                    z.view(H, m, *z.shape[1:])[heads, :, 0, heads] = patch
                    return z

                with model.hooks(fwd_hooks=[(f"blocks.{l}.attn.hook_z", hook)]):
                    logits = model(resid, start_at_layer=l, past_kv_cache=kv_h)
                logp = logits.view(H, m, *logits.shape[1:]).log_softmax(-1)
                out[l] += (logp[:, torch.arange(m)[:, None], tp[None], tt] * ts).sum((1, 2)) / n
        return out

    t_careful, careful = fastest(tl_careful, args.repeat)
    err_careful = (ours - careful).abs().max().item()

    # --- (a) TL's generic patcher, indexed to the cells surgeon patches
    t_tl, err_tl = float("nan"), float("nan")
    if not args.skip_tl:
        import pandas as pd

        def tl_utility():
            tl = torch.zeros(L, H)
            for ids in groups.values():
                toks, src, metric, pos = bucket(ids)
                _, cache = model.run_with_cache(src, names_filter=lambda name: name.endswith("hook_z"))
                index = pd.DataFrame([(l, pos, h) for l in range(L) for h in range(H)], columns=["layer", "pos", "head_index"])
                out = patching.generic_activation_patch(model, toks, cache, metric,
                                                        patching.layer_pos_head_vector_patch_setter, "z",
                                                        index_df=index)
                tl += out.view(L, H)
            return tl

        for _ in range(args.repeat):
            t0 = time.perf_counter()
            with torch.no_grad():
                tl = tl_utility()
            t_tl = min(t_tl, time.perf_counter() - t0) if t_tl == t_tl else time.perf_counter() - t0
        err_tl = (ours - tl).abs().max().item()

    print(f"(fastest of {args.repeat} runs each)")
    print(f"surgeon core            {t_ours:8.2f} s")
    print(f"(b) loop of TL forwards {t_loop:8.2f} s   ratio {t_loop / t_ours:6.1f}x   max |diff| {err_loop:.1e}")
    if not args.skip_tl:
        print(f"(a) TL generic_activation_patch, index_df of the patched cells {t_tl:8.2f} s   ratio {t_tl / t_ours:6.1f}x"
              f"   max |diff| {err_tl:.1e}")
    print(f"(c) careful TL: prefix in a frozen KV cache, start_at_layer, heads in the batch {t_careful:8.2f} s   "
          f"ratio {t_careful / t_ours:6.1f}x   max |diff| {err_careful:.1e}")
    print(f"goal: ahead of (c), the careful baseline: {t_careful / t_ours:.2f}x ({'met' if t_careful >= t_ours else 'MISSED'})")
    # the work each side does against the least the sweep needs, and the share of this machine's peak it reaches
    from limit import (Limit, block_flops, count_flops, distinct_positions, head_patch_least, last_read, model_shapes,
                       read_positions,
                       work_section)

    at = (lambda r: r.n_prompt - 1) if mode == "sequence" else (lambda r: r.targets[0][0])
    span = distinct_positions(base, at, last_read)
    clean = distinct_positions(base, lambda r: 0, last_read) + distinct_positions(source, lambda r: 0, at)
    reads = read_positions(base)
    lp = block_flops(model, torch.tensor([r.tokens for r in base if len(r.tokens) == len(base[0].tokens)]))
    least = head_patch_least(model.cfg, lp, span, [{layer: h} for layer in range(L) for h in range(H)], reads, clean)
    lim = Limit.measure(model_shapes(model.cfg, clean // 2, reads))
    sides = [("per-head sweep", "surgeon", t_ours, count_flops(surgeon), least),
             ("", "careful", t_careful, count_flops(tl_careful), least),
             ("", "loop", t_loop, count_flops(tl_loop), least)]
    if not args.skip_tl:
        with torch.no_grad():
            sides.append(("", "TL", t_tl, count_flops(tl_utility), least))
    work_section(f"work and speed against this machine's limit (work: matrix-multiply FLOPs of one more run of each "
                 f"side under torch's FlopCounterMode, apart from the timings; least: every head's patched copy from "
                 f"its layer on (no attention there) at the {span:,} distinct row-positions from the patched one to "
                 f"the last read, the logits read, and a clean run of each prompt)", lim, sides)
    ok = err_loop < 1e-4 and err_careful < 1e-4 and (args.skip_tl or err_tl < 1e-4)
    print("numbers agree" if ok else "NUMBERS DISAGREE")
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
