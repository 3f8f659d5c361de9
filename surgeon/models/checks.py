"""A case checked against its model: layers in range, answers that tokenize, chat templates. Only the
model's config and tokenizer are read (no weights), so bad input is refused before any work."""
from __future__ import annotations

import re

from pathlib import Path
from types import SimpleNamespace

from surgeon.causal import check_attention
from surgeon.errors import CaseError, ModelError
from surgeon.models.bridge import BridgeModel
from surgeon.models.protocol import NEEDS, missing
from surgeon.models.loading import (
    ModelShape,
    check_finite,
    load_tokenizer,
    not_found,
    resolve,
    shape,
    tl_config,
)
from surgeon.sites.nodes import COMPONENTS
from surgeon.case.case import Case, Chat, origin
from surgeon.case.reading import read_case
from surgeon.case.shipped import CASES_DIR


def load_case(path: str | Path, check_model: bool = True, model: str | None = None) -> Case:
    """Run a case file and validate it (and, with `check_model`, against its model's config and tokenizer).

    `model` replaces the case's model (e.g. a local checkpoint directory of the same architecture)."""
    case = read_case(path, model=model)
    if check_model and case.model is not None:  # a case without a model is checked when one is given
        check_case_against_model(case)
    return case


def check_case_against_model(case, model=None) -> None:
    """Model-dependent checks of a case: layers in range, answers that tokenize, chat templates; against the
    case's model (its config and tokenizer only), or `model`, a HookedTransformer in memory."""
    where = origin(case)
    if model is not None:
        check_attention(model, where)
        check_finite(model, where)
        c = model.cfg
        shp = ModelShape(c.n_layers, c.n_heads, getattr(c, "n_key_value_heads", None) or c.n_heads, c.d_model,
                         bool(c.attn_only), c.n_ctx, c.d_vocab)
        tok = model.tokenizer
        if tok is None:
            raise CaseError("the model in memory has no tokenizer", where=where, field="model",
                            fix="pass (model, tokenizer), or build it as HookedTransformer(cfg, tokenizer=tok)")
        organism = str(getattr(tok, "name_or_path", "")).startswith("surgeon-organism-")
    else:
        if case.model is None:
            raise CaseError("the case names no model, and none was given", where=where, field="model",
                            fix="add model=... to the case, run with --model (organism:NAME, a checkpoint directory, "
                                "a Hugging Face name), or pass model= in Python")
        try:
            ref = resolve(case.model)
            shp = shape(ref)
            if ref.kind == "tl":  # a TransformerLens folder says its attention in its config: refused before its weights
                check_attention(SimpleNamespace(cfg=SimpleNamespace(**tl_config(ref.path))), str(ref.path))
            tok = load_tokenizer(ref)
        except ModelError as e:
            if ("neither an organism" in e.message and case.source and Path(case.source).is_file()
                    and Path(case.source).resolve().parent != CASES_DIR.resolve()):
                near = not_found(case.model, Path(case.source).resolve().parent)  # also the case file's own folder
                if "did you mean" in near.message:  # it adds a folder to try; else the message of every route
                    e = near
            raise CaseError(e.message, where=where, field="model", fix=e.fix) from None
        organism = ref.kind == "organism"
    for L in case.layers or ():
        if not 0 <= L < shp.n_layers:
            raise CaseError(f"layer {L} is out of range: the model has layers 0..{shp.n_layers - 1}", where=where,
                            field="layers", fix=f"use layers between 0 and {shp.n_layers - 1}")
    for c in case.components:
        if COMPONENTS[c].name == "mlp_out" and shp.attn_only:
            raise CaseError("the model is attention-only and has no MLP", where=where, field="components",
                            fix="drop mlp_out from components")
    unk = getattr(tok, "unk_token_id", None)
    for i, it, label in _all_items(case):
        for ans in ("correct", "incorrect"):
            for text in it.answers(ans):
                ids = tok(text, add_special_tokens=False)["input_ids"]
                if not ids:
                    raise CaseError(f"answer {text!r} tokenizes to nothing", where=where,
                                    field=f"{label}[{i}].{ans}", fix="give an answer with visible text, e.g. \" 9.8\"")
                if unk is not None and organism and unk in ids:
                    raise CaseError(f"answer {text!r} has characters the organism does not know", where=where,
                                    field=f"{label}[{i}].{ans}", fix="use printable ASCII characters")
    if unk is not None and organism:
        for i, it, label in _all_items(case):
            for k, v in it.values.items():
                if unk in tok(v, add_special_tokens=False)["input_ids"]:
                    raise CaseError(f"value {v!r} has characters the organism does not know (they would read as "
                                    "<unk>)", where=where, field=f"{label}[{i}].values[{k!r}]",
                                    fix="use printable ASCII characters")
        for name, fmt in case.formats.items():
            text = fmt.user if isinstance(fmt, Chat) else fmt
            if unk in tok(text, add_special_tokens=False)["input_ids"]:
                raise CaseError("the template has characters the organism does not know (they would read as <unk>)",
                                where=where, field=f"formats[{name!r}]", fix="use printable ASCII characters")
    for i, text in enumerate(case.neutral or ()):  # a repair's side effects are measured on them: they must read
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if unk is not None and organism and unk in ids:
            raise CaseError(f"neutral text {text[:30]!r} has characters the organism does not know (they would read "
                            "as <unk>, and the KL on them says nothing)", where=where, field=f"neutral[{i}]",
                            fix="use printable ASCII characters")
        if shp.n_ctx is not None and len(ids) + 1 > shp.n_ctx:
            raise CaseError(f"neutral text {text[:30]!r} is {len(ids)} tokens, past the model's context of "
                            f"{shp.n_ctx}", where=where, field=f"neutral[{i}]",
                            fix=f"shorten it to at most {shp.n_ctx - 1} tokens, or split it in two")
    if case.answer_end == "eos" and tok.eos_token_id is None:
        raise CaseError("answer_end='eos', but the model's tokenizer has no end-of-sequence token", where=where,
                        field="answer_end", fix='end answers with text instead, e.g. answer_end="\\n"')
    if case.align == "index":
        _check_equal_lengths(case, tok, where)
    _warn_answer_traps(case, tok, where)
    _warn_first_token(case, tok, where)
    for name, fmt in case.formats.items():
        if isinstance(fmt, Chat) and not getattr(tok, "chat_template", None):
            raise CaseError(f"format {name!r} asks for the chat template, but the tokenizer has none", where=where,
                            field=f"formats[{name!r}]", fix="write the format out as a plain template string")
    _check_per_position(case, tok, where)
    _check_rows(case, tok, shp.n_ctx, shp.d_vocab, where)
    if case.reference:
        _check_reference_reach(case, tok, where)


