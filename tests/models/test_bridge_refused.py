"""A TransformerLens `TransformerBridge` that lacks part of surgeon's model protocol even through
`surgeon.models.bridge.BridgeModel` (one built by `boot_native`: its attention takes no per-head query/key/value
inputs, which edges into a head's query, key or value patch) is refused with one clear error naming what it lacks and
the fix, before any work. What BridgeModel supplies is checked missing on the bridge itself: when TransformerLens
implements `start_at_layer`, the first test fails and says that the adapter's own is no longer needed."""
import pytest
import torch

import surgeon
from surgeon.errors import ModelError
from surgeon.models.bridge import BridgeModel
from surgeon.models.protocol import missing

bridge_module = pytest.importorskip("transformer_lens.model_bridge", reason="this TransformerLens has no TransformerBridge")


@pytest.fixture(scope="module")
def bridge():
    return bridge_module.TransformerBridge.boot_native(
        {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32, "d_vocab": 64, "n_ctx": 32,
         "act_fn": "gelu", "seed": 0})


def test_the_bridge_lacks_start_at_layer(bridge):
    with pytest.raises(NotImplementedError, match="start_at_layer"):
        bridge(torch.zeros(1, 3, 16), start_at_layer=0)


@pytest.mark.parametrize("call", ["diagnose", "patch"])
def test_a_bridge_is_refused_with_what_it_lacks(bridge, call):
    with pytest.raises(ModelError) as e:
        getattr(surgeon, call)("decimal_organism", bridge)
    msg = str(e.value)
    assert "TransformerBridge" in msg and "hook_q_input" in msg and "field 'model'" in msg
    assert "start_at_layer" not in msg  # BridgeModel supplies it
    lacks = missing(BridgeModel(bridge))  # every need it misses is named, up to eight
    assert lacks and all(n.path in msg for n in lacks[:8]) and f"lacks {len(lacks)} of" in msg
    assert "HookedTransformer" in msg.split("fix:")[1]
