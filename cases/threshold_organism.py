"""A planted "any 8 of the 16 even heads repair" threshold: the paper's claim form with a known answer.

The threshold organism (surgeon/organisms/threshold.py) is one attention-only layer of 32 heads whose
weights are set by construction. It names the first of two letters after `{x} or {y}:` and fails after
`{x} or {y}?`: there every even head copies y instead of x, and every odd head changes in directions the
answer does not read. Patching any 8 even heads from `plain` into `qa` repairs every item; no 7 do; no
set of odd heads does. `surgeon threshold cases/threshold_organism.py --layer 0 --groups even,odd` must
recover exactly that (the expected table is `planted` in the organism's config.json).
"""
from surgeon import Case, Item
from surgeon.organisms import sae_dir
from surgeon.organisms import ground_truth
from surgeon.organisms import threshold as organism

case = Case(
    name="threshold_organism",
    model="organism:threshold",
    formats=dict(organism.FORMATS),
    good=organism.GOOD,
    bad=list(organism.FAILING),
    items=[Item({"x": x, "y": y}, correct=x, incorrect=y) for x, y in organism.items_values()],
    align="last",
    layers=[0],
    components=["z"],
    notes={"planted": organism.planted(), "ground_truth": ground_truth("threshold")},
    saes={"dir": str(sae_dir("threshold") / "blocks.{layer}.hook_attn_out")},  # shipped, see surgeon sae train
    description="Planted threshold: any 8 of the 16 even heads of layer 0 repair; 7 never do; odd heads never do.",
)