def check_runnable(model) -> None:
    """Refuse a model the engine cannot run, naming what it lacks: every need of `surgeon.models.protocol.NEEDS` that
    applies to its config and that it does not meet. Two classes run: a HookedTransformer, and a TransformerBridge
    through `surgeon.models.bridge.BridgeModel` (which supplies what TransformerLens 3.9's bridge lacks) when it meets
    every need (`boot_native`'s bridges lack the per-head query/key/value inputs). Any other class is refused even
    when it meets every need: surgeon's numbers on it have not been checked equal to a HookedTransformer's
    (tests/models/test_bridge_numbers.py checks the bridge's). docs/install.md says which TransformerLens works with
    what."""
    classes = [c.__name__ for c in type(model).__mro__]
    if "HookedTransformer" in classes:
        return
    lacks = missing(model)
    if isinstance(model, BridgeModel) and not lacks:
        return
    fix = ("load the model as a HookedTransformer (surgeon.load_model(NAME_OR_DIR), or "
           "HookedTransformer.from_pretrained with transformer-lens>=3.9,<4)")
    bridge = isinstance(model, BridgeModel) or "TransformerBridge" in classes
    name = "a TransformerLens TransformerBridge" if bridge else f"a {type(model).__name__}"
    if lacks:
        said = "; ".join(f"{n.path} ({n.why})" for n in lacks[:8]) + (f"; and {len(lacks) - 8} more" if len(lacks) > 8
                                                                      else "")
        raise ModelError(f"the model is {name}, which surgeon cannot run yet: it lacks {len(lacks)} of the "
                         f"{sum(not n.speedup for n in NEEDS)} things surgeon needs from a model "
                         f"(surgeon/models/protocol.py): {said}",
                         field="model", fix=fix)
    raise ModelError(f"the model is {name}: it has every part surgeon needs from a model, but surgeon's numbers on it "
                     "have not been checked equal to a HookedTransformer's holding the same weights", field="model",
                     fix=fix)


def check_bare(model) -> None:
    """Refuse a model that carries forward or backward hooks surgeon did not install (inside ``with surgeon.apply(...)``,
    or a user's own): every analysis would measure the hooked model while saying it measured the model."""
    hooked = [name for name, hp in getattr(model, "hook_dict", {}).items()
              if getattr(hp, "_forward_hooks", None) or getattr(hp, "_backward_hooks", None)]
    if hooked:
        raise ModelError(f"the model carries hooks surgeon did not install ({len(hooked)} hook point(s), e.g. "
                         f"{hooked[0]}), e.g. inside `with surgeon.apply(model, repair)`; surgeon's numbers would be "
                         "the hooked model's, labelled as the model's", field="model",
                         fix="run analyses outside the `with` block (remove the hooks: model.reset_hooks()); to measure "
                             "a repair, use surgeon.repair(...) or surgeon.measure_repair(repair, case)")


