"""Attribution from mask gradients on the decimal organism (weights frozen, shared-prefix attention)."""
import numpy as np
import torch

from surgeon.analyses import attribute
from surgeon.analyses.common import make_contrast
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
