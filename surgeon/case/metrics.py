"""What an item's score measures: the case's `metric`.

Every analysis compares runs by one number per item, computed from the logits at the item's scored positions
(see `surgeon.case.encoding`: answer tokens carry a sign, +1 for the correct answer's, -1 for the incorrect's).
Higher is always better; an item counts as *right* when its score is above the metric's `right_above`.

    logprob  log P(correct) - log P(incorrect), answers' tokens summed (the default)
    logit    logit(correct) - logit(incorrect) where the answers first differ (no softmax: other tokens do not
             matter)
    prob     P(correct) - P(incorrect), each answer's probability given the prompt and the answers' common prefix
             (the product over its remaining tokens: 9.8 vs 9.11 compares P(8 | ... 9.) and P(11 | ... 9.))
    kl       -KL(good || run) of the next-token distribution where the answers first differ; right when the KL
             is below 0.1 nats (the good format's own run scores 0)
    a function  f(logits, correct, incorrect) -> score per item, over the logits [items, vocab] where the answers
             first differ and those two tokens [items]; right when > 0; differentiable for gradient methods

A metric is a registered class (`register`); a case names it, or gives a function.
"""
from __future__ import annotations

from typing import Callable, ClassVar

from surgeon.errors import CaseError

KL_RIGHT = 0.1  # nats: a run whose next-token distribution is this close to the good format's counts as right


def per_target(x, tok):
    """[rows, 1, ...] values read at one position per row, viewed as one per target [rows, T, ...] (no copy)."""
    return x.expand(tok.shape[0], tok.shape[1], *x.shape[2:]) if x.shape[1] == 1 else x


class Metric:
    """Scores [rows] from float32 logits [rows, T, vocab] at each row's targets, their tokens [rows, T] and signs
    [rows, T] (0 = padding), and with `reference` the good format's log-probabilities [rows, vocab]. Where every
    target of every row reads one position (first-token scoring) the logits are [rows, 1, vocab], computed once:
    `per_target` gives the [rows, T, ...] view."""

    name: ClassVar[str]
    describe: ClassVar[str]  # what the score is, for reports
    right_text: ClassVar[str] = "score > 0"  # when an item counts as right, for reports
    decision: ClassVar[bool] = False  # scored only where the answers first differ (one row per item)
    reference: ClassVar[bool] = False  # needs the good format's next-token log-probabilities there
    right_above: ClassVar[float] = 0.0
    # the score is the sum over targets of sign x a value read at the target's position: an item scored at several
    # positions weights each position's targets (sign 1/k for a mean) and gets the combined score in one readout
    linear: ClassVar[bool] = False

    def score(self, logits, tok, sign, ref=None):
        raise NotImplementedError

    positions: str | None = None  # set for a case scored at several positions: how they combine ("mean", "sum")

    def right(self, scores):
        """Which items the model gets right (numpy or torch)."""
        return scores > self.right_above

    @property
    def label(self) -> str:
        return self.name + (f" per position ({self.positions})" if self.positions else "")


PER_POSITION = " per position ("


METRICS: dict[str, type[Metric]] = {}


def register(cls: type[Metric]) -> type[Metric]:
    METRICS[cls.name] = cls
    return cls


@register
class LogProb(Metric):
    name = "logprob"
    describe = "log P(correct) - log P(incorrect), summed over answer tokens"
    linear = True

    def score(self, logits, tok, sign, ref=None):
        return (per_target(logits.log_softmax(-1), tok).gather(-1, tok[..., None])[..., 0] * sign).sum(-1)


@register
class LogitDiff(Metric):
    name = "logit"
    describe = "logit(correct) - logit(incorrect) at the first token where the answers differ"
    decision = True
    linear = True

    def score(self, logits, tok, sign, ref=None):
        return (per_target(logits, tok).gather(-1, tok[..., None])[..., 0] * sign).sum(-1)


@register
class ProbDiff(Metric):
    name = "prob"
    describe = ("P(correct) - P(incorrect), each answer's probability given the prompt and the answers' common "
                "prefix (the product over its remaining tokens)")

    def score(self, logits, tok, sign, ref=None):
        logp = per_target(logits.log_softmax(-1), tok).gather(-1, tok[..., None])[..., 0]
        out = 0
        for s in (1.0, -1.0):  # a row holds whole answers: its +1 targets are one answer, its -1 targets the other
            mine = sign == s
            p = (logp * mine).sum(-1).exp() * mine.any(-1)
            out = out + s * p
        return out


@register
class KL(Metric):
    name = "kl"
    describe = "-KL(good || run) in nats, of the next-token distribution where the answers first differ"
    right_text = f"KL < {KL_RIGHT}"
    decision = True
    reference = True
    right_above = -KL_RIGHT

    def score(self, logits, tok, sign, ref=None):
        lp = logits[:, 0].log_softmax(-1)
        return -(ref.exp() * (ref - lp)).sum(-1) * (sign != 0).any(-1)


class Function(Metric):
    """A case's own metric: f(logits [items, vocab], correct [items], incorrect [items]) -> [items]."""

    name = "function"
    describe = "the case's metric function over the logits where the answers first differ"
    decision = True

    def __init__(self, fn: Callable):
        self.fn = fn

    def score(self, logits, tok, sign, ref=None):
        out = self.fn(logits[:, 0], tok[:, 0], tok[:, 1])
        if not hasattr(out, "shape") or tuple(out.shape) != (logits.shape[0],):
            raise CaseError(f"the metric function returned {type(out).__name__} of shape "
                            f"{tuple(getattr(out, 'shape', ()))}, not one score per item ({logits.shape[0]},)",
                            field="metric", fix="return a tensor [items]: e.g. logits.gather(1, correct[:, None])[:, 0]"
                                                " - logits.gather(1, incorrect[:, None])[:, 0]")
        return out.float()

    @property
    def label(self) -> str:
        return f"function {getattr(self.fn, '__name__', 'metric')}"


def metric_of(spec) -> Metric:
    """The Metric a case's `metric` field names (a name in METRICS, a function, or a Metric)."""
    if spec is None:
        return LogProb()
    if isinstance(spec, Metric):
        return spec
    if isinstance(spec, str):
        return METRICS[spec]()
    return Function(spec)


def check(spec) -> str | None:
    """Why `spec` is not a metric (None when it is)."""
    if spec is None or isinstance(spec, Metric) or (callable(spec) and not isinstance(spec, str)):
        return None
    if isinstance(spec, str) and spec in METRICS:
        return None
    return f"is {spec!r}"


def describe(label: str) -> str:
    """What a score measures and when an item is right, from a metric's label (as results record it)."""
    name, _, combine = label.partition(PER_POSITION)
    cls = METRICS.get(name, Function)
    if combine:
        what = cls.describe.split(",")[0].split(" at the first")[0]
        return (f"{what} at each of an item's scored positions (its correct against its incorrect token there), the "
                f"{combine.rstrip(')')} over them (metric {label}); an item is right when {cls.right_text}")
    return f"{cls.describe} (metric {label}); an item is right when {cls.right_text}"


__all__ = ["KL_RIGHT", "METRICS", "Metric", "check", "describe", "metric_of", "register"]
