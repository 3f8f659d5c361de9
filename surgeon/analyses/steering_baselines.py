"""The field's steering baselines beside surgeon's repair, on the same held-out items and measures.

Every configuration of every method is a mask on the one engine's constant-source sites
(`surgeon.repairs.site.ConstantSite`), so all of them run in one batched pass per scorer:

- **surgeon**: each step of the repair search's greedy path (the heads it added so far, at the strength it chose),
  and the shipped repair itself (its own saved constants);
- **CAA** (Rimsky et al. 2024; activation addition, Turner et al. 2023): at ``blocks.L.hook_resid_pre``, the mean over
  the discovery items of the good format's residual stream minus the failing formats', per aligned position (the
  last prompt token and the answer tokens, as surgeon's steer mode takes it), added times a strength; every layer and
  every strength of the grid. Rimsky et al. take one difference at the answer token of contrastive A/B prompts and add
  it at every position after the prompt: here the contrast is the failing format against the good one, of the same
  items, and the positions are the repair's (`surgeon.repairs.site.slot_columns`), so that only the method differs.
- **ITI** (Li et al. 2023): each head's output (``hook_z``, before W_O) at the last prompt token, good format labelled
  1 and each failing format 0; a logistic probe per head (L2, C=1, as their scikit-learn default) trained on 80% of the
  discovery items and ranked by its accuracy on the other 20% (ties: the lower held-out log loss); the top K heads
  shifted by alpha x sigma x theta, theta the unit mass-mean direction (good mean minus failing mean over every
  discovery activation) and sigma the activations' standard deviation along it, at every position the repair acts at.
  Their truthful / untruthful labels become the good / failing format of the same item.
- controls: as many random heads as the shipped repair (seeded draws), and every head of one layer, both with the
  shipped repair's mode and strength.

Which configurations are reported: each method's configurations are measured on the discovery items (in-sample), the
ones no other configuration of the same method dominates there are kept (random draws: all), and only those are
measured on the held-out items, where the Pareto front is drawn (`surgeon.analyses.pareto`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from surgeon.analyses.pareto import BaselinePoint, Baselines, front, key
from surgeon.analyses.repair import KINDS, MODES, RepairResult, Scorer, build_pool, setup_split, unit_name
from surgeon.engine.contrast import Contrast
from surgeon.errors import AnalysisError
from surgeon.repairs.site import ConstantSite
from surgeon.search.subsets import Unit
from surgeon.sites.nodes import Site
from surgeon.case.case import Case, Item, by_tag
from surgeon.case.encoding import prepend_bos, prompt_rows
from surgeon.stats import bootstrap_mean, wilson

CAA_STRENGTHS = (0.25, 0.5, 1.0, 2.0, 4.0)
ITI_K = (1, 2, 4, 8, 16, 32, 64)
ITI_ALPHAS = (1.0, 2.0, 5.0, 10.0, 15.0)  # Li et al. report alpha = 15 for LLaMA-7B
RANDOM_DRAWS = 5
PROBE_VAL = 0.2  # ITI's probe: the share of discovery items it is validated on


@dataclass(frozen=True)
class Candidate:
    """One configuration: (site, unit, strength) parts, each a mask entry on the engine's constant sites."""

    family: str
    label: str
    params: dict
    parts: tuple  # ((ConstantSite, unit index, mask value), ...)
    shipped: bool = False


def _masks(cands: Sequence[Candidate], cfg) -> dict:
    import torch

    sites = []
    for c in cands:
        for s, _, _ in c.parts:
            if not any(s is t for t in sites):
                sites.append(s)
    out = {s: torch.zeros(len(cands), s.n_units(cfg)) for s in sites}
    for p, c in enumerate(cands):
        for s, u, a in c.parts:
            out[s][p, u] = a
    return out


# ----------------------------------------------------------------------------------------------- the methods


