"""The model protocol (`surgeon.models.protocol.NEEDS`) is what surgeon reaches on a model, read from surgeon's own
sources by this test's own scanner (not by the module it checks): every attribute path from a model (`model`,
`self.model`, a name assigned from them, a `cfg`), every hook name written in a string, and every keyword a model
method is called with. A path the code uses and NEEDS does not declare fails, and so does a need nothing uses.
Then `missing` on real models: none on every organism (HookedTransformer, the class the needs are written against);
on TransformerLens's own TransformerBridge, start_at_layer among what is missing, checked on the bridge itself."""
import ast
import fnmatch
import re
from pathlib import Path

import pytest
import torch

from surgeon.models.protocol import NEEDS, missing

SRC = Path(__file__).resolve().parents[2] / "surgeon"
# builders of models (the implementation side) and this declaration itself
OUTSIDE = ("organisms", "loading.py", "protocol.py")
HOOK = re.compile(r"^(?:blocks\.(?:\{[^}]*\}|\d+)\.)?(?:[a-z0-9_]+\.)*(?:hook_[a-z_]+|[a-z0-9_]+:pre)$")
TOP = ("ln_final.", "unembed.", "hook_embed", "hook_pos_embed")  # hook names outside the blocks


def _chain(node):
    """(root name, [attribute parts]) of an attribute/subscript/getattr chain, or None."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            parts.append("[]")
            node = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            parts.append(node.args[1].value)
            node = node.args[0]
        else:
            break
    if not isinstance(node, ast.Name):
        return None
    parts.reverse()
    if any(p.startswith("__") for p in parts):  # Python's object model (__dict__, __name__), not the model's: cut there
        parts = parts[:min(i for i, p in enumerate(parts) if p.startswith("__"))]
    if node.id == "self" and parts[:1] == ["model"]:
        return "model", parts[1:]
    if node.id == "model" and parts[:1] == ["[]"]:  # a (model, tokenizer) pair given to the API (surgeon/api.py)
        return "model", parts[1:]
    return node.id, parts


def _join(parts) -> str:
    return ".".join(parts).replace(".[]", "[]")


def _sources():
    for f in sorted(SRC.rglob("*.py")):
        if not any(o in f.parts or f.name == o for o in OUTSIDE):
            yield f, ast.parse(f.read_text())


def used_paths() -> dict[str, set[str]]:
    """{path: files} of every attribute path reached from a model or a config in surgeon's consumers."""
    out: dict[str, set[str]] = {}
    for f, tree in _sources():
        alias = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                c = _chain(node.value)
                if c and c[0] == "model" and c[1]:
                    alias[node.targets[0].id] = c[1]
        for node in ast.walk(tree):
            c = _chain(node) if isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)) else None
            if not c or not c[1]:
                continue
            root, parts = c
            if root == "cfg":
                if parts[0] in ("[]", "get", "items"):  # a shape dict (circuit files), not a model's config
                    continue
                path = ["cfg", *parts]
            elif root == "model":
                path = parts
            elif root in alias:
                path = alias[root] + parts
            else:
                continue
            if path:
                out.setdefault(_join(path), set()).add(f.name)
    return out


