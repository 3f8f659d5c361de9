"""surgeon: circuit discovery and surgical repair for transformer language models.

The way through the package follows the user's way, one folder a step, with no arrow back: a case
(`surgeon.case`) names a model (`surgeon.models`, `surgeon.organisms`); the engine (`surgeon.engine`)
patches masks at sites (`surgeon.sites`: nodes, edges, SAE features) between a good and a failing run;
circuits (`surgeon.circuits`), subset searches (`surgeon.search`) and the analyses (`surgeon.analyses`) are
plain functions over it; reports, figures and exports (`surgeon.reports`, `surgeon.circuits.export`) and the
command line (`surgeon.cli`) come last. Heavy libraries are imported lazily.
"""
from surgeon import show as _show
from surgeon.errors import AnalysisError, CaseError, ModelError, SurgeonError
from surgeon.models.checks import load_case
from surgeon.case.case import Case, Chat, Item
from surgeon.version import __version__


def _load_views() -> None:
    """Register how every result shows itself (the report layer's views), the first time one is shown."""
    from surgeon.reports import views  # noqa: F401


_show.install_loader(_load_views)

API = ("diagnose", "scan", "encode", "dla", "attention", "patch", "patch_positions", "attribute", "threshold", "evaluate_subsets", "repair", "measure", "fold", "apply", "sinks", "blend", "circuit", "circuit_eval",
       "sae_overlap", "sae_amplified", "sae_heads", "sae_repair", "feature_circuit", "report", "read_circuit", "load",
       "case_and_model")


def __getattr__(name: str):
    """`surgeon.diagnose`, `surgeon.patch`, ...: the notebook API (`surgeon.api`), imported on first use so that
    `import surgeon` stays light."""
    if name in API:
        from surgeon import api

        return getattr(api, name)
    raise AttributeError(f"module 'surgeon' has no attribute {name!r}")

__all__ = ["Case", "Chat", "Item", "load_case", "SurgeonError", "CaseError", "ModelError", "AnalysisError",
           "__version__", *API]
