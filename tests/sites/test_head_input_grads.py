"""The layer-norm Jacobians the edge gradients use, against autograd through TransformerLens's own modules."""
import pytest
import torch
from transformer_lens import HookedTransformerConfig
from transformer_lens.components import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre

from surgeon.sites.head_input_grads import norm_vjp, uniform_values
from surgeon.sites.edges import EdgeSite


@pytest.mark.parametrize("cls", [LayerNorm, LayerNormPre, RMSNorm, RMSNormPre])
def test_norm_vjp_equals_autograd_through_the_module(cls):
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=8, d_head=4, n_heads=4, act_fn="relu", d_vocab=10)
    norm = cls(cfg)
    if hasattr(norm, "w"):
        with torch.no_grad():
            norm.w.copy_(torch.randn(16))
    g0 = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, generator=g0) * 3 + 1
    g = torch.randn(2, 3, 5, 16, generator=g0)  # five units' gradients at one input
    ours = norm_vjp(norm, x[:, :, None], g)
    for u in range(5):
        xl = x.clone().requires_grad_(True)
        (norm(xl) * g[:, :, u]).sum().backward()
        torch.testing.assert_close(ours[:, :, u], xl.grad, atol=1e-5, rtol=1e-5)


def test_uniform_values_only_where_every_senders_edges_agree():
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=2, act_fn="relu", d_vocab=10)
    site = EdgeSite.of(cfg)
    sender = site.graph.sender_of
    per_sender = torch.tensor([[0.0, 0.25, 0.5, 0.75, 1.0, 0.1, 0.2]])[:, : len(site.senders)]
    m = per_sender[:, sender]
    torch.testing.assert_close(uniform_values(site.graph, m), per_sender)
    m[0, 5] += 0.01  # one edge off its sender's value
    assert uniform_values(site.graph, m) is None
