"""The machine's own limit beside every bench: the matrix-multiply peak measured in the same run, the work each side
of a job does, the least work the method needs, and the share of the peak each side reaches.

    peak    the best FLOP/s of `torch.matmul` at the job's own shapes (the model's weight matrices against one clean
            run's rows x positions and against a full batch of 4,096 token rows), in the job's dtype and threads, the
            best of a few timed calls;
    limit   the same at a 2,048-square product: what this machine's matrix units do when nothing else costs;
    work    the matrix-multiply FLOPs a side computes (torch's FlopCounterMode over one run of it, apart from its
            timing: matmuls, batched matmuls and attention, forward and backward);
    least   the FLOPs the method cannot skip (each bench says what they are: e.g. every patched copy from its own
            layer on at the positions from the first one where the prompts differ, plus one clean run of each prompt);
    share   (work / seconds) / peak: how much of what the machine's matrix units can do at these shapes the job gets.

Goals, printed met or MISSED for every surgeon job: work <= 1.2x the least, and a share >= 50% of the peak where the
job's matrices are large enough to reach the machine's limit (its shapes' peak at least half the limit); where they
are not, the line says so and why (fixed costs per operation and memory traffic dominate small products)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

WORK_GOAL = 1.2  # work <= 1.2x the least the method needs
SHARE_GOAL = 0.5  # achieved >= 50% of the peak at the job's shapes
LARGE_ENOUGH = 0.5  # a job's shapes reach the machine's limit when their peak is at least half of it
SQUARE = 2048


def matmul_rate(m: int, k: int, n: int, dtype=torch.float32, repeat: int = 5, min_seconds: float = 0.05) -> float:
    """This machine's FLOP/s for an [m, k] x [k, n] product in `dtype` with torch's current threads: the best of
    `repeat` timings, each of as many products as take `min_seconds`."""
    a = torch.randn(m, k).to(dtype)
    b = torch.randn(k, n).to(dtype)
    a @ b  # the kernel's one-time set-up
    t0 = time.perf_counter()
    a @ b
    once = max(time.perf_counter() - t0, 1e-6)
    reps = max(1, int(min_seconds / once))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = min(best, (time.perf_counter() - t0) / reps)
    return 2 * m * k * n / best


BATCH_ROWS = 4096  # token rows of a full batch: large enough that a product's rate is the weights', not the batch's


def model_shapes(cfg, rows: int, reads: int = 1) -> list[tuple[int, int, int]]:
    """The matrix products a TransformerLens model's forward runs, against `rows` token rows (one clean run's rows x
    positions) and against BATCH_ROWS (a full batch of patched rows): queries (all heads in one product),
    keys/values, the output projection, the MLP in and out; and the unembedding at `reads` read positions. Their best
    rate is the most a job on this model can get from the machine's matrix units."""
    d, hd = cfg.d_model, cfg.n_heads * cfg.d_head
    kv = (cfg.n_key_value_heads or cfg.n_heads) * cfg.d_head
    d_mlp = cfg.d_mlp or 4 * d
    out = []
    for m in (rows, BATCH_ROWS):
        out += [(m, d, hd), (m, d, kv), (m, hd, d), (m, d, d_mlp), (m, d_mlp, d)]
    out.append((max(1, reads), d, cfg.d_vocab))
    return sorted(set(out))


