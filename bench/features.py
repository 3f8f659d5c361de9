"""Feature circuits against the loop a TransformerLens + sae-lens user writes, side by side in one run.

A GPT-2-small-shaped model (random weights) with a TopK SAE of 16x expansion (12,288 features, k = 32, random) on the
MLP output of three layers; the bench's rows (scale.py's: two prompts of equal length whose words are swapped, every
position aligned). Each job is timed for surgeon and for the loop written as Marks et al.'s feature-circuits code
runs it with TransformerLens hooks and sae-lens SAEs (full prompts, every item in one batch), and their results are
compared (the largest difference, relative to the largest value), and each side is run once more under torch's
FlopCounterMode for the matrix-multiply work it computes (so a ratio can be read as work done and speed per unit of
work):

  IG nodes     integrated gradients over each SAE's features (5 midpoints in the batch dimension, one SAE at a time,
               the others clean): surgeon's `ig` feature method against one batched forward and backward per SAE
               with the interpolated features as the leaf;
  exact nodes  the top 20 nodes each patched alone: surgeon's patches in the batch dimension from the first
               differing position against one hooked forward per node;
  edges        every edge into the 30 strongest nodes' downstream ones (the SAE hook points between held):
               surgeon's one backward pass per pair of SAEs against Marks et al.'s `jvp`, one backward pass per
               downstream node.

Then the feature circuit's memory plan (surgeon/analyses/planning.py: the engine's plan with the SAEs' feature
tensors): for Llama-3.1-8B with 32k-feature SAEs at three layers (predicted), and against the peak measured, each job
in a fresh process, on the shape its constants were fitted to and on two held out.

    python bench/features.py [--threads 2] [--items 16] [--save]
    python bench/features.py measure SHAPE JOB [--expansion 16] [--layers 4,12]   (a JSON line: measured, predicted)
"""
from __future__ import annotations

import argparse
import time

import torch

import scale  # noqa: E402  (bench/ is this script's folder)

LAYERS = (2, 6, 10)
EXPANSION, K = 16, 32
STEPS, VERIFY, EDGE_NODES = 5, 20, 30


def make_saes(model, layers=LAYERS, k: int = K, expansion: int = EXPANSION):
    """A random TopK SAE (sae-lens) per layer on hook_mlp_out: encoder rows random, the decoder its transpose."""
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

    d = model.cfg.d_model
    out = {}
    g = torch.Generator().manual_seed(0)
    for L in layers:
        sae = TopKSAE(TopKSAEConfig(d_in=d, d_sae=expansion * d, k=k, apply_b_dec_to_input=False,
                                    metadata=SAEMetadata(hook_name=f"blocks.{L}.hook_mlp_out", model_name="bench")))
        with torch.no_grad():
            w = torch.randn(d, expansion * d, generator=g) / d ** 0.5
            sae.W_enc.copy_(w)
            sae.W_dec.copy_(w.T / w.T.norm(dim=1, keepdim=True))
            sae.b_enc.zero_()
            sae.b_dec.zero_()
        for p in sae.parameters():
            p.requires_grad_(False)
        out[L] = sae
    return out


def _score(model, logits, rows):
    """log P(correct) - log P(incorrect) summed over each row's targets, [rows] (the metric surgeon's default is)."""
    lp = logits.float().log_softmax(-1)
    return torch.stack([sum(sign * lp[i, p, t] for p, t, sign in r.targets) for i, r in enumerate(rows)])