def _pattern_uses() -> list[tuple[str, set[str]]]:
    """(pattern, the file's string constants) for each hook name built from a variable: a declared hook matching the
    pattern counts as used when what fills the * is among the constants of that file (`["rot_q", "rot_k"]`, or one
    letter of a short string iterated: `for x in "kv"`)."""
    out = []
    for _, tree in _sources():
        consts = {c.value for c in ast.walk(tree) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{x}" for v in node.values)
                if re.match(r"^(?:blocks\.\{x\}\.)?(?:[a-z0-9_]+\.)*hook_\{x\}$", text):
                    out.append((re.sub(r"^blocks\.\{x\}\.", "blocks.{i}.", text).replace("{x}", "*"), consts))
    return out


def _used_through_pattern(hook: str) -> bool:
    for pattern, consts in _pattern_uses():
        if fnmatch.fnmatch(hook, pattern):
            fill = hook[len(pattern) - 1:]
            if fill in consts or (len(fill) == 1 and any(fill in c for c in consts if 0 < len(c) <= 4)):
                return True
    return False


def used_hooks() -> set[str]:
    """Every hook name written in a string constant or an f-string, the layer written {i}; a name built from a variable
    (f"blocks.{L}.attn.hook_{kind}") is kept as a pattern with * (`test_every_hook_and_call_is_declared` asks that a
    declared hook match it; which values the variable takes, a scanner cannot know)."""
    out = set()
    for _, tree in _sources():
        names = {id(c.args[1]) for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                 and c.func.id in ("hasattr", "getattr") and len(c.args) > 1}  # attribute names, not hook names
        for node in ast.walk(tree):
            if id(node) in names:
                continue
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{x}" for v in node.values)
                if re.match(r"^(?:blocks\.\{x\}\.)?(?:[a-z0-9_]+\.)*hook_\{x\}$", text):
                    out.add(re.sub(r"^blocks\.\{x\}\.", "blocks.{i}.", text).replace("{x}", "*"))
                    continue
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if HOOK.match(text) and text not in ("hook_name", "hook_dict") and not text.startswith("use_hook"):
                if not text.startswith(("blocks.", *TOP)):  # a block's hook named within the block (attn.hook_q)
                    text = "blocks.{i}." + text
                out.add(re.sub(r"^blocks\.(?:\{[^}]*\}|\d+)\.", "blocks.{i}.", text))
    return out


def used_calls() -> dict[str, set[str]]:
    """{method: keywords} of every call of the model (`model(...)` is `forward`)."""
    out: dict[str, set[str]] = {}
    for _, tree in _sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id == "model":
                name = "forward"
            elif (isinstance(fn, ast.Attribute) and _chain(fn.value) == ("model", [])
                  and not (isinstance(fn.value, ast.Attribute) and fn.value.attr.startswith("__"))):
                name = fn.attr
            else:
                continue
            out.setdefault(name, set()).update(k.arg for k in node.keywords if k.arg)
    return out


DECLARED = {n.path for n in NEEDS if n.kind in ("config", "attribute")} | {n.path.partition("(")[0] for n in NEEDS
                                                                         if n.kind == "call"}
CONTAINERS = {p for p in DECLARED if any(q.startswith(p + ".") or q.startswith(p + "[]") for q in DECLARED)}


def covered(path: str) -> bool:
    """Declared, or below a declared leaf (a tensor's, a tokenizer's or a hook point's own API)."""
    if path in DECLARED:
        return True
    return any(path.startswith(p + sep) for p in DECLARED - CONTAINERS for sep in (".", "["))


def test_every_path_surgeon_reaches_on_a_model_is_declared():
    undeclared = {p: sorted(fs) for p, fs in used_paths().items() if not covered(p)}
    assert not undeclared, f"declare these in surgeon/models/protocol.py NEEDS (path: files): {undeclared}"


def test_every_declared_need_is_used():
    paths, hooks, calls = used_paths(), used_hooks(), used_calls()
    unused = []
    for n in NEEDS:
        if n.kind in ("config", "attribute"):
            ok = n.path in paths
        elif n.kind == "hook":
            ok = n.path in hooks or _used_through_pattern(n.path)
        else:
            method, _, args = n.path.partition("(")
            ok = all(a.strip() in calls.get(method, ()) for a in args.rstrip(")").split(","))
        if not ok:
            unused.append(n.path)
    assert not unused, f"declared in NEEDS but used nowhere in surgeon: {unused}"


def test_every_hook_and_call_is_declared():
    hooks = {n.path for n in NEEDS if n.kind == "hook"}
    named = {h for h in used_hooks() if "*" not in h}
    assert named <= hooks, sorted(named - hooks)
    for pattern in used_hooks() - named:
        assert any(fnmatch.fnmatch(h, pattern) for h in hooks), pattern
    declared = {}
    for n in NEEDS:
        if n.kind == "call":
            method, _, args = n.path.partition("(")
            declared.setdefault(method, set()).update(a.strip() for a in args.rstrip(")").split(","))
    attrs = {n.path for n in NEEDS if n.kind == "attribute"}
    for method, kws in used_calls().items():
        assert method in declared or method in attrs, method
        assert kws <= declared.get(method, set()), (method, sorted(kws - declared.get(method, set())))


def test_the_scanner_sees_what_it_must():
    """The scanner is not vacuous: uses known to be in the engine are found (a scanner that found nothing would pass
    the declared-paths test)."""
    paths, hooks, calls = used_paths(), used_hooks(), used_calls()
    assert {"blocks[].attn.W_O", "cfg.n_layers", "unembed.W_U", "tokenizer"} <= set(paths)
    assert {"blocks.{i}.attn.hook_z", "blocks.{i}.hook_q_input", "blocks.{i}.ln1:pre"} <= hooks
    assert {"start_at_layer", "stop_at_layer", "past_kv_cache"} <= calls["forward"]


@pytest.mark.parametrize("name", ["decimal", "induction", "threshold", "chain", "sink"])
def test_every_organism_meets_every_need(name):
    from surgeon.models.loading import load_model

    model = load_model(f"organism:{name}")
    assert missing(model) == [] and missing(model, speedups=True) == []


def test_every_tiny_architecture_meets_every_need(random_model):
    """GPT-2, Llama (GQA, rotary, gated MLP) and the other layouts the suite builds: rotary and gated needs apply."""
    assert missing(random_model) == [] and missing(random_model, speedups=True) == []


def test_a_model_without_what_the_engine_needs_is_named_short_of_it():
    """Hand-made: an organism with its config short of n_ctx, its first q-input hook point unlisted, its first
    MLP-output hook point never firing (renamed where the cache keys it) and its forward refusing start_at_layer
    misses exactly those."""
    from surgeon.models.loading import load_model

    model = load_model("organism:decimal")

    class Short(type(model.cfg)):  # the config without the context length (a case's checks read it, a forward not)
        def __getattribute__(self, name):
            if name == "n_ctx":
                raise AttributeError(name)
            return super().__getattribute__(name)

    model.cfg.__class__ = Short
    del model.hook_dict["blocks.0.hook_q_input"]
    model.blocks[0].hook_mlp_out.name = "blocks.0.elsewhere"
    forward = model.forward

    def refusing(*args, start_at_layer=None, stop_at_layer=None, **kw):
        if start_at_layer is not None:
            raise NotImplementedError("start_at_layer")
        return forward(*args, stop_at_layer=stop_at_layer, **kw)

    model.forward = refusing
    assert sorted(n.path for n in missing(model)) == ["blocks.{i}.hook_mlp_out", "blocks.{i}.hook_q_input",
                                                      "cfg.n_ctx", "forward(start_at_layer, stop_at_layer)"]


def test_a_forward_that_returns_logits_at_the_last_layer_misses_start_at_layer():
    """Hand-made: an organism whose forward reads stop_at_layer=n_layers as "to the end" (the final norm and the
    unembedding applied: logits, not the residual stream the read-out expects) misses that need, and only it."""
    from surgeon.models.loading import load_model

    model = load_model("organism:decimal")
    forward, n = model.forward, model.cfg.n_layers

    def to_the_end(*args, stop_at_layer=None, **kw):
        return forward(*args, stop_at_layer=None if stop_at_layer == n else stop_at_layer, **kw)

    model.forward = to_the_end
    assert [x.path for x in missing(model)] == ["forward(start_at_layer, stop_at_layer)"]


def test_the_bridge_misses_start_at_layer_among_its_needs():
    bridge_module = pytest.importorskip("transformer_lens.model_bridge",
                                        reason="this TransformerLens has no TransformerBridge")
    bridge = bridge_module.TransformerBridge.boot_native(
        {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32, "d_vocab": 64, "n_ctx": 32,
         "act_fn": "gelu", "seed": 0})
    lacks = {n.path for n in missing(bridge)}
    assert not lacks & {n.path for n in missing(bridge, speedups=True)}
    try:  # the contract, checked on the bridge itself: the last block from a residual stream, to its residual stream
        runs = tuple(bridge(torch.zeros(1, 3, 16), start_at_layer=0, stop_at_layer=1).shape) == (1, 3, 16)
    except NotImplementedError:
        runs = False
    assert ("forward(start_at_layer, stop_at_layer)" in lacks) == (not runs)
