"""What ``--quantize`` would remove, estimated without calibrating (fixer.quantize.gain), said per
model in every audit format and by ``nafix MODEL``, and counted in the zoo summary (issue 36)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fixer.api import AnalysisOptions, FixOptions, audit, fix
from fixer.report import audit_markdown, audit_renderables
from fixer.report_ci import concise_text, github_annotations, sarif_report, step_summary_markdown
from fixer.zoo.runner import audit_dict
from tests.helpers import QDQ, run_cli, save
from tests.test_zoo import softmax_chain

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
SHARED = ROOT.parent / "shared" / "models"


def prelu_islands():
    """A QDQ Conv -> PRelu (float slope: a float island) -> Conv chain."""
    b = QDQ()
    y = b.op("Conv", [b.input("x", [1, 4, 8, 8]), b.weight("w1", [8, 4, 1, 1])], name="conv1")
    y = b.op("PRelu", [y, b.const("slope", np.full((8, 1, 1), 0.25, np.float32))], name="prelu")
    y = b.op("Conv", [y, b.weight("w2", [8, 8, 1, 1])], name="conv2")
    b.output(y)
    return b.model()


@pytest.fixture
def zoo(tmp_path) -> Path:
    folder = tmp_path / "zoo"
    folder.mkdir()
    for name in ("classifier_softmax_float.onnx", "uint8_default_quant_float.onnx", "uint8_default_quant.onnx"):
        shutil.copy(SAMPLES / name, folder / name)
    save(prelu_islands(), folder / "islands.onnx")
    save(softmax_chain(1), folder / "quantized.onnx")
    return folder


@pytest.fixture
def report(zoo) -> dict:
    return audit_dict(audit([str(zoo)]), profile="stm32n6")


def by_name(report: dict) -> dict[str, dict]:
    return {Path(r["path"]).name: r for r in report["models"]}


@pytest.mark.parametrize("name", ["classifier_softmax_float.onnx", "uint8_default_quant_float.onnx", "islands.onnx"])
def test_the_estimate_agrees_with_the_real_quantize_run(zoo, report, name):
    """The estimated SW epochs left after quantizing are those of the model --quantize writes."""
    g = by_name(report)[name]["quantize"]
    assert g is not None and g["sw_epochs"]["removed"] > 0 and g["estimated"] is True
    assert g["kind"] == ("float_islands" if name == "islands.onnx" else "float")
    r = fix(zoo / name, FixOptions(quantize=True, dry_run=True))
    assert r.verified
    assert g["sw_epochs"]["before"] == r.before.estimate.sw_epochs
    assert g["sw_epochs"]["after"] == r.final.estimate.sw_epochs
    assert g["ms"]["after"] < g["ms"]["before"]


@pytest.mark.parametrize("name", ["movenet_like_float.onnx", "denoiser_257_float.onnx"])
def test_the_estimate_follows_the_rewrites_made_before_quantizing(name):
    """A float model's rewrites before quantizing (Resize kernels, channel splits, as --quantize runs
    them) are in the estimate, and so is its guard (an LSTM unrolling estimated slower once quantized is
    not kept: the denoiser keeps its LSTM in SW, in both)."""
    (row,) = audit_dict(audit([str(SAMPLES / name)]), profile="stm32n6")["models"]
    r = fix(SAMPLES / name, FixOptions(quantize=True, dry_run=True))
    assert row["quantize"]["sw_epochs"]["after"] == r.final.estimate.sw_epochs == (3 if "denoiser" in name else 0)
    assert row["quantize"]["ms"]["after"] == pytest.approx(r.final.estimate.latency_ms, rel=0.05)


def test_nothing_to_quantize_no_advice(report):
    rows = by_name(report)
    assert rows["quantized.onnx"]["quantize"] is None and rows["uint8_default_quant.onnx"]["quantize"] is None


def test_every_format_says_quantize_per_model(report):
    advised = {Path(r["path"]).name for r in report["models"] if r.get("quantize")}
    assert advised == {"classifier_softmax_float.onnx", "uint8_default_quant_float.onnx", "islands.onnx"}
    md = audit_markdown(report)
    con = concise_text(report)
    gh = github_annotations(report)
    step = step_summary_markdown(report)
    table = "\n".join(str(getattr(r, "plain", r)) for r in audit_renderables(report))
    sarif = sarif_report(report)
    notes = {Path(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]).name
             for r in sarif["runs"][0]["results"] if r["ruleId"] == "nafix-quantize"}
    assert notes == advised
    for name in advised:
        row = by_name(report)[name]
        removed = f"remove an estimated {row['quantize']['sw_epochs']['removed']} of"
        assert any(name in line and "--quantize" in line and removed in line for line in con.splitlines())
        assert any(f"file={row['path']}" in line and removed in line for line in gh.splitlines())
        assert md.count(removed) >= 1 and table.count(removed) >= 1
        assert any(name in line and f"{row['quantize']['sw_epochs']['removed']} SW epochs" in line
                   for line in step.splitlines())
    # the zoo summary counts them, in the JSON and in its sentences
    q = report["summary"]["quantize"]
    assert q["models"] == 3 and q["float"] == 2 and q["float_islands"] == 1
    assert q["sw_epochs_removed"] == sum(by_name(report)[n]["quantize"]["sw_epochs"]["removed"] for n in advised)
    assert "3 model(s) (2 float, 1 with float islands) need" in md and "nafix MODEL --quantize" in md
    # opt-in rules are suggested with --extend-select, never --select (which drops the default rules)
    for text in (md, con, gh, step, table, json.dumps(report)):
        assert "--select" not in text


def softmax_island():
    """A QDQ Conv -> float Softmax (an activation left in float: only calibration gives it a scale)
    -> Conv chain."""
    b = QDQ()
    y = b.op("Conv", [b.input("x", [1, 4, 8, 8]), b.weight("w1", [8, 4, 1, 1])], name="conv1")
    y = b.raw_op("Softmax", [y], name="softmax", axis=1)
    y = b.op("Conv", [y, b.weight("w2", [8, 8, 1, 1])], name="conv2")
    b.output(y)
    return b.model()


def test_fix_advice_says_what_quantize_removes(tmp_path, capsys):
    save(softmax_island(), tmp_path / "island.onnx")
    code, out, err = run_cli([tmp_path / "island.onnx", "--dry-run"], capsys)
    text = " ".join(out.split())
    assert code == 0, err
    assert "float islands" in text and "--quantize" in text and "it would remove an estimated 3 of 4 SW epochs" in text
    r = fix(tmp_path / "island.onnx", FixOptions(dry_run=True))
    assert r.quantize_estimate is not None and r.quantize_estimate["sw_epochs"]["removed"] == 3


def test_constant_islands_are_fixed_by_plain_nafix_and_the_audit_says_so(zoo, report, capsys):
    """Float PRelu slopes need no calibration: the audit's --quantize advice names the default rule
    (NAF018) that plain nafix MODEL runs first, and nafix MODEL fixes them with no --quantize advice left."""
    g = by_name(report)["islands.onnx"]["quantize"]
    assert g["plain_rules"] == ["NAF018"]
    assert "rules NAF018" in audit_markdown(report)
    code, out, err = run_cli([zoo / "islands.onnx", "--dry-run"], capsys)
    text = " ".join(out.split())
    assert code == 0, err
    assert "NAF018" in text and "--quantize" not in text


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is absent")
@pytest.mark.parametrize("name", ["pele__mobilefacenet__PerChannel_quant.onnx", "magnus__mobilenet_v2_224_int8.onnx"])
def test_real_float_islands_estimate_matches_quantize(name):
    """MobileFaceNet (float PRelu slopes) and MobileNetV2 (DQ -> ReduceMean -> Reshape -> Q tail): the
    estimate is the --quantize result's SW epochs and estimated time."""
    (row,) = audit_dict(audit([str(SHARED / name)], ), profile="stm32n6")["models"]
    g = row["quantize"]
    r = fix(SHARED / name, FixOptions(quantize=True, dry_run=True))
    assert g["kind"] == "float_islands" and g["sw_epochs"]["after"] == r.final.estimate.sw_epochs == 0
    assert g["ms"]["after"] == pytest.approx(r.final.estimate.latency_ms, rel=0.01)
