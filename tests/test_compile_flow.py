"""The whole --compile flow against the stand-in stedgeai (tests/fake_stedgeai/stedgeai), which
prints real report formats: both formats, a compile failure, a timeout, a missing tool."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from fixer.cli import main
from tests.helpers import run_cli as run

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_stedgeai" / "stedgeai"
MOVENET = ROOT / "sample_models" / "movenet_like.onnx"
UINT8 = ROOT / "sample_models" / "uint8_default_quant.onnx"


@pytest.fixture(autouse=True)
def fake_env(monkeypatch):
    # the stand-in is a python script that imports onnx: put this interpreter first on PATH
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    for var in ("STEDGEAI_CORE_DIR", "FAKE_STEDGEAI_FORMAT", "FAKE_STEDGEAI_FAIL", "FAKE_STEDGEAI_HANG"):
        monkeypatch.delenv(var, raising=False)



@pytest.mark.parametrize("fmt", ["A", "B"])
def test_fix_compile_measures_before_and_after(tmp_path, capsys, monkeypatch, fmt):
    monkeypatch.setenv("FAKE_STEDGEAI_FORMAT", fmt)
    model = tmp_path / "movenet_like.onnx"
    shutil.copy(MOVENET, model)
    code, out, err = run(["fix", model, "--compile", "--stedgeai", FAKE], capsys)
    assert code == 0, out + err
    report = json.loads((tmp_path / "movenet_like.nafix.json").read_text())
    st = report["stedgeai"]
    assert st["version"].startswith(("2.", "3.", "4."))
    assert st["before"]["ok"] and st["after"]["ok"]
    # the stand-in puts bilinear Resize in SW: three before, none after the rewrite
    assert st["before"]["sw_ops"].count("Resize") == 3
    assert "Resize" not in st["after"]["sw_ops"]
    assert st["after"]["hw_ratio"] > st["before"]["hw_ratio"] and st["improved"] is True
    assert isinstance(st["before"]["estimate_vs_real"], list)
    assert "(measured)" in out and "stedgeai (before):" in err
    # workspaces are never created in the user's folder (no .nafix.h: with stedgeai's default options the
    # float graph edges become int8 by themselves, so no rule changed them)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["movenet_like.onnx", "movenet_like.nafix.onnx", "movenet_like.nafix.json"])


def test_compile_command_reports_and_compares_with_the_estimate(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_STEDGEAI_FORMAT", "B")
    work = tmp_path / "work"
    code, out, err = run(["compile", MOVENET, "--stedgeai", FAKE, "--format", "json", "--workdir", work,
                          "--stedgeai-option", "--input-data-type float32"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["stedgeai"]["sw_ops"].count("Resize") == 3 and data["estimated"] is True
    # the estimate is made for the installed tool's core version and the same options
    assert data["estimate"]["core"] == "4.0"
    rows = data["stedgeai"]["estimate_vs_real"]
    # with --input-data-type float32 nafix predicts the input QuantizeLinear in SW; the stand-in does not:
    # listed as a disagreement
    assert any(r["what"] == "sw_ops" and r["op"] == "QuantizeLinear" and r["predicted"] == 1 and r["actual"] == 0
               for r in rows), rows
    # the option reached stedgeai: estimate and measurement describe the same build
    (report,) = work.rglob("*_generate_report.txt")
    assert "--input-data-type float32" in report.read_text()


def test_compile_failure_is_explained(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_STEDGEAI_FAIL", "uint8")
    code, out, err = run(["compile", UINT8, "--stedgeai", FAKE], capsys)
    assert code == 1
    assert "compile failed" in out
    assert err.strip().splitlines()[-1] == f"nafix: exit 1 \u2014 stedgeai failed to compile {UINT8.name}"
    assert "uint8-activations" in out and "int8" in out


def test_fix_compile_failure_exits_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_STEDGEAI_FAIL", "uint8")
    model = tmp_path / "m.onnx"
    shutil.copy(MOVENET, model)
    code, out, err = run(["fix", model, "--compile", "--stedgeai", FAKE], capsys)
    assert code == 1
    assert "did not increase" in err
    assert err.strip().splitlines()[-1] == ("nafix: exit 1 \u2014 the real HW-epoch ratio measured by stedgeai did not "
                                            "increase (--compile)")
    report = json.loads((tmp_path / "m.nafix.json").read_text())
    assert report["stedgeai"]["before"]["ok"] is False
    assert report["stedgeai"]["before"]["known_errors"][0]["code"] == "uint8-activations"


def test_timeout_kills_the_tool_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_STEDGEAI_HANG", "60")
    t0 = time.monotonic()
    code, out, err = run(["compile", MOVENET, "--stedgeai", FAKE, "--timeout", "2"], capsys)
    assert time.monotonic() - t0 < 30
    assert code == 2
    assert "did not finish within" in err and err.count("error:") == 1


def test_missing_tool_is_an_error_only_with_compile(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    model = tmp_path / "m.onnx"
    shutil.copy(MOVENET, model)
    code, out, err = run(["fix", model, "--compile", "--dry-run"], capsys)
    assert code == 2 and "stedgeai was not found" in err and "STEDGEAI_CORE_DIR" in err
    code, out, err = run(["fix", model, "--dry-run"], capsys)
    assert code == 0 and "stedgeai not found" in err
    code, out, err = run(["compile", model, "--stedgeai", tmp_path / "nope" / "stedgeai"], capsys)
    assert code == 2 and err.startswith("error:")


def test_stedgeai_core_dir_is_used(tmp_path, capsys, monkeypatch):
    from fixer.stedgeai import _utilities_folder

    folder, exe = _utilities_folder(sys.platform)
    tools = tmp_path / "core" / "Utilities" / folder
    tools.mkdir(parents=True)
    shutil.copy(FAKE, tools / exe)
    (tools / exe).chmod(0o755)
    monkeypatch.setenv("STEDGEAI_CORE_DIR", str(tmp_path / "core"))
    code, out, err = run(["compile", MOVENET], capsys)
    assert code == 0, err
    assert "(measured)" in out


def test_explain_command_on_real_reports(capsys):
    shared = ROOT.parent / "shared" / "reference" / "reports"
    sample = shared / "denoiser_v2.1.0_excerpt.txt"
    if not sample.exists():
        sample = ROOT / "tests" / "data" / "reports" / "format_a_v2.1.0_denoiser_excerpt.txt"
    code = 0
    try:
        main(["explain", str(sample)])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr().out
    assert code in (0, None)
    assert "23 epochs, 3 SW" in out and "Conv x3" in out


def test_explain_command_recognises_known_errors(tmp_path, capsys):
    log = tmp_path / "log.txt"
    log.write_text("some output\nTOOL ERROR: list index out of range\nWARNING: conv1_out is not quantized\n")
    try:
        main(["explain", str(log), "--format", "json"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    data = json.loads(capsys.readouterr().out)
    codes = {k["code"] for k in data["known_errors"]}
    assert {"gemm-dynamic-bias", "not-quantized"} <= codes
    fixes = " ".join(k["fix"] for k in data["known_errors"])
    assert "NAF011" in fixes


def test_fix_compile_warns_before_compiling_when_activations_spill(tmp_path, capsys):
    model = tmp_path / "big.onnx"
    shutil.copy(ROOT / "sample_models" / "big_activations.onnx", model)
    code, out, err = run(["fix", model, "--compile", "--stedgeai", FAKE, "--dry-run"], capsys)
    assert "nafix warning: estimated peak activations" in err
    first_tool_line = err.index("stedgeai (before): ST Edge AI Core") if "ST Edge AI Core" in err else len(err)
    assert err.index("nafix warning") < first_tool_line