def _all_items(case):
    """(index, item, field) for the case's items and then its reference items (mean ablation's)."""
    yield from ((i, it, "items") for i, it in enumerate(case.items))
    yield from ((i, it, "reference") for i, it in enumerate(case.reference or ()))


def _check_reference_reach(case, tok, where: str) -> None:
    """Mean ablation with reference items takes, at each position of the analysed rows, the mean over the reference
    items that reach that position (EAP-IG's per-position mean over a reference set). A position no reference item
    reaches would have no mean (it was patched with zero): refused here, in every format, before any weight loads."""
    from surgeon.case.encoding import encode_rows

    bos = case.prepend_bos is not False
    for name, fmt in case.formats.items():
        try:
            need = max(len(r.tokens) for r in encode_rows(fmt, case.items, tok, bos, case.score, case.answer_end,
                                                          case.combine))
            have = max(len(r.tokens) for r in encode_rows(fmt, case.reference, tok, bos, case.score, case.answer_end,
                                                          case.combine))
        except CaseError:
            continue  # reported by the checks that own it
        if have < need:
            raise CaseError(f"in format {name!r} the analysed items' rows are up to {need} tokens long, but the "
                            f"longest reference item's is {have}: mean ablation would have no mean at the last "
                            f"{need - have} positions", where=where, field="reference",
                            fix="give reference items at least as long as the longest analysed item (values and "
                                "answers), or leave reference out (the mean over the analysed items)")


def _check_per_position(case, tok, where: str) -> None:
    """Items scored per position: one token per answer, positions inside the prompt, placeholders of the right
    length, in every format (as `encode_rows` builds them)."""
    from surgeon.case.encoding import encode_prompt, positions_row

    bos = case.prepend_bos is not False
    for name, fmt in case.formats.items():
        for i, it in enumerate(case.items):
            if it.per_position:
                try:
                    positions_row(i, it, *encode_prompt(fmt, it.values, tok, bos), tok, case.combine)
                except CaseError as e:
                    raise CaseError(f"{e.message} (format {name!r})", where=where, field=e.field, fix=e.fix) from None


def _check_rows(case, tok, n_ctx: int | None, d_vocab: int | None, where: str) -> None:
    """Every row the model is fed must fit in its context (the prompt and the answer's tokens up to the last one,
    which is only predicted, as `encode_rows` builds them, in every format), and every token id, answers included,
    must be one the model's embedding holds."""
    from surgeon.case.encoding import encode_rows

    bos = case.prepend_bos is not False
    for name, fmt in case.formats.items():
        for i, it, label in _all_items(case):
            try:
                rows = encode_rows(fmt, [it], tok, bos, case.score, case.answer_end, case.combine)
            except CaseError as e:  # what the checks above do not own (e.g. first_token answers one a prefix of the
                # other): refused here, before any weight loads, as the encoder would refuse it after
                what = re.sub(r"^item \d+: ", "", e.message)
                raise CaseError(f"{label}[{i}]: {what}", where=where, field=e.field or f"{label}[{i}]",
                                fix=e.fix) from None
            top = max(max([*r.tokens, *(t[1] for t in r.targets)]) for r in rows)
            if d_vocab and top >= d_vocab:
                raise CaseError(f"{label}[{i}] in format {name!r} has token id {top}, but the model's vocabulary holds "
                                f"ids 0..{d_vocab - 1}: the tokenizer is not the model's", where=where, field="model",
                                fix="use the tokenizer the model was trained with (its ids must fit the embedding)")
            n = max(len(r.tokens) for r in rows)
            if n_ctx and n > n_ctx:
                prompt = rows[0].n_prompt
                raise CaseError(f"{label}[{i}] in format {name!r} feeds the model {n} tokens ({prompt} of prompt, "
                                f"{n - prompt} of answer), longer than the model's context of {n_ctx}", where=where,
                                field=f"{label}[{i}]", fix="shorten the item's values or the template, or its answers")