def surgeon_candidates(result: RepairResult, pool_sites: dict, pool_hook) -> list[Candidate]:
    """Each step of the search's path (or the named heads alone) from the pool's sites, and the shipped repair with
    its own constants."""
    rep = result.repair
    out: list[Candidate] = []
    chosen: list[Unit] = []
    for st in result.search:
        if "added" not in st:
            continue
        if "unit" in st:
            L, h, kind = st["unit"]
        else:  # a search saved before steps recorded their unit: heads only
            (L, h), kind = st["added"][1:].upper().split("H"), "H"
        chosen = chosen + [Unit(int(L), int(h), kind)]
        label = "+".join(unit_name(u) for u in sorted(chosen, key=lambda u: (u.layer, "RHAM".index(u.kind), u.head)))
        if label == "+".join(rep.heads) and st["strength"] == rep.strength:
            continue  # the shipped one, below
        out.append(Candidate("surgeon", f"{label} x{st['strength']:g}", {"k": len(chosen), "strength": st["strength"]},
                             tuple((pool_sites[pool_hook(u)], u.head, float(st["strength"])) for u in chosen)))
    own = rep.sites()
    parts = tuple((own[h], int(u), float(rep.strength)) for h, us in rep.units.items() for u in us)
    out.append(Candidate("surgeon", f"{'+'.join(rep.heads)} x{rep.strength:g}",
                         {"k": len(rep.heads), "strength": rep.strength}, parts, shipped=True))
    return out


def caa_candidates(case: Case, model, items: Sequence[Item], bads: Sequence[str], strengths: Sequence[float],
                   batch_size: int) -> list[Candidate]:
    units = [Unit(L, 0, KINDS["resid_pre"]) for L in range(model.cfg.n_layers)]
    pool = build_pool(case, model, items, units, mode="steer", bads=bads, batch_size=batch_size)
    sites = {h: ConstantSite.at(h, v, "add") for h, v in pool.values.items()}
    return [Candidate("caa", f"L{u.layer} x{a:g}", {"layer": u.layer, "strength": a},
                      ((sites[pool.hook(u)], 0, float(a)),)) for u in units for a in strengths]