@dataclass
class Limit:
    """The peak at a job's shapes and the machine's limit, measured here."""

    peak: float  # FLOP/s, the best over `shapes`
    limit: float  # FLOP/s at a SQUARE-square product
    shapes: list  # [(m, k, n, FLOP/s)]
    dtype: str
    threads: int

    @classmethod
    def measure(cls, shapes, dtype=torch.float32) -> "Limit":
        rates = [(m, k, n, matmul_rate(m, k, n, dtype)) for m, k, n in shapes]
        limit = matmul_rate(SQUARE, SQUARE, SQUARE, dtype)
        return cls(max(r for *_, r in rates), limit, rates, str(dtype).replace("torch.", ""), torch.get_num_threads())

    @property
    def own_rows(self) -> float:
        """The best rate of the model's products at the rows a clean run has (not a full batch's): what its own
        passes can reach before batching."""
        return max((r for m, _, _, r in self.shapes if m != BATCH_ROWS), default=self.peak)

    @property
    def large_enough(self) -> bool:
        """Whether the job's products reach the machine's limit at a clean run's rows (their rate at least
        LARGE_ENOUGH of the limit there): where they do not, fixed costs per operation and memory traffic bound the
        job, not the matrix units."""
        return self.own_rows >= LARGE_ENOUGH * self.limit

    def line(self, what: str = "the jobs' shapes") -> str:
        best = max(self.shapes, key=lambda s: s[3])
        worst = min(self.shapes, key=lambda s: s[3])
        return (f"this machine's matrix-multiply peak ({self.dtype}, {self.threads} threads, torch.matmul, the best of "
                f"5 timings): {self.peak / 1e9:,.1f} GFLOP/s at {what} (best {best[0]} x {best[1]} x {best[2]}; the "
                f"slowest, {worst[0]} x {worst[1]} x {worst[2]}, {worst[3] / 1e9:,.1f}); {self.limit / 1e9:,.1f} "
                f"GFLOP/s at {SQUARE} x {SQUARE} x {SQUARE}, the machine's limit; at a clean run's rows the model's "
                f"products reach {self.own_rows / self.limit:.0%} of it")

    def record(self) -> dict:
        return {"peak": self.peak, "limit": self.limit, "own_rows": self.own_rows, "large_enough": self.large_enough,
                "shapes": self.shapes, "dtype": self.dtype, "threads": self.threads}