def _check_equal_lengths(case, tok, where: str) -> None:
    """align="index" matches position i to i: every item's prompt must be as long in every format."""
    from surgeon.case.encoding import encode_prompt

    bos = case.prepend_bos is not False
    for i, it in enumerate(case.items):
        lengths = {name: len(encode_prompt(fmt, it.values, tok, bos)[0]) for name, fmt in case.formats.items()}
        if len(set(lengths.values())) > 1:
            shown = ", ".join(f"{n!r} {k}" for n, k in lengths.items())
            raise CaseError(f"align='index' needs prompts of equal length, but items[{i}] has {shown} tokens",
                            where=where, field="align",
                            fix="use align='last' or align='anchors' for formats of different length")


def _warn_first_token(case, tok, where: str) -> None:
    """Warn when the formats do not start alike: one starts with BOS (or another special token) and another does not,
    or with a different one. surgeon prepends BOS to plain formats but not to a `Chat` format (the model's chat
    template writes its own, or none); a model trained with BOS first can fail in a format for that alone."""
    from surgeon.errors import warn
    from surgeon.case.encoding import encode_prompt

    if not case.items or any(isinstance(f, Chat) for f in case.formats.values()) and not getattr(tok, "chat_template",
                                                                                                 None):
        return  # refused elsewhere
    special = set(getattr(tok, "all_special_ids", None) or ())
    bos = case.prepend_bos is not False
    first = {}
    for name, fmt in case.formats.items():
        try:
            ids = encode_prompt(fmt, case.items[0].values, tok, bos)[0]
        except Exception:  # noqa: BLE001 - reported by the checks that own it
            return
        first[name] = ids[0] if ids and ids[0] in special else None
    if len(set(first.values())) > 1:
        show = lambda i: "no special token" if i is None else repr(tok.convert_ids_to_tokens(int(i)))  # noqa: E731
        (a, x), (b, y) = next(((a, x), (b, y)) for a, x in first.items() for b, y in first.items() if x != y)
        chat = [n for n, f in case.formats.items() if isinstance(f, Chat)]
        warn(f"{where}: formats {a!r} and {b!r} do not start alike: {a!r} starts with {show(x)}, {b!r} with {show(y)}"
             + (f" (surgeon prepends BOS to plain formats, not to the Chat format {chat[0]!r}: its chat template writes "
                "its own BOS or none)" if chat else "")
             + ". A model trained with BOS first can fail in a format for that alone. Fix: add {{ bos_token }} to "
               "the chat template (or write the format out as a plain template), or set prepend_bos=False in the case "
               "if no format should start with BOS; `surgeon encode` shows the tokens.")


def _warn_answer_traps(case, tok, where: str) -> None:
    """Warn (once each) about answers that silently change what is scored: no leading space after a prompt
    that ends in a word or punctuation, and one answer a prefix of the other."""
    from surgeon.errors import warn
    from surgeon.case.case import Chat

    plain_ends = [f for f in case.formats.values() if not isinstance(f, Chat) and f and not f[-1].isspace()]
    text = [it for it in case.items if not it.per_position]  # per-position answers are token texts, read as given
    bare = [i for i, it in enumerate(text) if not it.correct[:1].isspace() and not it.incorrect[:1].isspace()]
    if plain_ends and bare and len(bare) == len(text):
        a = text[0].correct
        spaced, plain = (tok(x, add_special_tokens=False)["input_ids"] for x in (" " + a, a))
        it = text[0]
        quoted = [k for ans in (it.correct, it.incorrect) for k, v in it.values.items() if v == ans]
        spaced_in_prompt = len(quoted) == 2 and all(" {" + k + "}" in f or " {" + k + ":" in f
                                                    for k in quoted for f in plain_ends)
        # warn where the tokenizer merges the space into the word, or the answers are options the prompt
        # itself writes after a space
        if (len(spaced) == len(plain) and spaced != plain) or spaced_in_prompt:
            warn(f"{where}: answers start without a space (e.g. {a!r}) after prompts that end in "
                 f"{plain_ends[0][-1]!r}; the tokenizer reads {' ' + a!r} and {a!r} as different tokens, and a model "
                 "usually continues with the spaced one. Write answers as the model would continue the prompt.")
    pre = [i for i, it in enumerate(case.items) if not it.per_position and (
        it.correct.startswith(it.incorrect) or it.incorrect.startswith(it.correct))]
    if pre and case.score == "sequence" and case.answer_end is None:
        it = case.items[pre[0]]
        warn(f"{where}: in {len(pre)} item(s), e.g. items[{pre[0]}] ({it.correct!r} / {it.incorrect!r}), one answer is "
             "a prefix of the other: the shorter one is scored by its own tokens, not by ending there, so it can "
             "rarely win. Score where each answer ends: answer_end=\"eos\" in the case (or a text, e.g. \"\\n\").")
