"""Direct logit attribution and the logit lens, checked against TransformerLens's own head stacking and final-norm
application item by item, against the model's logits (the parts sum to them), and against the threshold
organism's planted head weights."""
import numpy as np
import pytest
import torch

from surgeon import load_case
from surgeon.case.select import pick_items
from surgeon.analyses.logit_attribution import _rows, logit_attribution
from surgeon.errors import AnalysisError
from surgeon.organisms import ground_truth
from tests.conftest import ROOT


def _case(name):
    return load_case(f"{ROOT}/cases/{name}.py")


def _tl_heads(case, model, fmt):
    """Per item, TransformerLens's `stack_head_results(apply_ln=True)` at the scored position, dotted with the
    final norm's weight times the unembedding difference: [items, layers, heads]."""
    _, items = pick_items(case, None)
    out = []
    for row in _rows(case, model, fmt, items)[0]:
        pos, good, bad = row.targets[0][0], row.targets[0][1], row.targets[1][1]
        _, cache = model.run_with_cache(torch.tensor([row.tokens]))
        norm = model.cfg.normalization_type is not None
        stack = cache.stack_head_results(layer=-1, pos_slice=pos, apply_ln=norm)[:, 0]
        w = model.ln_final.w if norm else torch.ones(model.cfg.d_model)
        out.append((stack @ (w * (model.W_U[:, good] - model.W_U[:, bad]))).detach().numpy())
    return np.stack(out).reshape(len(out), model.cfg.n_layers, model.cfg.n_heads)


@pytest.mark.slow
@pytest.mark.parametrize("name,model", [("decimal_organism", "decimal_model"), ("induction_organism", "induction_model"),
                                        ("threshold_organism", "threshold_model")])
def test_heads_equal_transformer_lens_and_the_parts_sum_to_the_logits(name, model, request):
    """RMSNorm with grouped-query attention (decimal), LayerNorm (induction), no norm (threshold)."""
    model = request.getfixturevalue(model)
    case = _case(name)
    r = logit_attribution(case, model, batch_size=16)  # several batches
    for f in r.formats:
        want = _tl_heads(case, model, f.format).mean(0)
        np.testing.assert_allclose(f.heads[..., 0], want, atol=2e-5 * max(1.0, np.abs(want).max()))
        assert f.max_residual < 1e-4 * max(1.0, abs(f.logit_diff[0]))  # parts sum to the model's logit difference
        assert f.lens[-1, 0] == pytest.approx(f.logit_diff[0], abs=1e-4)  # the last lens is the output
        assert all(lo <= m <= hi for m, lo, hi in f.heads.reshape(-1, 3))
    for bad, diff in r.head_difference.items():
        b = next(f for f in r.formats if f.format == bad)
        np.testing.assert_allclose(diff[..., 0], b.heads[..., 0] - r.formats[0].heads[..., 0], atol=1e-9)


@pytest.mark.slow
def test_the_threshold_organism_heads_write_their_planted_weights(threshold_model):
    """Built by construction: in each format an even head writes toward the answer in proportion to its planted
    weight (one factor for all heads), an odd head writes nothing the answer reads."""
    r = logit_attribution(_case("threshold_organism"), threshold_model)
    weights = ground_truth("threshold")["weights"]
    w = np.array([weights[f"a0.h{h}"] for h in range(0, 32, 2)], float)
    for f in r.formats:
        even, odd = f.heads[0, 0::2, 0], f.heads[0, 1::2, 0]
        ratio = even / w
        assert np.ptp(ratio) < 1e-3 * abs(ratio.mean()) and abs(ratio.mean()) > 0.1, ratio
        assert np.abs(odd).max() < 1e-4
        assert np.sign(ratio.mean()) == (1 if f.role == "good" else -1)


@pytest.mark.slow
def test_answers_without_a_differing_token_are_refused(threshold_model):
    from surgeon import Item

    case = _case("threshold_organism")
    case = type(case)(**{**case.__dict__, "items": [Item(dict(case.items[0].values), correct=" 1", incorrect=" 12")]})
    with pytest.raises(AnalysisError, match="first token where the answers differ"):
        logit_attribution(case, threshold_model)


@pytest.mark.slow
@pytest.mark.parametrize("name,model", [("decimal_organism", "decimal_model"), ("induction_organism", "induction_model")])
def test_transformer_lens_conventions_under_each_option(name, model, request):
    """`value_biases="folded"`: the heads equal TransformerLens's `stack_head_results` on the same weights with its
    `fold_value_biases` applied; `lens_bias="excluded"`: the lens equals TransformerLens's logit lens
    (`accumulated_resid(apply_ln=True)` @ the unembedding difference, no b_U). Both conventions move the numbers
    (the organisms' value and unembedding biases are not zero), and the parts still sum to the logits."""
    import copy

    model = request.getfixturevalue(model)
    case = _case(name)
    raw = logit_attribution(case, model)
    tl = logit_attribution(case, model, value_biases="folded", lens_bias="excluded")
    assert tl.options["value_biases"] == "folded" and "folded into the attention bias" in str(tl)
    folded = copy.deepcopy(model)
    folded.load_state_dict(folded.fold_value_biases(folded.state_dict()))
    _, items = pick_items(case, None)
    for f_raw, f_tl in zip(raw.formats, tl.formats):
        want = _tl_heads(case, folded, f_tl.format).mean(0)
        np.testing.assert_allclose(f_tl.heads[..., 0], want, atol=2e-5 * max(1.0, np.abs(want).max()))
        assert np.abs(f_tl.heads[..., 0] - f_raw.heads[..., 0]).max() > 1e-3  # the convention matters here
        assert f_tl.max_residual < 1e-4 * max(1.0, abs(f_tl.logit_diff[0]))
        lens = []
        for row in _rows(case, model, f_tl.format, items)[0]:
            pos, good, bad = row.targets[0][0], row.targets[0][1], row.targets[1][1]
            _, cache = model.run_with_cache(torch.tensor([row.tokens]))
            stack = cache.accumulated_resid(layer=-1, incl_mid=False, pos_slice=pos, apply_ln=True)[:, 0]
            lens.append((stack[1:] @ (model.W_U[:, good] - model.W_U[:, bad])).detach().numpy())
        np.testing.assert_allclose(f_tl.lens[:, 0], np.mean(lens, 0), atol=1e-4)
        assert np.abs(f_tl.lens[:, 0] - f_raw.lens[:, 0]).max() > 1e-4
