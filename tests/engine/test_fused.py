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


def _frozen_gated(random_model, dtype=torch.float32):
    import copy

    model = copy.deepcopy(random_model).to(dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _saved_weight_copies(model, run) -> tuple[int, int]:
    """(saved tensors shaped like a weight matrix, how many of them are not a parameter itself) over `run()`'s
    forward, as autograd keeps them for the backward pass."""
    params = {p.data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2} | {
        tuple(p.shape[::-1]) for p in model.parameters() if p.dim() == 2}
    seen = []

    def pack(t):
        if tuple(t.shape) in shapes:
            seen.append(t.data_ptr() in params)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return len(seen), sum(not s for s in seen)


def test_gated_mlps_keep_no_copy_of_their_weights_for_the_backward_pass(random_model):
    """TransformerLens's GatedMLP (Llama, Qwen2, Gemma) computes x @ W as F.linear(x, W.T.contiguous()), and autograd
    keeps that transposed copy for the backward pass: a second copy of the MLP weights from the forward to the
    backward. Under the engine's kernels the weights themselves are kept, the forward is the same numbers and the
    gradient of the input the same as TransformerLens's own."""
    if random_model.cfg.gated_mlp is not True:
        return
    model = _frozen_gated(random_model)
    mlp = model.blocks[0].mlp
    x0 = torch.randn(3, 6, model.cfg.d_model, generator=torch.Generator().manual_seed(4), dtype=torch.float64).float()
    outs, grads, copies = [], [], []
    for engine in (False, True):
        x = x0.clone().requires_grad_(True)
        with fused_activations(model) if engine else torch.enable_grad():
            y = []
            copies.append(_saved_weight_copies(model, lambda: y.append(mlp(x))))
        (y[0] * torch.linspace(-1, 1, y[0].shape[-1])).sum().backward()
        outs.append(y[0].detach())
        grads.append(x.grad)
    assert copies[0][1] == 3  # TransformerLens's own: W_gate, W_in and W_out copied and kept
    assert copies[1] == (3, 0)  # the engine's: the three weights kept as they are, no copy
    torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-6)
    assert "forward" not in vars(mlp)


def test_a_bf16_gated_mlp_gives_transformer_lens_own_numbers_bit_for_bit(random_model):
    """The forward runs TransformerLens's kernel on the same operands: in bfloat16, where the accumulation order
    changes the rounding, the outputs are equal, not close."""
    if random_model.cfg.gated_mlp is not True:
        return
    model = _frozen_gated(random_model, torch.bfloat16)
    toks = torch.randint(0, model.cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        own = model(toks)
        with fused_activations(model):
            assert "forward" in vars(model.blocks[0].mlp)
            mine = model(toks)
    assert torch.equal(mine, own)


def test_the_last_mlp_at_its_read_positions_on_top_of_the_engines_gated_mlp(random_model):
    """Both replacements at once (as the engine's forward enters them): the last MLP runs at the read positions only,
    through the engine's gated forward, and each is undone in turn."""
    from surgeon.engine.kernels import last_mlp_at

    model = _frozen_gated(random_model)
    mlp = model.blocks[-1].mlp
    x = torch.randn(2, 5, model.cfg.d_model, generator=torch.Generator().manual_seed(6))
    read = torch.tensor([[4], [1]])
    with torch.no_grad():
        own = mlp(x)
        with fused_activations(model):
            engine_forward = vars(mlp).get("forward")
            with last_mlp_at(model, read, copies=1):
                out = mlp(x)
            assert vars(mlp).get("forward") is engine_forward
    rows, pos = torch.arange(2), torch.tensor([4, 1])
    torch.testing.assert_close(out[rows, pos], own[rows, pos], atol=1e-6, rtol=1e-6)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[rows, pos] = False
    assert out[mask].abs().max() == 0
    assert "forward" not in vars(mlp)
