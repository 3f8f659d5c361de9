"""Scoring methods are registered functions: the analyses reach every method through the registry, a new method is a
function and a registration (no branch to edit), and each method is planned for the memory it runs with."""
import numpy as np
import pytest

from surgeon.analyses import scoring
from surgeon.circuits.methods import ATTRIBUTION_METHODS, METHODS
from surgeon.errors import AnalysisError


def test_every_described_method_is_registered_and_nothing_else():
    assert list(scoring.EDGE_METHODS) == list(METHODS)
    assert list(scoring.UNIT_METHODS) == list(ATTRIBUTION_METHODS)
    with pytest.raises(ValueError, match="no description"):
        scoring.edge_method("undescribed", job=scoring._fixed_job)


def test_a_new_edge_method_runs_through_discover_without_a_new_branch(decimal_case, decimal_model, monkeypatch):
    """Register 'reversed-eap' (EAP's scores negated, a method no code names): `discover` ranks by |score| and
    verifies by exact patching, so it finds the circuit EAP finds, and its recorded scores are EAP's negated."""
    from surgeon.analyses.circuit import discover

    monkeypatch.setitem(METHODS, "reversed-eap", "EAP's scores, negated (a test's method)")
    try:
        @scoring.edge_method("reversed-eap", job=scoring._fixed_job)
        def reversed_eap(contrast, site, steps):
            return -scoring.EDGE_METHODS["eap"].score(contrast, site, steps)

        ours = discover(decimal_case, decimal_model, method="reversed-eap", verify=5, n_edges=4)
    finally:
        scoring.EDGE_METHODS.pop("reversed-eap", None)
    eap = discover(decimal_case, decimal_model, method="eap", verify=5, n_edges=4)
    np.testing.assert_allclose(ours.scores, -eap.scores, atol=1e-6)
    assert ours.circuit == eap.circuit and ours.options["method"] == "reversed-eap"

def test_each_method_is_planned_as_it_runs(decimal_case, decimal_model):
    """eap-ig-masks reads the senders live (their differences kept per mask row): its scoring pass is predicted to
    hold more than the fixed-difference EAP-IG at the same steps; exact is planned as every edge patched alone; and
    the circuit plan names the method's own job."""
    from surgeon.analyses.planning import graph_size, plan_circuit
    from surgeon.engine import memory
    from tests.engine.test_memory import _rows

    cfg = decimal_model.cfg
    base, source = _rows(decimal_case, decimal_model)
    peak = {m: memory.predict_rows(cfg, base, source, decimal_case.align,
                                   scoring.EDGE_METHODS[m].job(cfg, graph_size(cfg), 5), 256).peak
            for m in ("eap", "eap-ig-activations", "eap-ig-masks")}
    assert peak["eap-ig-masks"] > peak["eap-ig-activations"] >= peak["eap"]
    for m, name in (("exact", "exact, all"), ("eap-ig-masks", "EAP-IG (5 steps)"), ("eap", "EAP +")):
        assert plan_circuit(decimal_case, decimal_model, m, ig_steps=5, max_memory="64GiB")[0].job.startswith(name)


def test_bad_methods_are_refused_with_the_registered_names():
    with pytest.raises(AnalysisError, match="unknown method 'eapp'") as e:
        scoring.check_edge_method("eapp", 5)
    assert "eap-ig-masks" in e.value.fix
    with pytest.raises(AnalysisError, match="between 1 and"):
        scoring.check_unit_method("ig", 0)
    assert scoring.check_unit_method("ig", 0 + 3).ig and scoring.check_unit_method("atp*", 0).magnitudes


def test_feature_methods_are_registered_and_a_new_one_needs_no_branch(monkeypatch):
    """Feature-node methods (surgeon feature-circuit --method) are registered like edge and unit methods: the registry
    equals the described list, and a method no code names ('halved-gradient': the gradient's scores halved) runs
    through feature_circuit, which finds the gradient method's circuit order and records halved attributions."""
    import os

    from surgeon import load_case
    from surgeon.analyses.feature_circuit import feature_circuit
    from surgeon.circuits.methods import FEATURE_METHODS
    from surgeon.models.loading import load_model
    from tests.conftest import ROOT
    from tests.sae.test_sae import shipped

    assert list(scoring.FEATURE_METHODS) == list(FEATURE_METHODS)
    with pytest.raises(ValueError, match="no description"):
        scoring.feature_method("undescribed", calls=lambda steps, k, start: ())
    case = load_case(os.path.join(ROOT, "cases", "chain_organism.py"))
    model = load_model("organism:chain")
    saes = {L: shipped("chain", L) for L in (0, 1)}
    monkeypatch.setitem(FEATURE_METHODS, "halved-gradient", "the gradient's scores halved (a test's method)")
    try:
        @scoring.feature_method("halved-gradient", calls=scoring.FEATURE_METHODS["gradient"].calls)
        def halved(contrast, sites, steps, S):
            return scoring.FEATURE_METHODS["gradient"].score(contrast, sites, steps, S) / 2

        ours = feature_circuit(case, model, saes, method="halved-gradient", verify=2)
        # the per-example node rule needs the method's points (feature_circuit.POINTS): said, not guessed
        with pytest.raises(AnalysisError, match="no per-example effects"):
            feature_circuit(case, model, saes, method="halved-gradient", threshold=0.1, threshold_over="example")
    finally:
        scoring.FEATURE_METHODS.pop("halved-gradient", None)
    ref = feature_circuit(case, model, saes, method="gradient", verify=2)
    a, b = ours.directions["denoise"], ref.directions["denoise"]
    np.testing.assert_allclose(a.attribution, b.attribution / 2, atol=1e-9)
    assert a.order == b.order and ours.method == "halved-gradient"
    with pytest.raises(AnalysisError, match="unknown attribution method"):
        feature_circuit(case, model, saes, method="nope")
