"""Issue 35, item 2: the estimated time (nafix's cost model) beside the epochs in the console of
``nafix MODEL`` (before -> after and the change in %), ``nafix audit`` and ``nafix compile``."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from fixer.api import AnalysisOptions, analyze_path
from fixer.report import compile_renderables, ms_text
from tests.helpers import run_cli

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"


def test_fix_console_shows_the_estimated_time_before_and_after_and_the_change(capsys):
    model = SAMPLES / "denoiser_257.onnx"
    code, out, err = run_cli([model, "--dry-run"], capsys)
    assert code == 0, err
    before = analyze_path(model, AnalysisOptions()).estimate.latency_ms
    assert "est. ms" in out
    m = re.search(r"estimated time ([0-9.,]+) ms -> ([0-9.,]+) ms \(([+-][0-9.]+)%\) per inference", out)
    assert m, out
    b, a, pct = (float(x.replace(",", "")) for x in m.groups())
    assert m.group(1) == ms_text(before)
    assert a < b  # the 257-channel splits save estimated time on this model (the guard would refuse otherwise)
    assert abs(pct - 100 * (a - b) / b) < 0.1
    table_rows = [ln for ln in out.splitlines() if ln.startswith("│ before") or ln.startswith("│ after")]
    assert m.group(1) in table_rows[0] and m.group(2) in table_rows[1]


def test_audit_console_has_an_estimated_ms_column(capsys):
    model = SAMPLES / "movenet_like.onnx"
    code, out, err = run_cli(["audit", model], capsys)
    ms = analyze_path(model, AnalysisOptions()).estimate.latency_ms
    assert "est. ms" in out and ms_text(ms) in out, out
    assert f"estimated time {ms_text(ms)} ms" in out  # the per-model summary line


def test_compile_shows_the_estimate_beside_what_stedgeai_reports():
    analysis = analyze_path(SAMPLES / "movenet_like.onnx", AnalysisOptions())
    cm = SimpleNamespace(label="movenet_like", disagreements=[],
                         result=SimpleNamespace(report=None, ok=False, known_errors=[], problems=[]))
    text = "\n".join(str(r) for r in compile_renderables(cm, "4.0.1", analysis))
    assert f"estimated time {ms_text(analysis.estimate.latency_ms)} ms" in text, text


# -- --max-ms: a time budget for fix and audit (issue 35, item 3) ---------------------------------

def _error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


def test_fix_max_ms_fails_on_the_estimated_time_of_the_model_left(capsys):
    model = SAMPLES / "denoiser_257.onnx"
    code, out, err = run_cli([model, "--dry-run", "--max-ms", "1"], capsys)
    m = re.search(r"estimated time [0-9.,]+ ms -> ([0-9.,]+) ms", out)
    after = m.group(1)
    assert code == 1
    assert _error_lines(err) == [f"error: 1 model(s) over the --max-ms budget of 1.000 ms: denoiser_257.onnx "
                                 f"(estimated {after} ms); times estimated by nafix's cost model, not measured."]
    # the budget is on the fixed model: above it, exit 0 (the input alone was over it)
    before = analyze_path(model, AnalysisOptions()).estimate.latency_ms
    between = (before + float(after)) / 2
    code, _, err = run_cli([model, "--dry-run", "--max-ms", f"{between:.4f}"], capsys)
    assert code == 0 and not _error_lines(err), err


def test_audit_max_ms_names_the_models_over_budget_and_refuses_a_bad_budget(capsys):
    models = [SAMPLES / "denoiser_257.onnx", SAMPLES / "movenet_like.onnx"]
    times = {p.name: analyze_path(p, AnalysisOptions()).estimate.latency_ms for p in models}
    budget = min(times.values()) + (max(times.values()) - min(times.values())) / 2
    code, _, err = run_cli(["audit", *models, "--no-cache", "--max-ms", f"{budget:.4f}"], capsys)
    slow = max(times, key=times.get)
    assert code == 1
    [line] = _error_lines(err)
    assert f"1 model(s) over the --max-ms budget" in line and f"{slow} (estimated {ms_text(times[slow])} ms)" in line
    code, _, err = run_cli(["audit", *models, "--no-cache", "--max-ms", f"{max(times.values()) + 1:.4f}"], capsys)
    assert code == 0, err
    for bad in ("0", "-1", "nan", "inf"):
        code, _, err = run_cli(["audit", models[0], "--no-cache", "--max-ms", bad], capsys)
        assert code == 2 and "is not a time budget" in err, (bad, err)


# -- the baseline: an estimated time that rises beyond a tolerance is a regression ----------------

def _report(path: Path) -> dict:
    from fixer.report_data import analysis_dict

    row = {"path": str(path), "sha256": "x", "error": None, **analysis_dict(analyze_path(path, AnalysisOptions()))}
    return {"profile": "stm32n6", "models": [row]}


def test_baseline_records_the_estimated_time_and_flags_a_rise_beyond_the_tolerance(tmp_path):
    import copy
    import json

    from fixer.zoo.baseline import MS_TOLERANCE, baseline_text, compare, load_baseline

    report = _report(SAMPLES / "movenet_like.onnx")
    ms = report["models"][0]["estimate"]["latency_ms"]
    f = tmp_path / "b.json"
    f.write_text(baseline_text(report))
    base = load_baseline(f)  # the schema accepts the new key
    assert next(iter(base["models"].values()))["latency_ms"] == ms
    assert not compare(report, base).regressions

    def at(factor):
        r = copy.deepcopy(report)
        r["models"][0]["estimate"]["latency_ms"] = ms * factor
        return compare(r, base)

    assert not at(1 + MS_TOLERANCE / 2).regressions  # within the tolerance: noise
    slower = at(1 + 2 * MS_TOLERANCE)
    [c] = slower.regressions
    assert c.kind == "slower" and f"from {ms_text(ms)} ms to {ms_text(ms * (1 + 2 * MS_TOLERANCE))} ms" in c.message
    assert [c.kind for c in at(1 - 2 * MS_TOLERANCE).improvements] == ["faster"]
    # a baseline written before nafix estimated times compares none
    old = json.loads(f.read_text())
    for e in old["models"].values():
        del e["latency_ms"]
    f.write_text(json.dumps(old))
    r = copy.deepcopy(report)
    r["models"][0]["estimate"]["latency_ms"] = ms * 10
    assert not compare(r, load_baseline(f)).regressions
