"""Attribution from mask gradients on the decimal organism (weights frozen, shared-prefix attention)."""
import numpy as np
import pytest
import torch

from surgeon.analyses import attribute
from surgeon.analyses.common import make_contrast
from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Site


def test_gradient_equals_finite_difference_and_ranks_exact_patching(decimal_model, decimal_case):
    r = attribute(decimal_case, decimal_model, layers=[0, 1], compare=True)
    assert r.gradient.shape == (2, 8)
    # the gradient is the slope of the mean score along each unit's mask, through the same core
    c, _ = make_contrast(decimal_case, decimal_model, sites=[Site.of("z", 1)])
    eps = 1e-2
    with torch.no_grad():
        up = c.run({Site.of("z", 1): eps * torch.eye(8)}).mean(-1)
        down = c.run({Site.of("z", 1): -eps * torch.eye(8)}).mean(-1)
    np.testing.assert_allclose(r.gradient[1], ((up - down) / (2 * eps)).numpy(), atol=2e-3, rtol=2e-2)
    # a first-order estimate: it ranks the exact per-head effects well on this organism
    assert r.exact.shape == (2, 8) and r.spearman > 0.8


def test_integrated_gradients_sum_to_the_whole_patch_and_rank_exact_patching_better(decimal_model, decimal_case):
    """IG over the masks: by the completeness of the integral, the units' estimates sum to the effect of patching
    every unit at once (measured here by patching all layers' heads together), up to the midpoint rule's error;
    and on this organism it is closer to exact per-head patching than the gradient at 0 (L0H6 saturates)."""
    ig = attribute(decimal_case, decimal_model, compare=True, method="ig", ig_steps=40)
    grad = attribute(decimal_case, decimal_model, compare=True)
    sites = [Site.of("z", L) for L in range(decimal_model.cfg.n_layers)]
    c, _ = make_contrast(decimal_case, decimal_model, sites=sites)
    with torch.no_grad():
        whole = float(c.run({s: torch.ones(1, 8) for s in sites}).mean() - c.clean_base.mean())
    assert ig.gradient.sum() == pytest.approx(whole, rel=0.01)
    assert abs(grad.gradient.sum() - whole) > 0.1 * abs(whole)  # the gradient at 0 has no such property here
    assert ig.pearson > grad.pearson + 0.1 and ig.method == "ig" and ig.ig_steps == 40
    top = np.unravel_index(np.argmax(ig.exact), ig.exact.shape)
    assert abs(ig.estimate[top] - ig.exact[top]) < abs(grad.estimate[top] - grad.exact[top])


def test_attribution_methods_are_checked():
    with pytest.raises(AnalysisError, match="--method"):
        attribute(None, None, method="atp-star")
