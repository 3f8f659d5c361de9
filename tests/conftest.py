import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def charset():
    from surgeon.organisms.charset import build_tokenizer

    return build_tokenizer()


def tiny_model(tok, **over):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = dict(n_layers=3, d_model=32, n_heads=4, d_head=8, n_ctx=64, d_vocab=len(tok), act_fn="gelu",
               normalization_type="LN", seed=0)
    cfg.update(over)
    torch.manual_seed(0)
    m = HookedTransformer(HookedTransformerConfig(**cfg), tokenizer=tok)
    m.eval()
    return m


# random HookedTransformers of several architectures (standard LN + learned positions; GQA + rotary + RMS)
ARCHS = {
    "gpt2like": dict(),
    "llamalike_gqa": dict(normalization_type="RMS", positional_embedding_type="rotary", n_key_value_heads=2,
                          act_fn="silu", gated_mlp=True, rotary_dim=8),
}


@pytest.fixture(scope="session", params=sorted(ARCHS))
def random_model(request, charset):
    return tiny_model(charset, **ARCHS[request.param])


@pytest.fixture(scope="session")
def decimal_model():
    from surgeon.models.loading import load_model

    return load_model("organism:decimal")


@pytest.fixture(scope="session")
def threshold_model():
    from surgeon.models.loading import load_model

    return load_model("organism:threshold")


@pytest.fixture(scope="session")
def induction_model():
    from surgeon.models.loading import load_model

    return load_model("organism:induction")


@pytest.fixture(scope="session")
def decimal_case():
    from surgeon import load_case

    return load_case(os.path.join(ROOT, "cases", "decimal_organism.py"))