class Loop:
    """The TransformerLens + sae-lens side: full prompts, every row in one batch, hooks at the SAEs' hook points."""

    def __init__(self, model, saes, base, source):
        from surgeon.case.encoding import align

        self.model, self.saes, self.base = model, saes, base
        self.tokens = torch.tensor([r.tokens for r in base])
        pairs = [align(b, s, "index") for b, s in zip(base, source)]
        self.pos = torch.tensor([p for p, _ in pairs])  # [n, S] aligned positions (equal across rows here)
        src_tokens = torch.tensor([r.tokens for r in source])
        hooks = [s.cfg.metadata.hook_name for s in saes.values()]
        with torch.no_grad():
            _, cb = model.run_with_cache(self.tokens, names_filter=hooks)
            _, cs = model.run_with_cache(src_tokens, names_filter=hooks)
        idx = torch.arange(len(base))[:, None]
        spos = torch.tensor([q for _, q in pairs])
        self.act = {L: cb[s.cfg.metadata.hook_name][idx, self.pos] for L, s in saes.items()}  # [n, S, d]
        self.src = {L: cs[s.cfg.metadata.hook_name][idx, spos] for L, s in saes.items()}
        self.f = {L: saes[L].encode(self.act[L]) for L in saes}
        self.f_src = {L: saes[L].encode(self.src[L]) for L in saes}
        self.err = {L: self.act[L] - saes[L].decode(self.f[L]) for L in saes}
        self.err_src = {L: self.src[L] - saes[L].decode(self.f_src[L]) for L in saes}

    def _put(self, L, value, copies=1):
        """A hook writing `value` [copies * n, S, d] at layer L's aligned positions."""
        idx = torch.arange(self.tokens.shape[0] * copies)[:, None]
        pos = self.pos.repeat(copies, 1)

        def hook(act, hook):
            act = act.clone()
            act[idx, pos] = value.to(act.dtype)
            return act
        return (self.saes[L].cfg.metadata.hook_name, hook)

    def ig(self, steps: int = STEPS) -> dict:
        """{layer: [d_sae]} Marks et al.'s _pe_ig: each SAE's features and error term interpolated from this run's to
        the other's (midpoints), the others clean, the steps in the batch dimension; grad . delta averaged over the
        steps."""
        out = {}
        n = self.tokens.shape[0]
        rows = self.base * steps
        for L, sae in self.saes.items():
            a = (torch.arange(steps) + 0.5) / steps
            a_rows = a.repeat_interleave(n)[:, None, None]
            f = (self.f[L].repeat(steps, 1, 1) + a_rows * (self.f_src[L] - self.f[L]).repeat(steps, 1, 1)).requires_grad_(True)
            err = self.err[L] + a.view(steps, 1, 1, 1) * (self.err_src[L] - self.err[L])[None]  # the error node too
            x = sae.decode(f) + err.reshape(steps * n, *err.shape[2:])
            with torch.enable_grad():
                logits = self.model.run_with_hooks(self.tokens.repeat(steps, 1), fwd_hooks=[self._put(L, x, steps)])
                _score(self.model, logits, rows).sum().div(n * steps).backward()
            out[L] = (f.grad.view(steps, n, *f.shape[1:]).sum(0) * (self.f_src[L] - self.f[L])).sum((0, 1))
        return out

    def exact(self, nodes) -> torch.Tensor:
        """[nodes, n] scores with each (layer, feature) node alone moved to the other run's value."""
        out = []
        for L, u in nodes:
            f = self.f[L].clone()
            f[..., u] = self.f_src[L][..., u]
            x = self.saes[L].decode(f) + self.err[L]
            with torch.no_grad():
                out.append(_score(self.model, self.model.run_with_hooks(self.tokens, fwd_hooks=[self._put(L, x)]),
                                  self.base))
        return torch.stack(out)

    def edges(self, down_layer: int, up_layer: int, down_units) -> torch.Tensor:
        """[len(down_units), d_sae] Marks et al.'s jvp: the left vector (d score / d downstream features) from one
        backward pass, then one forward with the upstream features as the leaf and one backward per downstream
        feature of g . value, the SAE hook points between held; times the upstream delta."""
        n = self.tokens.shape[0]
        sd, su = self.saes[down_layer], self.saes[up_layer]
        hd = sd.cfg.metadata.hook_name
        keep = {}

        def grab(act, hook):
            act = act.detach().requires_grad_(True)
            keep["x"] = act
            return act
        with torch.enable_grad():
            _score(self.model, self.model.run_with_hooks(self.tokens, fwd_hooks=[(hd, grab)]), self.base).sum().backward()
        G = keep["x"].grad[torch.arange(n)[:, None], self.pos]  # [n, S, d]
        gf = G @ sd.W_dec.T  # through the linear decoder
        held = [(f"blocks.{L}.hook_mlp_out", lambda a, hook: a.detach()) for L in self.saes if up_layer < L < down_layer]
        f = self.f[up_layer].clone().requires_grad_(True)
        x = su.decode(f) + self.err[up_layer]
        rows = []
        with torch.enable_grad():
            seen = {}

            def read(act, hook):
                seen["x"] = act[torch.arange(n)[:, None], self.pos]
                return act
            self.model.run_with_hooks(self.tokens, fwd_hooks=[self._put(up_layer, x)] + held + [(hd, read)],
                                      stop_at_layer=down_layer + 1)
            g_val = sd.encode(seen["x"])
            for u in down_units:
                (grad,) = torch.autograd.grad((g_val[..., u] * gf[..., u]).sum(), f, retain_graph=True)
                rows.append((grad * (self.f_src[up_layer] - self.f[up_layer])).sum((0, 1)) / n)
        return torch.stack(rows)


