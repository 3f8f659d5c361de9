"""A planted chain of SAE features across two layers: the ground truth for feature circuits and their edges.

The chain organism (surgeon/organisms/chain.py) is two layers whose weights are set by construction. It names the
first of two letters after `{x} or {y}:` and fails after `{x} or {y}?`: layer 0's MLP writes the answer feature A_k
for the wrong letter, layer 1's MLP turns A_k into the logit feature B_k the unembedding reads. Its SAEs (shipped,
built by construction) have one feature per planted direction, so `surgeon feature-circuit
cases/chain_organism.py --layers 0,1` must find the features A_k and B_k and the edges A_k -> B_k with the sizes the
construction gives (`planted_edges` in the organism's module and config.json), and nothing between the marker
features and the distractors they feed, which the answer never reads.
"""
from surgeon import Case, Item
from surgeon.organisms import ground_truth, sae_dir
from surgeon.organisms import chain as organism

case = Case(
    name="chain_organism",
    model="organism:chain",
    formats=dict(organism.FORMATS),
    good=organism.GOOD,
    bad=list(organism.FAILING),
    items=[Item({"x": x, "y": y}, correct=x, incorrect=y) for x, y in organism.items_values()],
    align="last",
    layers=[0, 1],
    components=["mlp_out"],
    notes={"ground_truth": ground_truth("chain")},
    saes={"dir": str(sae_dir("chain") / "blocks.{layer}.hook_mlp_out")},  # built with the organism
    description="Planted feature chain: answer feature A_k (layer 0 MLP) -> logit feature B_k (layer 1 MLP) -> the "
                "answer; the qa format writes A_y instead of A_x.",
)
