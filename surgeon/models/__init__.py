"""Models: resolving a name (a Hugging Face id, a local checkpoint, an organism), loading it as a
HookedTransformer, and checking a case against it."""
from surgeon.models.checks import check_case_against_model, load_case
from surgeon.models.loading import (
           ModelRef,
           ModelShape,
           load_model,
           load_tokenizer,
           resolve,
           shape,
           weights_sha256,
)

__all__ = ["ModelRef", "ModelShape", "check_case_against_model", "load_case", "load_model", "load_tokenizer",
           "resolve", "shape", "weights_sha256"]
