"""A planted weighted threshold over the 16 even heads: the paper's claim form with a known answer.

The threshold organism (surgeon/organisms/threshold.py) is one attention-only layer of 32 heads whose
weights are set by construction. It names the first of two letters after `{x} or {y}:` and fails after
`{x} or {y}?`: there every even head copies y instead of x, and every odd head changes in directions the
answer does not read. Each even head carries its own weight (1..16, scrambled over the heads): patching a
set of heads from `plain` into `qa` repairs every item exactly when its even heads' weights sum to >= 69 of
136, so *which* heads matter, not only how many; no set of odd heads repairs anything. `surgeon threshold
cases/threshold_organism.py --layer 0 --groups even,odd` must recover exactly the table the closed form
gives (`planted` in the organism's module and config.json), subset by subset.
"""
from surgeon import Case, Item
from surgeon.organisms import ground_truth, sae_dir
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
    description="Planted weighted threshold: a set of heads repairs iff its even heads' weights (1..16) sum to >= 69 "
                "of 136; odd heads never do.",
)
