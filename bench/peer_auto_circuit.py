"""surgeon beside the tool a researcher would otherwise install for edge attribution: auto-circuit 1.0.1.

auto-circuit needs TransformerLens 2.x, surgeon 3.x: it runs in its own virtualenv (made here on first use, under
bench/peers/.venv-auto-circuit, sharing this environment's torch so both run the same kernels; its packages pinned
in PINNED), one subprocess per round (`peers/auto_circuit_side.py`), timing its own work. The model is the edges bench's
GPT-2-small shape (12 layers x 12 heads, d_model 768, random weights, the organisms' character tokenizer; 32,491
edges with q/k/v inputs apart), saved once as safetensors and read by both; 32 items of one format, clean and corrupt
prompts of equal length (different words), scored at the last position by log P(x) - log P(y); every position
patched (auto-circuit's default; surgeon's `align="index"`). auto-circuit's conventions: the model runs the clean
prompts and an edge's mask moves its sender's output to the corrupt run's; its EAP is the gradient of -metric.

  EAP    every edge's score: surgeon (its clean runs of both prompts + the masked forward and backward) against
         auto-circuit's `mask_gradient_prune_scores` at mask 0 (its corrupt forward + the masked forward and backward;
         wrapping the model as a patchable one, done once, reported apart);
  exact  the top 200 edges by |EAP|, each patched alone: surgeon's edges in the batch dimension against auto-circuit's
         `patch_mode` with one edge per forward (what its API offers for one edge), timed on the first `--peer-top`
         of them (its cost is one forward per edge: its rate, edges per second, is what is compared).
Scores are checked equal first (auto-circuit's = -surgeon's, relative 1e-4), then timed in interleaved rounds
(medians), with this machine's matrix-multiply peak beside them.

    python bench/peer_auto_circuit.py [--rounds 3] [--items 32] [--top 200] [--peer-top 20] [--threads 2] [--save]

Its first run on the GPT-2 shape (2026-11-28, alone on the 2 cores) was stopped after its first, checking call to
auto-circuit had run 19 minutes (its `patch_mode`, one forward of its patchable model per edge, 200 of them, after its
EAP); auto-circuit's exact scores are therefore timed on `--peer-top` edges and compared as a rate.

In bench/all.py (after edges.py), the README's speed table and paragraph, and docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
VENV = PEERS / ".venv-auto-circuit"
# the peer's packages, with no dependency resolution (torch, numpy and the rest are this environment's)
PINNED = ("auto-circuit==1.0.1", "transformer-lens==2.18.0", "ordered-set==4.1.0", "blobfile==3.3.0", "lxml==6.1.3")
FORMAT = "Q: {a} or {b}?\nA:"


def venv_python() -> Path:
    """The peer's interpreter, the virtualenv made and its packages installed on first use."""
    py = VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", *PINNED], check=True)
    return py


