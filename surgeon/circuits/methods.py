"""The scoring methods (edges for `surgeon circuit`, units for `surgeon attribute`, feature nodes for `surgeon
feature-circuit`) and the circuit semantics, each
one list shared by the code, the CLI and the README (plain data: importing it costs nothing)."""

# every edge-scoring method, with the convention it follows (shared by the code, the CLI help and the README)
METHODS: dict[str, str] = {
    "eap": "EAP: d(mean score)/d(mask) at mask 0, one forward and one backward (Syed et al.; auto-circuit's "
           "and EAP-IG's `EAP`)",
    "eap-ig-inputs": "EAP-IG as hannamw/EAP-IG and MIB define it (`EAP-IG-inputs`): the input embeddings "
                     "interpolated from the other run's towards this run's at k/steps, k = 0..steps-1; each edge's "
                     "(other - this run's) sender difference times the gradient at its receiver, averaged over the "
                     "steps; prompts of equal length only",
    "eap-ig-activations": "like EAP-IG's `EAP-IG-activations`: each sender group's output (the input, a layer's "
                          "heads, an MLP) interpolated alone at k/steps, k = 1..steps, group by group, the same "
                          "products averaged over groups and steps; unlike EAP-IG's code, the gradient still flows "
                          "through the interpolated group (EAP-IG sets it to a constant, which cuts the paths "
                          "through it)",
    "eap-ig-masks": "integrated gradients over the edge mask (auto-circuit's convention, which sums the mask "
                    "gradient at 11 points 0, 0.1, ..., 1): every edge mask at the midpoints (i + 0.5)/steps, the "
                    "gradient averaged (not summed)",
    "exact": "exact edge patching: each edge patched alone, its effect on the mean score measured",
}
IG_METHODS = ("eap-ig-inputs", "eap-ig-activations", "eap-ig-masks")
IG_STEPS = 5  # MIB's and EAP-IG's usual step count
MAX_IG_STEPS = 1000

# estimating every unit's patching effect (`surgeon attribute --method`)
ATTRIBUTION_METHODS: dict[str, str] = {
    "gradient": "d(mean score)/d(mask) at mask 0: one forward and one backward pass",
    "ig": "integrated gradients along mask = a for every unit, a from 0 to 1 (midpoint rule, --ig-steps points)",
    "atp*": "AtP* (Kramar et al. 2024): queries and keys through their exact attention patterns (QK fix), and "
            "GradDrop, the mean over layers l of |the gradient with layer l's outputs dropped|: magnitudes, one "
            "backward pass per layer",
}
ATTRIBUTION_IG_STEPS = 10

# estimating every feature node's patching effect (`surgeon feature-circuit --method`): features and error terms
FEATURE_METHODS: dict[str, str] = {
    "ig": "integrated gradients over the feature mask (--steps midpoints), one SAE at a time with the others clean "
          "(Marks et al.'s `_pe_ig`)",
    "ig-marks": "integrated gradients at Marks et al.'s points: k/N for k = 0..N-1 from this run's own values (N = "
                "--steps; their default is 10), one SAE at a time with the others clean (their `_pe_ig` exactly)",
    "gradient": "the gradient at the mask's 0: every node of every SAE from one backward pass (Marks et al.'s "
                "attribution patching)",
}

# what a circuit means (`surgeon circuit --semantics`), recorded in every result, exported file and circuit-eval output
# (see surgeon.analyses.circuit_runs for the runs behind each)
SEMANTICS: dict[str, str] = {
    "kept": "the circuit is what is kept (MIB, ACDC, auto-circuit): on the source format's items every edge outside "
            "the circuit carries its ablation value (resample: the other format's sender output at the aligned "
            "positions; mean: the sender's mean over items per position; zero: zero; mean and zero at every "
            "position), every edge inside its sender's current output; f = (m(C) - m(empty)) / (m(full) - m(empty))",
    "knockout": "the circuit is what is removed (necessity; Marks et al.'s completeness is the faithfulness of the "
                "rest): the circuit's edges carry their ablation value, every other edge its current output; the "
                "value is the share of the behaviour removed, (m(full) - m(without C)) / (m(full) - m(empty))",
}
# what files written before 0.2 recorded: "chain" meant the kept reading under resample ablation with every position
# aligned (read as "kept"); "edge-set" patched a circuit's edges together and let every other edge pass current
# values, which is neither reading (such a file is refused by circuit-eval)
LEGACY_SEMANTICS = {"chain": "kept"}
