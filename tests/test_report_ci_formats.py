"""--format github (at most 10 annotations per level, one per model and cause, $GITHUB_STEP_SUMMARY)
and --format concise (one line per finding)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from fixer.report_ci import concise_text, github_annotations, step_summary_markdown
from fixer.zoo.runner import build_report
from tests.helpers import run_cli as run

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"


def _row(i: int, causes: int, nodes_per_cause: int, *, error: str | None = None) -> dict:
    if error:
        return {"path": f"zoo/m{i:02d}.onnx", "error": error, "estimate": None, "memory": None, "sw_nodes": [],
                "findings": [], "epochs": []}
    sw = [{"name": f"n{c}_{k}", "op_type": "Softmax", "reasons": [f"reason {c}"], "constraints": [f"C{c}"]}
          for c in range(causes) for k in range(nodes_per_cause)]
    return {"path": f"zoo/m{i:02d}.onnx", "error": None,
            "estimate": {"epochs": 10, "sw_epochs": len(sw), "hybrid_epochs": 0, "hw_epochs": 10 - len(sw) % 10,
                         "hw_ratio": 0.5, "latency_ms": 1.0, "sw_ops": {"Softmax": len(sw)}, "hybrid_ops": {}},
            "memory": {"weights_bytes": 1024, "peak_activation_bytes": 2048, "fits_on_chip": True,
                       "onchip_activation_capacity_bytes": 4096},
            "sw_nodes": sw, "findings": [], "notes": [],
            "epochs": [{"unit": "SW", "ms": 0.5 + i, "nodes": [n["name"]]} for n in sw]}


def _zoo(n_models=38, causes=3, nodes=15, errors=12):
    rows = [_row(i, causes, nodes) for i in range(n_models)]
    rows += [_row(100 + i, 0, 0, error=f"cannot read model {i}") for i in range(errors)]
    return build_report(rows, profile="stm32n6")


def test_github_caps_each_level_and_counts_the_rest():
    lines = github_annotations(_zoo()).splitlines()
    by = {lvl: [ln for ln in lines if ln.startswith(f"::{lvl}")] for lvl in ("error", "warning", "notice")}
    assert all(len(v) <= 10 for v in by.values()), {k: len(v) for k, v in by.items()}
    assert len(by["error"]) == 10 and len(by["warning"]) == 10
    # one per model and cause, with the node count; the worst (most estimated ms) first
    assert all("(15 node(s))" in ln for ln in by["warning"])
    assert "m37.onnx" in by["warning"][0]
    (more,) = [ln for ln in by["notice"] if "more not shown" in ln]
    # 12 errors, 38*3 warnings, 38 estimates: what is not shown is counted
    assert "2 error(s)" in more and f"{38 * 3 - 10} warning(s)" in more
    assert any("title=nafix zoo summary" in ln for ln in by["notice"])
    assert more == lines[-1]


def test_github_small_zoo_has_no_overflow_line():
    lines = github_annotations(_zoo(n_models=2, causes=2, nodes=3, errors=1)).splitlines()
    assert not any("more not shown" in ln for ln in lines)
    assert len([ln for ln in lines if ln.startswith("::warning")]) == 4
    assert all(re.match(r"^::(debug|warning|error|notice)", ln) for ln in lines)


def test_github_escapes_untrusted_names_in_aggregates():
    rep = _zoo(n_models=1, causes=1, nodes=2, errors=0)
    rep["models"][0]["sw_nodes"][0]["name"] = "evil\n::error::forged"
    rep["models"][0]["path"] = "a,b:c.onnx"
    lines = github_annotations(rep).splitlines()
    assert not any(ln.startswith("::error") for ln in lines)
    assert any("file=a%2Cb%3Ac.onnx" in ln and "evil%0A::error::forged" in ln for ln in lines)


def test_concise_is_one_line_per_finding():
    rep = _zoo(n_models=2, causes=2, nodes=2, errors=1)
    rep["models"][0]["sw_nodes"][0]["name"] = "x\ny"
    lines = concise_text(rep).splitlines()
    assert len(lines) == 2 * 2 * 2 + 1
    assert "zoo/m00.onnx: x\\ny Softmax: reason 0 [C0]" in lines  # a newline in a name stays on its line
    assert "zoo/m100.onnx: error: cannot read model 0" in lines


def test_step_summary_is_bounded_and_escaped():
    rep = _zoo(n_models=300, causes=1, nodes=1, errors=0)
    rep["models"][0]["path"] = "a|b.onnx"
    md = step_summary_markdown(rep)
    assert md.count("\n| `zoo/") == 199 and "100 more model(s) not listed" in md
    assert len(md) < 64_000
    assert "a\\|b.onnx" in md


def test_cli_github_appends_step_summary_and_concise(tmp_path, capsys, monkeypatch):
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    for name in ("classifier_softmax.onnx", "movenet_like.onnx"):
        shutil.copy(SAMPLES / name, zoo / name)
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = run(["audit", str(zoo), "-f", "github", "--no-cache", "-j", "1"], capsys)
    assert code == 0, err
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "## nafix audit" in text and "classifier_softmax.onnx" in text
    assert all(len([ln for ln in out.splitlines() if ln.startswith(f"::{lvl}")]) <= 10
               for lvl in ("error", "warning", "notice"))
    code, out, err = run(["audit", str(zoo), "-f", "concise", "--no-cache", "-j", "1"], capsys)
    assert code == 0, err
    assert out.strip() and all(re.match(r"^\S+\.onnx: \S", ln) for ln in out.splitlines())
    assert any(re.search(r": \S+ Softmax: .+ \[[^\]]+\]$", ln) for ln in out.splitlines())