def _logistic(x, y, train, val):
    """A logistic probe (L2 penalty 1/2 |w|^2 beside the summed log loss: scikit-learn's default, C=1) fitted on rows
    `train`; its accuracy and mean log loss on rows `val`."""
    import torch

    X = torch.as_tensor(x, dtype=torch.float64)
    Y = torch.as_tensor(y, dtype=torch.float64)
    w = torch.zeros(X.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe", tolerance_grad=1e-9)
    tr, va = torch.as_tensor(train), torch.as_tensor(val)

    def loss():
        opt.zero_grad()
        out = torch.nn.functional.binary_cross_entropy_with_logits(X[tr] @ w + b, Y[tr], reduction="sum")
        out = out + 0.5 * (w * w).sum()
        out.backward()
        return out

    with torch.enable_grad():
        opt.step(loss)
    with torch.no_grad():
        z = X[va] @ w + b
        acc = float(((z > 0).double() == Y[va]).double().mean())
        ll = float(torch.nn.functional.binary_cross_entropy_with_logits(z, Y[va]))
    return acc, ll


def iti_directions(case: Case, model, items: Sequence[Item], bads: Sequence[str], batch_size: int, seed: int = 0):
    """Per head: the probe's held-out accuracy and log loss, the unit mass-mean direction theta and sigma (the
    activations' std along it), from each head's output at the last prompt token, the good format (1) against each
    failing format (0) of the same discovery items. Returns (rank [(layer, head), ...], acc {(L, h)}, values {hook:
    Tensor [heads, d_head] = sigma x theta})."""
    import torch

    bos = prepend_bos(case, model)
    good = prompt_rows(case.formats[case.good], items, model.tokenizer, bos)
    n = len(items)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    n_val = max(1, int(round(PROBE_VAL * n)))
    val_items, train_items = set(order[:n_val].tolist()), set(order[n_val:].tolist())
    acts_good, acts_bad = {}, {}
    sites = [Site.of("z", L) for L in range(model.cfg.n_layers)]
    for b in bads:
        rows = prompt_rows(case.formats[b], items, model.tokenizer, bos)
        c = Contrast(model, rows, good, case.align, batch_size=batch_size, sites=sites, clean=False)
        for s in sites:
            acts_good.setdefault(s.hook, []).append(c.activations(s, "source")[:, 0].double())  # [n, H, d]
            acts_bad.setdefault(s.hook, []).append(c.activations(s, "base")[:, 0].double())
    item_of = np.concatenate([np.arange(n)] * (2 * len(bads)))
    y = np.concatenate([np.ones(n * len(bads)), np.zeros(n * len(bads))])
    train = np.flatnonzero([i in train_items for i in item_of])
    val = np.flatnonzero([i in val_items for i in item_of])
    scores, values = {}, {}
    for s in sites:
        g, bd = torch.cat(acts_good[s.hook]), torch.cat(acts_bad[s.hook])  # [n x bads, H, d]
        X = torch.cat([g, bd])
        vals = torch.zeros(X.shape[1], X.shape[2], dtype=torch.float64)
        for h in range(X.shape[1]):
            acc, ll = _logistic(X[:, h].numpy(), y, train, val)
            theta = g[:, h].mean(0) - bd[:, h].mean(0)
            norm = float(theta.norm())
            if norm > 0:
                theta = theta / norm
                sigma = float((X[:, h] @ theta).std(unbiased=False))
                vals[h] = sigma * theta
            scores[(s.layer, h)] = (acc, ll)
        values[s.hook] = vals.float()
    rank = sorted(scores, key=lambda k: (-scores[k][0], scores[k][1], k))
    return rank, {k: v[0] for k, v in scores.items()}, values


def iti_candidates(case: Case, model, items: Sequence[Item], bads: Sequence[str], n_slots: int, ks: Sequence[int],
                   alphas: Sequence[float], batch_size: int, seed: int) -> list[Candidate]:
    rank, acc, values = iti_directions(case, model, items, bads, batch_size, seed)
    sites = {h: ConstantSite.at(h, v[None].expand(n_slots, *v.shape).contiguous(), "add") for h, v in values.items()}
    out = []
    for K in sorted({min(k, len(rank)) for k in ks}):
        top = rank[:K]
        for a in alphas:
            out.append(Candidate("iti", f"K={K} alpha={a:g}", {"K": K, "alpha": a, "heads": [f"L{L}H{h}" for L, h in top],
                                                               "probe_accuracy": [acc[t] for t in top]},
                                 tuple((sites[Site.of("z", L).hook], h, float(a)) for L, h in top)))
    return out


def control_candidates(result: RepairResult, model, pool_sites: dict, pool_hook, draws: int,
                       seed: int) -> list[Candidate]:
    rep = result.repair
    heads = [Unit(L, h) for L in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    k, a = len(rep.heads), float(rep.strength)
    rng = np.random.default_rng(seed)
    out = []
    for d in range(draws):
        pick = sorted((heads[i] for i in rng.choice(len(heads), size=min(k, len(heads)), replace=False)),
                      key=lambda u: (u.layer, u.head))
        out.append(Candidate("random", f"draw {d}: {'+'.join(u.label for u in pick)}", {"draw": d, "strength": a},
                             tuple((pool_sites[pool_hook(u)], u.head, a) for u in pick)))
    for L in range(model.cfg.n_layers):
        us = [u for u in heads if u.layer == L]
        out.append(Candidate("layer", f"L{L} all heads x{a:g}", {"layer": L, "strength": a},
                             tuple((pool_sites[pool_hook(u)], u.head, a) for u in us)))
    return out


# ----------------------------------------------------------------------------------------------- measuring


def measure_candidates(case: Case, model, items: Sequence[Item], focus: str, bads: Sequence[str],
                       cands: Sequence[Candidate], batch_size: int) -> dict:
    """Every candidate on `items` in one batched pass per scorer: efficacy (the failing formats' focus items right,
    pooled) [P, n], control items right [P, m] (the good format's every item; the failing formats' other tags), the
    good format's KL per item [P, n]; and the unrepaired model's rights."""
    masks = _masks(cands, model.cfg)
    tags = by_tag(items)
    focus_items = list(items) if focus == "all" else tags.get(focus, [])
    eff, eff0, ctl, ctl0 = [], [], [], []
    for f in bads:
        s = Scorer(case, model, focus_items, f, batch_size)
        eff.append(np.asarray(s.metric.right(s.run(masks))))
        eff0.append(np.asarray(s.metric.right(s.c.clean_base.float().cpu().numpy())))
    others = [it for t, its in tags.items() if focus != "all" and t != focus for it in its]  # in tag order
    groups = [(case.good, list(items))] + [(f, others) for f in bads if others]  # one Scorer a format
    for f, its in groups:
        s = Scorer(case, model, its, f, batch_size)
        ctl.append(np.asarray(s.metric.right(s.run(masks))))
        ctl0.append(np.asarray(s.metric.right(s.c.clean_base.float().cpu().numpy())))
    kl = Scorer(case, model, items, case.good, batch_size, kl=True).kl(masks)
    return {"efficacy": np.concatenate(eff, 1), "control": np.concatenate(ctl, 1), "kl": kl,
            "efficacy0": np.concatenate(eff0), "control0": np.concatenate(ctl0)}


def _summary(m: dict, p: int) -> tuple[float, float, float]:
    return float(m["efficacy"][p].mean()), float(m["kl"][p].mean()), float(m["control"][p].mean())


def compare_baselines(case: Case, model, result: RepairResult, *, holdout: float | None = 0.5, seed: int = 0,
                      eval_items=None, bad: str | None = None, tag: str | None = None, batch_size: int = 256,
                      caa_strengths: Sequence[float] = CAA_STRENGTHS, iti_k: Sequence[int] = ITI_K,
                      iti_alphas: Sequence[float] = ITI_ALPHAS, random_draws: int = RANDOM_DRAWS,
                      progress: bool = False) -> Baselines:
    """surgeon's repair (`result`, from `repair_case` or `search_repair` with the same split options) beside CAA, ITI
    and the controls, each built on the discovery items the repair was built on and measured on its held-out items."""
    rep = result.repair
    bads, focus, split, disc, ev, disc_focus = setup_split(case, rep.mode, bad, tag, holdout, seed, eval_items)
    if len(ev) != result.n_evaluation or focus != result.focus:
        raise AnalysisError("the baselines' split is not the repair's (another holdout, seed, tag or evaluation items)",
                            field="--holdout", fix="compare with the options the repair was built with")
    heads = [Unit(L, h) for L in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    whole = [Unit(L, 0, KINDS[c]) for c in rep.component.split("+") if c in KINDS and c != "z"
             for L in range(model.cfg.n_layers)]  # the search's other sites, for its path's steps
    pool = build_pool(case, model, disc_focus, heads + whole, mode=rep.mode, bads=bads, batch_size=batch_size)
    pool_sites = {h: ConstantSite.at(h, v, MODES[rep.mode]) for h, v in pool.values.items()}
    n_slots = max(int(v.shape[0]) for v in pool.values.values())
    grids = {"caa": {"layers": list(range(model.cfg.n_layers)), "strengths": list(caa_strengths)},
             "iti": {"K": sorted({min(k, len(heads)) for k in iti_k}), "alpha": list(iti_alphas)},
             "random": {"draws": random_draws, "heads": len(rep.heads), "strength": rep.strength},
             "layer": {"layers": list(range(model.cfg.n_layers)), "strength": rep.strength}}
    stages = ["surgeon", "caa", "iti", "controls", "discovery", "held out"]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(stages), desc="steering baselines", unit="stage", leave=False)

    def step():
        if bar is not None:
            bar.update(1)

    cands = surgeon_candidates(result, pool_sites, pool.hook)
    step()
    cands += caa_candidates(case, model, disc_focus, bads, caa_strengths, batch_size)
    step()
    cands += iti_candidates(case, model, disc_focus, bads, n_slots, iti_k, iti_alphas, batch_size, seed)
    step()
    cands += control_candidates(result, model, pool_sites, pool.hook, random_draws, seed)
    step()
    d = measure_candidates(case, model, disc, focus, bads, cands, batch_size)
    step()
    kept = []
    for fam in dict.fromkeys(c.family for c in cands):
        idx = [i for i, c in enumerate(cands) if c.family == fam]
        on = front([key(*_summary(d, i)) for i in idx]) if fam != "random" else [True] * len(idx)
        kept += [i for i, o in zip(idx, on) if o or cands[i].shipped]
    sub = [cands[i] for i in kept]
    h = measure_candidates(case, model, ev, focus, bads, sub, batch_size)
    step()
    if bar is not None:
        bar.close()
    points = []
    for p, (i, c) in enumerate(zip(kept, sub)):
        e, k, ct = h["efficacy"][p], h["kl"][p], h["control"][p]
        de, dk, dc = _summary(d, i)
        points.append(BaselinePoint(c.family, c.label, c.params, wilson(int(e.sum()), int(e.size)), bootstrap_mean(k),
                                    float(np.quantile(k, 0.9)), wilson(int(ct.sum()), int(ct.size)),
                                    {"efficacy": de, "kl": dk, "control": dc}, shipped=c.shipped))
    on = front([key(p.efficacy.value, p.kl.value, p.control.value) for p in points])
    points = [BaselinePoint(**{**vars(p), "front": bool(o)}) for p, o in zip(points, on)]
    un = {"efficacy": wilson(int(h["efficacy0"].sum()), int(h["efficacy0"].size)),
          "control": wilson(int(h["control0"].sum()), int(h["control0"].size))}
    tried = {fam: sum(c.family == fam for c in cands) for fam in dict.fromkeys(c.family for c in cands)}
    return Baselines(points, un, len(ev), len(disc), tried, grids)


__all__ = ["CAA_STRENGTHS", "Candidate", "ITI_ALPHAS", "ITI_K", "compare_baselines", "iti_directions",
           "measure_candidates"]
