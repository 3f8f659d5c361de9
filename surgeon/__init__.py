"""surgeon: circuit discovery and surgical repair for transformer language models.

The way through the package follows the user's way: a case (`surgeon.case`) names a model
(`surgeon.models`), its items become token rows (`surgeon.encoding`), the intervention core
(`surgeon.core`) patches them, analyses (`surgeon.analyses`) are plain functions over that, and
results, figures and exports come last. Heavy libraries are imported lazily.
"""
from .case import Case, Chat, Item, load_case
from .errors import AnalysisError, CaseError, ModelError, SurgeonError

__version__ = "0.1.0"
__all__ = ["Case", "Chat", "Item", "load_case", "SurgeonError", "CaseError", "ModelError", "AnalysisError",
           "__version__"]
