"""The fused kernels the engine runs TransformerLens's activations and norms with: the same numbers as
TransformerLens's own forward, its hook points still honoured, and the model restored afterwards."""
import torch

from surgeon.engine.kernels import fused_activations


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


def test_last_mlp_at_the_read_positions_only(random_model):
    from surgeon.engine.kernels import last_mlp_at

    mlp = random_model.blocks[-1].mlp
    x = torch.randn(4, 7, random_model.cfg.d_model, generator=torch.Generator().manual_seed(2))
    read = torch.tensor([[6], [3]])  # two rows, two copies of them: rows 0, 2 read 6; rows 1, 3 read 3
    with torch.no_grad():
        own = mlp(x)
        with last_mlp_at(random_model, read, copies=2):
            out = mlp(x)
            seen = []
            handle = mlp.hook_post.add_hook(lambda act, hook: seen.append(act.shape))  # a hook inside: full MLP
            full = mlp(x)
            random_model.reset_hooks()
    rows = torch.arange(4)
    pos = torch.tensor([6, 3, 6, 3])
    torch.testing.assert_close(out[rows, pos], own[rows, pos])
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[rows, pos] = False
    assert out[mask].abs().max() == 0  # nothing computed elsewhere
    assert seen and seen[0][:2] == (4, 7) and torch.equal(full, own)
    assert "forward" not in vars(mlp)
    del handle


def test_last_mlp_gradient_counts_a_position_read_twice_once(random_model):
    """Two targets read one position (the correct and the incorrect answer's first token): the gradient through
    the MLP there is the full model's, not twice it."""
    from surgeon.engine.kernels import last_mlp_at

    mlp = random_model.blocks[-1].mlp
    x0 = torch.randn(2, 5, random_model.cfg.d_model, generator=torch.Generator().manual_seed(3))
    read = torch.tensor([[4, 4], [2, 2]])
    grads = []
    for on in (True, False):
        x = x0.clone().requires_grad_(True)
        if on:
            with last_mlp_at(random_model, read, copies=1):
                out = mlp(x)
        else:
            out = mlp(x)
        out[torch.tensor([0, 1]), torch.tensor([4, 2])].sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1])
