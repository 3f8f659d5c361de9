"""Every shipped file derived from an organism records the sha256 of the weights it was made from, and
that is the organism shipped today: retraining an organism without remaking what depends on it fails here."""
import json
from pathlib import Path

import pytest

from surgeon.organisms import names, sae_dir, weights_sha256
from tests.conftest import ROOT


def records():
    out = []
    saes = Path(sae_dir("decimal")).parent
    for d in sorted(p for p in saes.glob("*/*") if p.is_dir()):
        rec = d / "training.json" if (d / "training.json").exists() else d / "provenance.json"
        out.append((str(d.relative_to(saes)), json.loads(rec.read_text()) if rec.exists() else {}))
    circuits = json.loads((Path(ROOT) / "circuits" / "provenance.json").read_text())
    out += [(f"circuits/{k}", v) for k, v in circuits.items()]
    for p in sorted((Path(ROOT) / "bench" / "results").glob("*.json")):
        out += [(f"{p.name}:{k}", v) for k, v in json.loads(p.read_text())["organisms"].items()]
    return out


@pytest.mark.parametrize("where,rec", records(), ids=[r[0] for r in records()])
def test_derived_files_were_made_from_the_shipped_organism(where, rec):
    assert rec.get("model", "").startswith("organism:"), f"{where} records no organism"
    organism = rec["model"].split(":", 1)[1]
    assert organism in names()
    assert rec.get("model_sha256") == weights_sha256(organism), (
        f"{where} was made from other weights of organism {organism!r}: remake it (surgeon sae train, "
        f"python circuits/regenerate.py, or the bench with --save)")


def test_every_shipped_sae_and_circuit_is_covered():
    saes = Path(sae_dir("decimal")).parent
    assert len([p for p in saes.glob("*/*") if p.is_dir()]) == 7
    circuits = {p.name.split(".")[0] for p in (Path(ROOT) / "circuits").glob("*_organism.*")}
    assert circuits == set(json.loads((Path(ROOT) / "circuits" / "provenance.json").read_text()))
