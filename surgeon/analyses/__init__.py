"""Analyses: plain functions over a case and a model, each returning a plain result dataclass that prints, renders
and saves itself. The command line (`surgeon.cli`) and the Python API (`surgeon.api`) call the same functions."""
from surgeon.analyses.attribution import AttributionResult, attribute
from surgeon.analyses.diagnose import Diagnosis, diagnose
from surgeon.analyses.patching import PatchResult, patch_heads

__all__ = ["diagnose", "Diagnosis", "patch_heads", "PatchResult", "attribute", "AttributionResult"]
