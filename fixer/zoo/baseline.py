"""Baselines: today's findings per model, so CI fails only on what is new or worse.

A baseline file is JSON: ``{"nafix_version", "schema": "nafix-baseline/1", "profile", "models":
{PATH: {"sha256", "sw_nodes": {NODE: {"op_type", "constraints", "reasons"}}, "hw_ratio",
"fits_on_chip", "compile_errors": [constraint id], "latency_ms"}}}`` (``latency_ms``: the estimated time, when
nafix's cost model made one). Paths are POSIX, relative to the current
folder when the model lies under it (the form pre-commit passes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import InputError
from ..json_schema import BASELINE, BASELINE_SCHEMA, dumps, problem, read_json_file

SCHEMA = BASELINE_SCHEMA
#: HW ratios are rounded to 4 places in reports; a smaller change is noise
RATIO_EPS = 1e-4
#: a model's estimated time (nafix's cost model) may rise by this fraction before it is a regression:
#: the estimate moves a little when the cost model's parameters are refitted or a neighbouring op's
#: placement changes, which is not a slower model worth failing CI for
MS_TOLERANCE = 0.05


def baseline_path_key(path: str) -> str:
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.resolve().relative_to(Path.cwd().resolve())
        except (ValueError, OSError, RuntimeError):  # not under the current folder, that folder was deleted, a loop
            pass
    return p.as_posix()


def _entry(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "sha256": row.get("sha256"),
        "sw_nodes": {n["name"]: {"op_type": n["op_type"], "constraints": sorted(set(n.get("constraints") or [])),
                                 "reasons": list(n.get("reasons") or [])} for n in row["sw_nodes"]},
        "hw_ratio": row["estimate"]["hw_ratio"],
        # an activations_on_chip finding the team accepted (--ignore-finding) is not a regression either
        "fits_on_chip": row["memory"]["fits_on_chip"] or any(
            f.get("constraint") == "activations_on_chip" for f in row.get("ignored_findings") or ()),
        "compile_errors": sorted({f["constraint"] for f in row.get("findings") or [] if f.get("severity") == "compile_error"}),
        **({"latency_ms": row["estimate"]["latency_ms"]} if row["estimate"].get("latency_ms") is not None else {}),
    }


def make_baseline(report: dict[str, Any]) -> dict[str, Any]:
    """A baseline from an audit report (models that could not be analysed are left out)."""
    models = {baseline_path_key(r["path"]): _entry(r) for r in report["models"]
              if not r.get("error") and r.get("estimate") is not None}
    # "nafix_version" first: fixer.outputs recognises the file as nafix's, so a rerun may refresh it
    return {"nafix_version": __version__, "schema": SCHEMA, "profile": report["profile"],
            "models": dict(sorted(models.items()))}


def baseline_text(report: dict[str, Any]) -> str:
    return dumps(make_baseline(report), indent=2) + "\n"


def load_baseline(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a baseline file against the shape :func:`make_baseline` writes
    (:data:`fixer.json_schema.BASELINE`); anything else is one clear InputError naming the file and
    the JSON path of the first bad value."""
    p = Path(path)
    hint = "write it again with --write-baseline."
    data = read_json_file(p, None, what="baseline file", hint=hint,
                          missing=f"baseline file not found (write one with --write-baseline {p})")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InputError(f"{p}: not a nafix baseline (expected \"schema\": \"{SCHEMA}\"); {hint}")
    found = problem(data, BASELINE)
    if found is not None:
        raise InputError(f"{p}: {found}; {hint}")
    return data


@dataclass
class Change:
    path: str
    kind: str  # new_sw_node | worse_sw_node | lower_hw_ratio | slower | no_longer_fits | compile_error | (improvements:)
    #            fixed_sw_node | higher_hw_ratio | faster | fits_now | compile_error_fixed
    message: str
    node: str | None = None


@dataclass
class Comparison:
    regressions: list[Change] = field(default_factory=list)
    improvements: list[Change] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def d(c: Change) -> dict[str, Any]:
            return {"path": c.path, "kind": c.kind, "node": c.node, "message": c.message}

        return {"regressions": [d(c) for c in self.regressions], "improvements": [d(c) for c in self.improvements]}


