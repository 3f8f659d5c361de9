"""Analyses: plain functions over a case and a model, each returning a plain result dataclass.

`REGISTRY` maps an analysis name to its function; the CLI's subcommands come from the same table.
"""
from surgeon.analyses.attribution import AttributionResult, attribute
from surgeon.analyses.diagnose import Diagnosis, diagnose
from surgeon.analyses.patching import PatchResult, patch_heads

REGISTRY = {"diagnose": diagnose, "patch": patch_heads, "attribute": attribute}

__all__ = ["REGISTRY", "diagnose", "Diagnosis", "patch_heads", "PatchResult", "attribute", "AttributionResult"]
