"""The fused kernels the engine runs TransformerLens's activations and norms with: the same numbers as
TransformerLens's own forward, its hook points still honoured, and the model restored afterwards."""
import torch

from surgeon.engine.contrast import fused_activations


def test_fused_forward_equals_transformer_lens_and_restores_the_model(random_model):
    toks = torch.randint(0, random_model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        own = random_model(toks)
        with fused_activations(random_model):
            fused = random_model(toks)
            assert any("forward" in vars(m) for m in random_model.modules())  # the norms were swapped
        after = random_model(toks)
    torch.testing.assert_close(fused, own, atol=2e-5, rtol=1e-5)
    assert torch.equal(after, own)
    assert not any("forward" in vars(m) for m in random_model.modules())


def test_a_hook_on_a_norms_scale_runs_transformer_lens_own_norm(random_model):
    toks = torch.randint(0, random_model.cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    name = "ln_final.hook_scale"
    with torch.no_grad():
        _, own = random_model.run_with_cache(toks, names_filter=[name])
        with fused_activations(random_model):
            _, fused = random_model.run_with_cache(toks, names_filter=[name])
    assert name in fused.cache_dict
    torch.testing.assert_close(fused[name], own[name])
