"""Sparse autoencoders through sae-lens: where they come from (`load`), how they are trained for the
organisms (`train`) and whether they are good enough to read (`quality`). The analyses over their
features live in `surgeon.analyses.sae_*`; feature patching is a site of the core (`surgeon.sites.features`)."""
