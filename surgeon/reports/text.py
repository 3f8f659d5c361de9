"""Numbers as the reports write them, and saved results (results.json + manifest.json + figures); each result's own
text lives with its view (surgeon/reports/*_view.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from surgeon.models.loading import resolve, shape
from surgeon.results import manifest, shown_path, staging, write_json


def num(v: float, spec: str) -> str:
    """format(v, spec), with a value that rounds to zero printed as zero, not -0.000."""
    out = format(v, spec)
    return format(0.0, spec) if np.isfinite(v) and float(out) == 0 else out


def interval(lo, hi, fmt: str = "+.3f", pct: bool = False) -> str:
    """An interval in brackets, or the reason there is none (one item: nothing to resample)."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "(no interval)"
    k = 100 if pct else 1
    return f"[{k * lo:{fmt}}, {k * hi:{fmt}}]"


def gap_note(base, source) -> str | None:
    """Why a repair fraction is undefined, in words, or None when the two runs differ."""
    if abs(source.value - base.value) > 1e-9 and np.isfinite(source.value - base.value):
        return None
    return (f"the two formats score the same on these items (mean score {base.value:+.3f} vs {source.value:+.3f}): "
            f"there is no gap to repair, so repair fractions are undefined. Are the formats really different "
            f"(check the case's templates and --bad)?")


def num3(v: float) -> str:
    """v to 3 decimals, a value that rounds to zero without a sign."""
    out = f"{v:.3f}"
    return "0.000" if out == "-0.000" else out


def model_info(case) -> dict | None:
    """Where the case's model came from: spec, kind, resolved path (a cache snapshot names its revision)."""
    if case is None:
        return None
    if case.model is None:
        return {"spec": None, "kind": "given in memory (the case names no model)"}
    ref = resolve(case.model)
    shp = shape(ref)
    return {"spec": ref.spec, "kind": ref.kind, "path": shown_path(ref.path) if ref.path else None,
            "n_layers": shp.n_layers, "n_heads": shp.n_heads, "n_kv_heads": shp.n_kv_heads, "d_model": shp.d_model,
            "attn_only": shp.attn_only}


def save(out: Path, command: str, result, case, args, device: str | None, figures: dict | None = None,
         tables: dict | None = None) -> None:
    """A command's results in `out` (see `save_result`), its options taken from the parsed command line."""
    opts = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k not in ("debug", "out", "case")}
    save_result(out, command, result, case, options=opts, device=device, figures=figures, tables=tables)


def save_result(out: Path, command: str, result, case, *, options: dict, device: str | None,
                figures: dict | None = None, tables: dict | None = None, api: str | None = None) -> None:
    """results.json + manifest.json + figures (name -> draw(result, path)) + CSV tables, all or nothing.
    `api`: the Python call that made the result (the manifest then holds no command line)."""
    import csv

    with staging(out) as tmp:
        write_json(tmp / "results.json", {"command": command, "result": result})
        m = manifest(command, case, seed=options.get("seed"), device=device, dtype=options.get("dtype"),
                     options=options, model_info=model_info(case), execution=getattr(result, "execution", None),
                     argv=[] if api else None)
        if api:
            m["api"] = api
        write_json(tmp / "manifest.json", m)
        for name, draw in (figures or {}).items():
            draw(result, tmp / name)
        for name, rows in (tables or {}).items():
            with open(tmp / name, "w", newline="") as f:
                csv.writer(f).writerows(rows)
