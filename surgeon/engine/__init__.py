"""The engine: one batched mechanism behind every analysis (`Contrast`), attention over a shared prefix, and
reading scores out of the final residual stream."""
from surgeon.engine.contrast import Contrast
from surgeon.engine.readout import cached_batches, greedy, readout, reference_logprobs, score_rows

__all__ = ["Contrast", "cached_batches", "greedy", "readout", "reference_logprobs", "score_rows"]
