"""Repairs a user can ship: a constant written into chosen heads at positions counted from the last prompt token,
which needs the failing prompt alone (no good-format twin). `site` is the constant-source site the engine runs
(mean ablation's kind of source, with the good format's mean or a steering difference in place of the item's own);
`artifact` is the `Repair` itself: hooks for any forward or `model.generate`, and save / load as safetensors named by
TransformerLens hook point. How a repair is built, measured and searched for lives in `surgeon.analyses.repair`."""
