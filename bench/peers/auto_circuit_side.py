"""auto-circuit's side of bench/peer_auto_circuit.py, run in the peer's own virtualenv (auto-circuit 1.0.1 on
TransformerLens 2.x; torch shared with the project's). Reads the model (config.json, model.safetensors) and the items
(items.json: clean and corrupt token ids, answer and wrong-answer ids) from a folder, builds auto-circuit's
patchable model the way its README and tests do (factorized, separate q/k/v inputs, the last position's logits), and
times its EAP (`mask_gradient_prune_scores` at mask 0, logprob, avg_diff: one forward and one backward over every
edge) `--rounds` times, one round per call of `--round`, writing each edge's score and the time to a JSON file.

    python auto_circuit_side.py DIR --out scores.json
"""
from __future__ import annotations

import argparse
from importlib.metadata import version
import json
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--exact", type=Path, help="a JSON list of edge names: each patched alone, its mean metric")
    args = ap.parse_args()
    import torch
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.utils.graph_utils import patchable_model

    torch.set_num_threads(args.threads)
    cfg = HookedTransformerConfig(**json.loads((args.dir / "config.json").read_text()))
    model = HookedTransformer(cfg)
    model.load_state_dict(load_file(str(args.dir / "model.safetensors")), strict=False)
    model.eval()
    model.set_use_attn_result(True)  # what auto-circuit's patchable transformers need
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    for p in model.parameters():
        p.requires_grad_(False)
    items = json.loads((args.dir / "items.json").read_text())
    clean, corrupt = torch.tensor(items["clean"]), torch.tensor(items["corrupt"])
    answers = [torch.tensor([a]) for a in items["answers"]]
    wrong = [torch.tensor([w]) for w in items["wrong"]]
    t0 = time.perf_counter()
    pm = patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True, device=torch.device("cpu"))
    t_wrap = time.perf_counter() - t0
    loader = PromptDataLoader(PromptDataset(clean, corrupt, answers, wrong), seq_len=None, diverge_idx=0,
                              batch_size=len(clean), shuffle=False)
    t0 = time.perf_counter()
    ps = mask_gradient_prune_scores(pm, loader, None, grad_function="logprob", answer_function="avg_diff", mask_val=0.0)
    t_eap = time.perf_counter() - t0
    scores = {e.name: float(e.prune_score(ps)) for e in pm.edges}
    exact, t_exact = {}, None
    if args.exact is not None:  # each edge patched alone, as its API does it: patch_mode with that one edge
        from auto_circuit.types import AblationType
        from auto_circuit.utils.ablation_activations import batch_src_ablations
        from auto_circuit.utils.graph_utils import patch_mode

        names = json.loads(args.exact.read_text())
        src = batch_src_ablations(pm, loader, ablation_type=AblationType.RESAMPLE, clean_corrupt="corrupt")
        t0 = time.perf_counter()  # the edges' forwards alone (surgeon's side, too, is timed with its runs cached)
        with torch.no_grad():
            for batch in loader:
                for name in names:
                    with patch_mode(pm, src[batch.key].clone(), edges=[name]):
                        logp = torch.log_softmax(pm(batch.clean)[pm.out_slice], dim=-1)
                    rows = torch.arange(len(logp))
                    exact[name] = float((logp[rows, batch.answers[:, 0]] - logp[rows, batch.wrong_answers[:, 0]]).mean())
        t_exact = time.perf_counter() - t0
    args.out.write_text(json.dumps({"eap_s": t_eap, "wrap_s": t_wrap, "exact_s": t_exact, "scores": scores,
                                    "exact": exact,
                                    "versions": {"transformer_lens": version("transformer-lens"), "torch": torch.__version__}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