def compare(report: dict[str, Any], baseline: dict[str, Any], *, ms_tolerance: float = MS_TOLERANCE) -> Comparison:
    """What is new or worse (regressions) and what got better (improvements) than the baseline.
    An estimated time that rises by more than ``ms_tolerance`` (a fraction) is a regression, one that
    falls by more is an improvement (a baseline written without estimated times compares none).
    A model is looked up by path, else by content hash (a renamed file); a model the baseline does
    not know has no baseline: each SW node, compile error and failed memory fit is new."""
    out = Comparison()
    models = baseline["models"]
    by_sha = {e.get("sha256"): e for e in models.values() if e.get("sha256")}
    for row in report["models"]:
        if row.get("error") or row.get("estimate") is None:
            continue  # reported as an error row (exit 2) already
        path = row["path"]
        key = baseline_path_key(path)
        base = models.get(key) or by_sha.get(row.get("sha256"))
        now = _entry(row)
        old_nodes = base["sw_nodes"] if base else {}
        for name, n in now["sw_nodes"].items():
            why = "; ".join(n["reasons"])
            if name not in old_nodes:
                out.regressions.append(Change(path, "new_sw_node", f"{path}: new SW node '{name}' ({n['op_type']}): {why}", name))
            else:
                added = sorted(set(n["constraints"]) - set(old_nodes[name].get("constraints") or []))
                if added:
                    out.regressions.append(Change(path, "worse_sw_node", f"{path}: SW node '{name}' ({n['op_type']}) now also "
                                                  f"fails {', '.join(added)}: {why}", name))
        for name, n in old_nodes.items():
            if name not in now["sw_nodes"]:
                out.improvements.append(Change(path, "fixed_sw_node", f"{path}: '{name}' ({n.get('op_type', '?')}) no longer "
                                               "runs in SW (estimated)", name))
        if base:
            if now["hw_ratio"] < base["hw_ratio"] - RATIO_EPS:
                out.regressions.append(Change(path, "lower_hw_ratio", f"{path}: estimated HW ratio fell from "
                                              f"{base['hw_ratio']:.1%} to {now['hw_ratio']:.1%}"))
            elif now["hw_ratio"] > base["hw_ratio"] + RATIO_EPS:
                out.improvements.append(Change(path, "higher_hw_ratio", f"{path}: estimated HW ratio rose from "
                                               f"{base['hw_ratio']:.1%} to {now['hw_ratio']:.1%}"))
        old_ms, new_ms = (base or {}).get("latency_ms"), now.get("latency_ms")
        if old_ms is not None and new_ms is not None and old_ms > 0:
            from ..report import ms_text

            rise = (new_ms - old_ms) / old_ms
            what = (f"{path}: estimated time {'rose' if rise > 0 else 'fell'} from {ms_text(old_ms)} ms to "
                    f"{ms_text(new_ms)} ms ({rise:+.1%}")
            if rise > ms_tolerance:
                out.regressions.append(Change(path, "slower", f"{what}, more than the {ms_tolerance:.0%} tolerance)"))
            elif rise < -ms_tolerance:
                out.improvements.append(Change(path, "faster", what + ")"))
        if not now["fits_on_chip"] and (not base or base["fits_on_chip"]):
            out.regressions.append(Change(path, "no_longer_fits", f"{path}: the estimated activations no longer fit "
                                          "in the on-chip memory" if base else f"{path}: the estimated activations do not "
                                          "fit in the on-chip memory"))
        elif now["fits_on_chip"] and base and not base["fits_on_chip"]:
            out.improvements.append(Change(path, "fits_now", f"{path}: the estimated activations now fit on-chip"))
        old_errors = set(base.get("compile_errors") or []) if base else set()
        for c in sorted(set(now["compile_errors"]) - old_errors):
            f = next(f for f in row["findings"] if f["constraint"] == c and f["severity"] == "compile_error")
            out.regressions.append(Change(path, "compile_error", f"{path}: new predicted compile error: "
                                          f"{f['requirement']} ({f['detail']})"))
        for c in sorted(old_errors - set(now["compile_errors"])):
            out.improvements.append(Change(path, "compile_error_fixed", f"{path}: predicted compile error {c} is gone"))
    return out