def _addmm_(self_shape, a_shape, b_shape, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def _baddbmm_(self_shape, a_shape, b_shape, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]


# products written in place, which torch's counter does not count (it knows baddbmm, not baddbmm_): the engine's
# edge patching accumulates each live sender block's product into its receivers' buffer with baddbmm_
IN_PLACE = {torch.ops.aten.addmm_: _addmm_, torch.ops.aten.baddbmm_: _baddbmm_}


def count_flops(fn) -> int:
    """The matrix-multiply FLOPs of one call of `fn` (torch's FlopCounterMode: forward and backward, and the in-place
    products it does not count, `IN_PLACE`), run apart from any timing."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=IN_PLACE) as fc:
        fn()
    return int(fc.get_total_flops())


def block_flops(model, tokens: torch.Tensor) -> float:
    """Matrix-multiply FLOPs of one layer at one position of one row (a layer-position), counted on a clean forward
    of `tokens` through every block (no unembedding), averaged over its layers and positions."""
    with torch.no_grad():
        f = count_flops(lambda: model(tokens, stop_at_layer=model.cfg.n_layers))
    return f / (tokens.numel() * model.cfg.n_layers)


def unembed_flops(cfg) -> int:
    """Matrix-multiply FLOPs of one read position's logits (the unembedding)."""
    return 2 * cfg.d_model * cfg.d_vocab


def cell(seconds: float, flops: float | None, least: float | None, limit: Limit) -> dict:
    """One side of one job: its time, work, least work and share of the peak (None where not counted)."""
    return {"seconds": seconds, "flops": flops, "least": least,
            "rate": flops / seconds if flops else None,
            "share": flops / seconds / limit.peak if flops else None,
            "work_ratio": flops / least if flops and least else None}


def header() -> str:
    return (f"{'job':34s}{'side':>10s}{'s':>9s}{'GFLOP':>10s}{'least':>10s}{'x least':>9s}{'GFLOP/s':>10s}"
            f"{'of peak':>9s}")


def row(job: str, side: str, c: dict) -> str:
    f = lambda x, spec: "--" if x is None else format(x, spec)  # noqa: E731
    return (f"{job:34s}{side:>10s}{c['seconds']:9.2f}{f(c['flops'] and c['flops'] / 1e9, ',.1f'):>10s}"
            f"{f(c['least'] and c['least'] / 1e9, ',.1f'):>10s}{f(c['work_ratio'], '.2f'):>9s}"
            f"{f(c['rate'] and c['rate'] / 1e9, ',.1f'):>10s}{f(c['share'], '.0%'):>9s}")


def goals(job: str, c: dict, limit: Limit, why_least: str = "") -> list[str]:
    """The two goals of a surgeon job against the limit, met or MISSED (or why one does not apply)."""
    out = []
    if c["work_ratio"] is not None:
        out.append(f"  {job}: work {c['work_ratio']:.2f}x the least the method needs (goal <= {WORK_GOAL}x: "
                   f"{'met' if c['work_ratio'] <= WORK_GOAL else 'MISSED'})")
    elif c["flops"]:
        out.append(f"  {job}: work against the least: no least derived for it{f' ({why_least})' if why_least else ''}"
                   f" (the note above says why)")
    else:
        out.append(f"  {job}: work not counted (the note above says why)")
    if c["share"] is None:
        out.append(f"  {job}: share of the peak: not counted")
    elif limit.large_enough:
        out.append(f"  {job}: {c['share']:.0%} of the peak at its shapes (goal >= {SHARE_GOAL:.0%}: "
                   f"{'met' if c['share'] >= SHARE_GOAL else 'MISSED'})")
    else:
        out.append(f"  {job}: {c['share']:.0%} of the peak at its shapes (goal >= {SHARE_GOAL:.0%}: not applicable: "
                   f"at a clean run's rows its products reach only {limit.own_rows / limit.limit:.0%} of the machine's "
                   f"limit, so fixed costs per operation and memory traffic, not the matrix units, bound it)")
    return out


# ----------------------------------------------------------------------------- the least work, per kind of method
def layer_parts(cfg) -> tuple[int, int]:
    """Per position, the FLOPs of a layer's MLP and of what a layer computes after its head outputs (the output
    projection and the MLP): a patch at a head's output needs no attention at its own layer, one into an MLP's input
    only that MLP there."""
    mlp = 2 * cfg.d_model * (cfg.d_mlp or 4 * cfg.d_model) * (3 if getattr(cfg, "gated_mlp", False) else 2)
    return mlp, 2 * cfg.n_heads * cfg.d_head * cfg.d_model + mlp


def head_patch_least(cfg, lp: float, span: int, patches: list[dict], reads: int, clean: int) -> float:
    """The least FLOPs of patching heads' outputs. Each patch is {layer: which heads there} (only the layers it
    patches); `span` row-positions (summed over the rows: from each row's first patched position to its last read
    one) are recomputed, and at the last layer only the `reads` positions whose logits are read (nothing after it
    needs the others). A layer's attention depends only on the patches below it and what follows its head outputs
    on those up to it, so patches that agree up to a layer share the work up to there, and a patch that changes
    nothing up to a layer is the clean run there: at layer l the attention runs once per distinct nonempty patch
    below l and the rest of the layer once per distinct nonempty patch up to l. Then the logits at `reads` positions
    per patch, and the clean runs (`clean_least`); `lp` is the model's FLOPs per layer-position (`block_flops`)."""
    L = cfg.n_layers
    _, after_z = layer_parts(cfg)
    total = 0.0
    for layer in range(L):
        below = {tuple(sorted((k, v) for k, v in p.items() if k < layer)) for p in patches} - {()}
        upto = {tuple(sorted((k, v) for k, v in p.items() if k <= layer)) for p in patches} - {()}
        total += (span if layer < L - 1 else reads) * (len(below) * (lp - after_z) + len(upto) * after_z)
    return total + len(patches) * reads * unembed_flops(cfg) + clean_least(cfg, lp, clean, reads)


def clean_least(cfg, lp: float, clean: int, reads: int) -> float:
    """The clean runs every patching method needs (the values patched in, the clean scores): `clean` row-positions
    (the failing run's up to its last read, the other run's up to its last aligned position) through every layer but
    the last, and the last at the `reads` positions read, with their logits."""
    return clean * (cfg.n_layers - 1) * lp + reads * (lp + unembed_flops(cfg))


def edge_patch_least(cfg, lp: float, receivers, span: int, reads: int, clean: int) -> float:
    """The least FLOPs of patching each edge alone: for each edge's receiver (its `kind` q/k/v/mlp/logits and
    `layer`), `span` row-positions recomputed from the receiver on (its whole layer for a query/key/value input,
    only the MLP for an MLP input, nothing for the logits), only the `reads` positions at the last layer, the logits
    at `reads` positions per edge, and the clean runs (`clean_least`; `clean` 0: none)."""
    L = cfg.n_layers
    mlp, _ = layer_parts(cfg)
    at = lambda layer: span if layer < L - 1 else reads  # noqa: E731
    per = 0.0
    for r in receivers:
        if r.kind == "logits":
            continue
        per += at(r.layer) * (mlp if r.kind == "mlp" else lp) + sum(at(x) * lp for x in range(r.layer + 1, L))
    return per + len(receivers) * reads * unembed_flops(cfg) + (clean_least(cfg, lp, clean, reads) if clean else 0)


def edge_dot_least(edges: int, span: int, d_model: int) -> float:
    """The FLOPs of the dot products every EAP scores its edges with: each edge's score is its receiver's input
    gradient dotted with its sender's output difference between the runs over the `span` row-positions where that
    difference can be nonzero (from the first position where the two runs' tokens differ on: before it they agree) and d_model,
    2 FLOPs per term (a matrix multiply's count). Each edge pairs its own sender with its own receiver, so nothing
    is shared between edges; integrated gradients whose sender differences are fixed (EAP-IG-inputs) need it once,
    over the gradients summed across the steps."""
    return 2.0 * edges * span * d_model


def work_section(title: str, lim: "Limit", sides: list, notes: list[str] = ()) -> list[dict]:
    """Print a bench's work table against the limit: `sides` are (job, side, seconds, flops, least) (flops counted
    by `count_flops` apart from the timing, least by the method's formula or None), then each surgeon side's goals.
    Returns the cells (for a bench's saved data)."""
    print(f"\n{title}")
    print("  " + lim.line())
    print("  " + header())
    out = []
    for job, side, seconds, flops, least in sides:
        c = cell(seconds, flops, least, lim)
        out.append({"job": job, "side": side, **c})
        print("  " + row(job, side, c))
    for n in notes:
        print(f"  {n}")
    print(f"goals against the limit (work <= {WORK_GOAL}x the least; >= {SHARE_GOAL:.0%} of the peak where the shapes "
          f"reach the limit)")
    for o in out:
        if o["side"] == "surgeon":
            for line in goals(o["job"], o, lim):
                print(line)
    return out


def distinct_positions(rows, start, stop) -> int:
    """Row-positions a causal model must compute for `rows` (encoded rows with `tokens`): the distinct token prefixes
    tokens[:p + 1] for start(row) <= p <= stop(row), since a position's state depends on its prefix alone (rows of
    one item share their prompt's, an answer row that another extends is inside it)."""
    seen = set()
    for r in rows:
        for p in range(start(r), stop(r) + 1):
            seen.add(tuple(r.tokens[:p + 1]))
    return len(seen)


def last_read(row) -> int:
    """The last position whose logits a row's score reads."""
    return max(t[0] for t in row.targets)


def read_positions(rows) -> int:
    """The distinct positions whose logits the rows' scores read (two targets read at one position, e.g. a logit
    difference, or answer rows sharing a prompt, count once)."""
    return len({tuple(r.tokens[:t[0] + 1]) for r in rows for t in r.targets})


def case_rows(case, model) -> int:
    """The token rows (rows x positions) of one clean run of `case`'s failing format on the items its analyses use
    (its focus): the rows a job's products have before patches multiply them."""
    from surgeon.case.encoding import format_rows

    return sum(len(r.tokens) for r in format_rows(case, model, case.bad_formats[0], case.items_for(case.focus)))


def counted_section(title: str, models, sides: list, notes: list[str] = ()) -> list[dict]:
    """`work_section` for a bench that times callables on small models: the peak at the shapes of every model in
    `models` ((cfg, token rows of a clean run: `case_rows`) pairs), each side's work counted by rerunning its
    callable once under the counter (`sides`: (job, side, seconds, callable or FLOPs or None, least)). Whether the
    shapes reach the machine's limit is judged at those rows, the jobs' own."""
    shapes = sorted({s for cfg, rows in models for s in model_shapes(cfg, rows)})
    lim = Limit.measure(shapes)
    counted = [(job, side, seconds, count_flops(fn) if callable(fn) else fn, least)
               for job, side, seconds, fn, least in sides]
    return work_section(title, lim, counted, notes)


def limit_only(what: str) -> str:
    """The line a bench that times no matrix work prints: the machine's limit measured in its run, and why it has no
    work or share columns."""
    rate = matmul_rate(SQUARE, SQUARE, SQUARE)
    return (f"this machine's matrix-multiply limit: {rate / 1e9:,.1f} GFLOP/s (float32, {torch.get_num_threads()} "
            f"threads, a {SQUARE}-square product, the best of 5 timings); {what}, so no work or share-of-peak columns")