def _diff(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def _work(fn) -> int:
    """The matrix-multiply FLOPs `fn` computes (torch's FlopCounterMode), run apart from its timing."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return int(fc.get_total_flops())


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run(args, data: dict) -> int:
    """The timings side by side, the Llama plan, the memory on held-out shapes; `data` gets the raw numbers."""
    import numpy as np

    from surgeon.analyses.feature_circuit import node_list, run_nodes
    from surgeon.analyses.feature_edges import edge_attribution
    from surgeon.analyses.scoring import FEATURE_METHODS
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.features import FeatureSite

    torch.set_num_threads(args.threads)
    model = scale.make_model("gpt2")
    saes = make_saes(model)
    base, source = scale.make_rows(model, args.items, 3)
    F = EXPANSION * model.cfg.d_model
    print(f"== feature circuits: GPT-2-small-shaped model (random weights), TopK SAEs of {F:,} features (k={K}) on the "
          f"MLP output of layers {', '.join(map(str, LAYERS))}; {args.items} items x {len(base[0].tokens)} positions, "
          f"every position aligned; {args.threads} threads")
    print("surgeon: the engine (patches in the batch dimension, from the first differing position); loop: TransformerLens "
          "hooks and sae-lens, as Marks et al.'s code runs (full prompts, every item in one batch)")
    sites = [FeatureSite.of(saes[L], error=True) for L in LAYERS]
    nodes = node_list(sites)
    loop, t_setup = _timed(lambda: Loop(model, saes, base, source))
    rows = []

    def contrast():
        return Contrast(model, base, source, "index", sites=[s.node_sites()[0] for s in sites])

    # IG over every node
    work = []  # (surgeon, loop) matmul FLOPs per job, each side rerun under the counter

    def ig_ours():
        return FEATURE_METHODS["ig"].score(contrast(), sites, STEPS, None)
    (ours, t_ours) = _timed(ig_ours)
    (theirs, t_theirs) = _timed(loop.ig)
    flat = torch.cat([torch.cat([theirs[L], torch.zeros(1)]) for L in LAYERS])  # error nodes: the loop has none
    keep = [i for i, n in enumerate(nodes) if not n.error]
    rows.append(("IG nodes (5 steps, 3 SAEs)", t_ours, t_theirs + t_setup, _diff(ours[keep], flat[keep].numpy())))
    work.append((_work(ig_ours), _work(lambda: Loop(model, saes, base, source)) + _work(loop.ig)))
    order = [int(i) for i in np.argsort(-np.abs(ours), kind="stable") if not nodes[i].error]
    top = order[:VERIFY]
    c = contrast()
    (ours_x, t_ours) = _timed(lambda: run_nodes(c, sites, [[i] for i in top]))
    (theirs_x, t_theirs) = _timed(lambda: loop.exact([(nodes[i].layer, nodes[i].unit) for i in top]))
    rows.append((f"exact top-{VERIFY} nodes", t_ours, t_theirs, _diff(ours_x, theirs_x.numpy())))
    c = contrast()  # the contrast's clean runs are outside this job's timing: outside its count too
    work.append((_work(lambda: run_nodes(c, sites, [[i] for i in top])),
                 _work(lambda: loop.exact([(nodes[i].layer, nodes[i].unit) for i in top]))))
    circuit = order[:EDGE_NODES]
    c = contrast()
    (att, t_ours) = _timed(lambda: edge_attribution(c, sites, nodes, down=circuit, up=None))
    pairs = [(ld, lu, [i for i in circuit if nodes[i].layer == ld]) for ld in LAYERS[1:] for lu in LAYERS if lu < ld]
    pairs = [(ld, lu, down) for ld, lu, down in pairs if down]
    t_theirs, worst = 0.0, 0.0
    for ld, lu, down in pairs:
        got, t = _timed(lambda: loop.edges(ld, lu, [nodes[i].unit for i in down]))
        t_theirs += t
        off = LAYERS.index(lu) * (F + 1)
        mine = torch.tensor([[att[(off + u, d)] for u in range(F)] for d in down])
        worst = max(worst, _diff(mine, got))
    rows.append((f"edges into the top {EDGE_NODES} nodes", t_ours, t_theirs, worst))
    c = contrast()
    work.append((_work(lambda: edge_attribution(c, sites, nodes, down=circuit, up=None)),
                 sum(_work(lambda: loop.edges(ld, lu, [nodes[i].unit for i in down])) for ld, lu, down in pairs)))
    print(f"\n{'job':34s} {'surgeon':>9s} {'loop':>9s} {'loop/surgeon':>13s}  largest difference")
    for name, a, b, d in rows:
        print(f"{name:34s} {a:8.2f}s {b:8.2f}s {b / a:12.1f}x  {d:.1e}")
    print(f"\nwork (matrix-multiply FLOPs, torch's FlopCounterMode) and speed per unit of it (GFLOP/s)\n"
          f"{'job':34s} {'surgeon':>9s} {'loop':>9s} {'surgeon/loop':>13s}  {'surgeon':>8s} {'loop':>8s}")
    for (name, a, b, _), (wa, wb) in zip(rows, work):
        print(f"{name:34s} {wa / 1e12:7.2f} T {wb / 1e12:7.2f} T {wa / wb:12.2f}x  {wa / a / 1e9:8.0f} {wb / b / 1e9:8.0f}")
    print("(time ratio = work ratio x speed ratio; surgeon's feature hook encodes and decodes an SAE only for the "
          "patches that move one of its features, surgeon/sites/features.py; the loop's exact patch decodes once at the "
          "patched SAE)")
    from limit import Limit, model_shapes, work_section

    cfg = model.cfg
    tokens = sum(len(r.tokens) for r in base)
    shapes = model_shapes(cfg, tokens, len(base)) + [(m, cfg.d_model, F) for m in (tokens, 4096)] + [
        (m, F, cfg.d_model) for m in (tokens, 4096)]
    lim = Limit.measure(shapes)
    sides = []
    for (name, a, b, _), (wa, wb) in zip(rows, work):
        sides += [(name, "surgeon", a, wa, None), ("", "loop", b, wb, None)]
    data["limit"] = lim.record()
    data["work"] = work_section("work and speed against this machine's limit (the work above; the peak at the model's "
                                "and the SAEs' shapes, encoder and decoder included)", lim, sides,
                                ["least: not derived for feature circuits (which SAEs and rows a patch must re-encode "
                                 "depends on which features move); the loop's work, Marks et al.'s method as their "
                                 "code runs it, stands beside surgeon's"])
    data["jobs"] = [{"job": name, "surgeon": a, "loop": b, "difference": d, "surgeon_flops": wa, "loop_flops": wb}
                    for (name, a, b, d), (wa, wb) in zip(rows, work)]
    data["shape"] = {"model": "gpt2", "items": args.items, "positions": len(base[0].tokens), "saes": len(LAYERS),
                     "d_sae": F}
    print("(the loop's IG time includes its clean runs and feature encodings, as surgeon's includes its contrast's)")
    llama_features()
    data["held_out"], data["fitted"] = {}, FITTED
    memory_held_out(args.threads, data["held_out"])
    return 0


def llama_features() -> None:
    """Llama-3.1-8B with 32k-feature SAEs (bfloat16) at three layers, predicted: the feature circuit's plan
    (surgeon/analyses/planning.py: the engine's plan of both directions' calls with the SAEs' feature tensors)."""
    from surgeon.analyses import planning

    cfg, base, source = scale.llama_8b()
    F, layers = 32768, (8, 16, 24)
    d = cfg.d_model
    shapes = {L: planning.SAEShape(F, 2, (2 * d * F + F + d) * 2) for L in layers}  # W_enc, W_dec, b_enc, b_dec
    p = planning.plan_features(cfg, base, source, "last", shapes, "ig", STEPS, VERIFY, batch_size=256,
                               budget=scale.GPU_BYTES, device="cuda:0")
    print("\n== predicted (not measured): Llama-3.1-8B-Instruct with 32k-feature SAEs at layers "
          f"{', '.join(map(str, layers))} (bfloat16), one 80 GB GPU")
    print("  " + scale.llama_8b_workload()[0])
    print(f"  plan (the engine's, with the SAEs' feature tensors; IG {STEPS} steps, {VERIFY} nodes verified, edges among "
          f"up to {planning.EDGE_NODES_PLANNED} downstream nodes per SAE): {p.line(scale.GPU_BYTES)}")


# memory: the plan (surgeon/analyses/planning.py's feature terms) against the measured peak, on the shape its
# constants were fitted to and on two held out, each job in a fresh process (scale.py's mmap threshold)
MEMORY_SHAPES = {"deep": ((4, 12, 20), 32), "gqa": ((2, 6, 10), 24), "gpt2": (LAYERS, 16)}  # (SAE layers, items)
FITTED = "deep"
MEMORY_JOBS = ("attribution", "exact", "edges")


def measure(shape: str, job: str, batch_size: int = 256, expansion: int = EXPANSION, layers=None) -> dict:
    """One feature-circuit job on `shape` (its SAEs and items from MEMORY_SHAPES): measured and predicted peaks."""
    import gc

    import numpy as np

    from surgeon.analyses import planning
    from surgeon.analyses.feature_circuit import CURVE_SIZES, node_list, run_nodes
    from surgeon.analyses.feature_edges import edge_attribution
    from surgeon.analyses.scoring import FEATURE_METHODS
    from surgeon.engine import memory
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.features import FeatureSite

    import transformer_lens  # noqa: F401,I001  (its import is the process's, not the model's)

    layers, items = (MEMORY_SHAPES[shape][0] if layers is None else layers), MEMORY_SHAPES[shape][1]
    rss0 = memory.resident()
    model = scale.make_model(shape)
    cfg = model.cfg
    saes = make_saes(model, layers, expansion=expansion)
    shapes = {L: planning.SAEShape.of(sae) for L, sae in saes.items()}
    weights = memory.model_bytes(model)
    base, source = scale.make_rows(model, items, 3)
    sites = [FeatureSite.of(saes[L], error=True) for L in layers]
    nodes = node_list(sites)

    def contrast():
        return Contrast(model, base, source, "index", batch_size=batch_size, sites=[s.node_sites()[0] for s in sites])
    c = contrast()  # the ranking the exact and edge jobs start from (not measured)
    order = [int(i) for i in np.argsort(-np.abs(FEATURE_METHODS["gradient"].score(c, sites, 1, None)), kind="stable")]
    del c
    circuit = [i for i in order if not nodes[i].error][:EDGE_NODES]
    down = {L: sum(nodes[i].layer == L for i in circuit) for L in layers}  # each SAE's downstream nodes
    top = [nodes[i].layer for i in order[:VERIFY]]  # each verified node's SAE: a hook encodes only the patches moving it
    jobs = planning.feature_jobs(cfg, layers, expansion * cfg.d_model, len(nodes), "ig", STEPS, VERIFY, down=down,
                                 verify_layers=top)
    bound = planning.feature_jobs(cfg, layers, expansion * cfg.d_model, len(nodes), "ig", STEPS, VERIFY, down=down)
    gc.collect()
    with memory.peak_memory() as m:
        c = contrast()
        if job == "attribution":
            FEATURE_METHODS["ig"].score(c, sites, STEPS, None)
        elif job == "exact":
            run_nodes(c, sites, [[i] for i in order[:VERIFY]])
            sizes = [k for k in CURVE_SIZES if k < len(nodes)] + [len(nodes)]
            run_nodes(c, sites, [order[:k] for k in sizes], complement=True)
            run_nodes(c, sites, [order[:k] for k in sizes])
        elif job == "edges":
            edge_attribution(c, sites, nodes, down=circuit, up=circuit)
        else:
            raise SystemExit(f"unknown job {job!r}")
    ran = [k for k in jobs if k == "edge left vectors" or k.startswith("edges into")] if job == "edges" else [job]
    p = planning.plan_features(cfg, base, source, "index", shapes, jobs={k: jobs[k] for k in ran}, both=False,
                               batch_size=batch_size, budget=1 << 50, weights=weights)
    pb = planning.plan_features(cfg, base, source, "index", shapes, jobs={k: bound[k] for k in ran}, both=False,
                                batch_size=batch_size, budget=1 << 50, weights=weights)
    counted = weights + sum(x.weights for x in shapes.values())  # what the plan counts exactly
    return {"shape": shape, "job": job, "measured": m["before"] + m["peak"] - rss0, "predicted": p.peak,
            "weights": counted, "parts": p.parts, "batch_size": p.batch_size, "bound": pb.peak,
            "verify_layers": top}


def measure_memory(shape: str, job: str, threads: int = 2) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MALLOC_MMAP_THRESHOLD_=str(scale.MMAP_THRESHOLD))
    r = subprocess.run([sys.executable, __file__, "measure", shape, job, "--threads", str(threads)],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{shape} {job} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def memory_held_out(threads: int, out: dict | None = None) -> float:
    """The plan's feature terms against the measured peaks: the fitted shape, then the held-out ones (each
    measurement also in `out`: {shape: {job: measure's record}})."""
    print("\n== memory: the feature circuit's plan (surgeon/analyses/planning.py: the engine's plan with the SAEs' "
          "feature tensors) against the measured peak, each job in a fresh process")
    print("above = (predicted - weights) / (measured - weights), the weights (model and SAEs) counted exactly; "
          f"constants fitted on {FITTED}, the others held out; the exact step planned with its verified nodes' SAEs "
          "known (a node patched alone moves one SAE, whose hook encodes only the patches of a chunk that move it)")
    worst = 0.0
    for shape, (layers, items) in MEMORY_SHAPES.items():
        cfg = scale.make_model(shape).cfg
        cells = []
        for job in MEMORY_JOBS:
            r = measure_memory(shape, job, threads)
            if out is not None:
                out.setdefault(shape, {})[job] = r
            a = (r["predicted"] - r["weights"]) / (r["measured"] - r["weights"])
            if shape != FITTED:
                worst = max(worst, abs(a - 1))
            bound = (r["bound"] - r["weights"]) / (r["measured"] - r["weights"])
            cells.append(f"{job} {a:.2f}x ({scale.mib(r['measured'] - r['weights'])} MiB above "
                         f"{scale.mib(r['weights'])}, features {scale.mib(r['parts']['features'])} predicted)"
                         + (f"; {bound:.2f}x as planned before the verified nodes' SAEs are known" if job == "exact"
                            else ""))
        print(f"  {shape}{' (fitted)' if shape == FITTED else ''}: {cfg.n_layers} layers, d_model {cfg.d_model}, "
              f"{cfg.normalization_type}, {cfg.positional_embedding_type}; TopK SAEs of {EXPANSION * cfg.d_model:,} "
              f"features at layers {', '.join(map(str, layers))}; {items} items")
        for c in cells:
            print(f"    {c}")
    print(scale.memory_goal(worst))
    return worst


def main() -> int:
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        import json

        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        ap.add_argument("shape", choices=list(MEMORY_SHAPES))
        ap.add_argument("job", choices=MEMORY_JOBS)
        ap.add_argument("--threads", type=int, default=2)
        ap.add_argument("--expansion", type=int, default=EXPANSION)
        ap.add_argument("--layers", type=lambda v: tuple(int(x) for x in v.split(",")))
        a = ap.parse_args()
        torch.set_num_threads(a.threads)
        print(json.dumps(measure(a.shape, a.job, expansion=a.expansion, layers=a.layers)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--items", type=int, default=16)
    ap.add_argument("--save", action="store_true", help="also write bench/results/features.txt (the docs')")
    args = ap.parse_args()
    from saving import saved

    data: dict = {}
    with saved("features", args.save, data=data):
        return run(args, data)


if __name__ == "__main__":
    raise SystemExit(main())