def edge_name(site, s: int, r: int) -> str:
    """A surgeon edge as auto-circuit names it (Resid Start, A{L}.{H}, MLP {L} -> A{L}.{H}.Q/K/V, MLP {L}, Resid End)."""
    snd, rcv = site.senders[s], site.receivers[r]
    src = "Resid Start" if snd.kind == "input" else f"A{snd.layer}.{snd.unit}" if snd.kind == "head" else f"MLP {snd.layer}"
    dst = (f"A{rcv.layer}.{rcv.unit}.{rcv.kind.upper()}" if rcv.kind in ("q", "k", "v")
           else "Resid End" if rcv.kind == "logits" else f"MLP {rcv.layer}")
    return f"{src}->{dst}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--top", type=int, default=200, help="surgeon's exact scores: the top edges by |EAP|")
    ap.add_argument("--peer-top", type=int, default=20,
                    help="auto-circuit's exact scores on the first this many of them (one forward each; rate compared)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/peer_auto_circuit.txt (the docs')")
    args = ap.parse_args()
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from edges import make_model
    from limit import limit_only
    from saving import saved

    from surgeon import Item
    from surgeon.analyses.circuit import edge_scores
    from surgeon.case.encoding import encode_rows
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.edges import EdgeSite

    torch.set_num_threads(args.threads)
    peer = venv_python()
    model = make_model()
    site = EdgeSite.of(model.cfg)
    rng = random.Random(0)
    word = lambda: "".join(rng.choice(string.ascii_lowercase) for _ in range(3))  # noqa: E731
    clean = [Item({"a": word(), "b": word()}, correct="x", incorrect="y") for _ in range(args.items)]
    corrupt = [Item({"a": word(), "b": word()}, correct="x", incorrect="y") for _ in range(args.items)]
    rb, rs = encode_rows(FORMAT, clean, model.tokenizer, True), encode_rows(FORMAT, corrupt, model.tokenizer, True)
    names = [edge_name(site, s, r) for s, r in site.edges]
    folder = Path(tempfile.mkdtemp(prefix="surgeon-peer-"))
    cfg = {k: getattr(model.cfg, k) for k in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "d_vocab",
                                              "act_fn", "normalization_type", "default_prepend_bos")}
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.detach().contiguous() for k, v in model.named_parameters()}, str(folder / "model.safetensors"))
    (folder / "items.json").write_text(json.dumps({
        "clean": [list(r.tokens) for r in rb], "corrupt": [list(r.tokens) for r in rs],
        "answers": [r.targets[0][1] for r in rb], "wrong": [r.targets[1][1] for r in rb]}))

    def ours_eap():
        c = Contrast(model, rb, rs, "index", sites=site.node_sites())
        return c, edge_scores(c, site, "eap")

    def theirs(exact: list[str] | None = None) -> dict:
        cmd = [str(peer), str(PEERS / "auto_circuit_side.py"), str(folder), "--out", str(folder / "peer.json"),
               "--threads", str(args.threads)]
        if exact is not None:
            (folder / "exact.json").write_text(json.dumps(exact))
            cmd += ["--exact", str(folder / "exact.json")]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.loads((folder / "peer.json").read_text())

    data: dict = {}
    with saved("peer_auto_circuit", args.save, data=data):
        c, eap = ours_eap()
        top = [int(e) for e in np.argsort(-np.abs(eap))[: args.top]]
        onehot = torch.zeros(len(top), len(site.edges))
        onehot[torch.arange(len(top)), top] = 1
        with torch.no_grad():
            ours_exact = c.run({site: onehot}).double().mean(1).numpy()  # [top]: each edge's mean score
        clean_mean = float(c.clean_base.double().mean())
        few = top[: args.peer_top]
        peer0 = theirs([names[e] for e in few])
        their_eap = np.array([peer0["scores"][n] for n in names])
        their_exact = np.array([peer0["exact"][names[e]] for e in few])
        eap_err = float(np.abs(their_eap + eap).max() / np.abs(eap).max())
        exact_err = float(np.abs(their_exact - ours_exact[: len(few)]).max()
                          / np.abs(ours_exact[: len(few)] - clean_mean).max())
        print(f"GPT-2-small-shaped random model: 12 layers x 12 heads, d_model 768; {len(names):,} edges (auto-circuit: "
              f"{len(peer0['scores']):,}); {args.items} items of {len(rb[0].tokens)} tokens, every position patched; "
              f"{args.threads} threads; auto-circuit 1.0.1 on TransformerLens {peer0['versions']['transformer_lens']}, "
              f"torch {peer0['versions']['torch']} (this environment's)")
        print(f"\n  the same scores: EAP, auto-circuit's = -surgeon's to {eap_err:.1e} of the largest; exact effects of the "
              f"top {len(few)} edges to {exact_err:.1e} of the largest change")
        if eap_err > 1e-4 or exact_err > 1e-4 or set(peer0["scores"]) != set(names):
            print("  MISMATCH: the timings below compare different things")
            return 1
        t_ours_eap, t_ours_exact, t_their_eap, t_their_exact, t_wrap = [], [], [], [], []
        for _ in range(args.rounds):  # interleaved: each round times both, so drift hits both alike
            t0 = time.perf_counter()
            c, _ = ours_eap()
            t_ours_eap.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with torch.no_grad():
                c.run({site: onehot})
            t_ours_exact.append(time.perf_counter() - t0)
            p = theirs([names[e] for e in few])
            t_their_eap.append(p["eap_s"])
            t_their_exact.append(p["exact_s"])
            t_wrap.append(p["wrap_s"])
        med = statistics.median
        print(f"\n  medians of {args.rounds} interleaved rounds         surgeon   auto-circuit   ratio")
        print(f"  EAP, every edge (both runs, forward + backward) {med(t_ours_eap):8.2f} s {med(t_their_eap):10.2f} s "
              f"{med(t_their_eap) / med(t_ours_eap):7.1f}x   (auto-circuit's wrapping, once: {med(t_wrap):.2f} s)")
        rate_ours, rate_theirs = len(top) / med(t_ours_exact), len(few) / med(t_their_exact)
        print(f"  exact, each edge patched alone (edges/s)        {rate_ours:8.1f}   {rate_theirs:10.2f}   "
              f"{rate_ours / rate_theirs:7.1f}x   (surgeon: the top {len(top)} in {med(t_ours_exact):.2f} s; "
              f"auto-circuit: the first {len(few)} of them in {med(t_their_exact):.2f} s)")
        data.update({"edges": len(names), "items": args.items, "top": len(top), "peer_top": len(few),
                     "rounds": args.rounds,
                     "eap_error": eap_err, "exact_error": exact_err,
                     "surgeon": {"eap_s": med(t_ours_eap), "exact_s": med(t_ours_exact)},
                     "auto_circuit": {"eap_s": med(t_their_eap), "exact_s": med(t_their_exact), "wrap_s": med(t_wrap),
                                      "versions": peer0["versions"]}})
        print("  " + limit_only("auto-circuit's work is not counted here (it runs in another process)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
