"""Every exit 1 ends with its reason: the last line nafix prints is ``nafix: exit 1 — REASON``
(issue 36, "What stops the build is buried")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import run_cli as run
from tests.helpers import save
from tests.test_engine import _relu_model, rules_dir  # noqa: F401 - the fixture
from tests.test_zoo import softmax_chain

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"


def last_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "nothing printed on stderr"
    return lines[-1]


def reason(code: int, err: str) -> str:
    assert code == 1, err
    line = last_line(err)
    assert line.startswith("nafix: exit 1 \u2014 "), line
    return line[len("nafix: exit 1 \u2014 "):]


@pytest.fixture
def two_sw(tmp_path) -> Path:
    folder = tmp_path / "zoo"
    folder.mkdir()
    save(softmax_chain(1), folder / "one.onnx")
    save(softmax_chain(2), folder / "two.onnx")
    save(softmax_chain(0), folder / "clean.onnx")
    return folder


def test_audit_fail_on_sw_names_the_models(two_sw, capsys):
    code, out, err = run(["audit", two_sw, "--fail-on", "sw", "--no-cache"], capsys)
    assert reason(code, err) == "2 model(s) with estimated SW epochs (--fail-on sw)"
    code, out, err = run(["audit", two_sw / "clean.onnx", "--fail-on", "sw", "--no-cache"], capsys)
    assert code == 0 and "exit 1" not in err


def test_audit_fail_on_error_names_the_compile_errors(tmp_path, capsys):
    shutil.copy(SAMPLES / "uint8_default_quant.onnx", tmp_path / "u8.onnx")
    save(softmax_chain(1), tmp_path / "ok.onnx")
    code, out, err = run(["audit", tmp_path, "--fail-on", "error", "--no-cache"], capsys)
    assert reason(code, err) == "1 model(s) with a predicted compile error (--fail-on error)"


def test_audit_max_ms(two_sw, capsys):
    code, out, err = run(["audit", two_sw, "--max-ms", "1e-9", "--no-cache"], capsys)
    assert reason(code, err).startswith("3 model(s) over the --max-ms budget of") and err.rstrip().endswith("(--max-ms)")


def test_audit_baseline_regression(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save(softmax_chain(1), tmp_path / "m.onnx")
    assert run(["audit", "m.onnx", "--write-baseline", "b.json", "--no-cache"], capsys)[0] == 0
    save(softmax_chain(2), tmp_path / "m.onnx")
    code, out, err = run(["audit", "m.onnx", "--baseline", "b.json", "--no-cache"], capsys)
    assert reason(code, err) == "3 finding(s) new or worse than the baseline b.json (--baseline)"


def test_fix_verification_failure(tmp_path, rules_dir, capsys):  # noqa: F811 - the fixture
    src = _relu_model(tmp_path / "m.onnx")
    code, out, err = run(["fix", src, "--rules", rules_dir, "--select", "TST902"], capsys)
    assert reason(code, err) == "verification failed for rule(s) TST902"


def test_fix_fail_on_sw_and_max_ms(tmp_path, capsys):
    save(softmax_chain(2), tmp_path / "m.onnx")
    code, out, err = run([tmp_path / "m.onnx", "--dry-run", "--fail-on", "sw"], capsys)
    assert reason(code, err) == "2 estimated SW epoch(s) remain (--fail-on sw)"
    code, out, err = run([tmp_path / "m.onnx", "--dry-run", "--max-ms", "1e-9"], capsys)
    assert reason(code, err).startswith("1 model(s) over the --max-ms budget of")


def test_fix_fail_on_error_with_a_compile_error_left(tmp_path, capsys):
    shutil.copy(SAMPLES / "uint8_default_quant.onnx", tmp_path / "u8.onnx")
    code, out, err = run([tmp_path / "u8.onnx", "--dry-run", "--ignore", "NAF014"], capsys)
    assert reason(code, err).startswith("the model still has 1 predicted compile error(s) (--fail-on error)")


def test_fix_never_worse(tmp_path, capsys, monkeypatch):
    """A run whose result is estimated worse than the input exits 1 and says so last."""
    import fixer.api as api

    save(softmax_chain(1), tmp_path / "m.onnx")
    monkeypatch.setattr(api, "_worse_than_input", lambda *a, **k: ("m.onnx: estimated worse (a test).", "x"))
    code, out, err = run([tmp_path / "m.onnx", "--dry-run"], capsys)
    assert reason(code, err) == "the fixed model is estimated worse than the input (nafix never makes a model worse)"


def test_a_failed_check_raised_as_an_error_ends_with_its_reason(tmp_path, capsys, monkeypatch):
    """A check that fails as an error (the rewrites before quantization failing their gate) prints its
    error line, then the reason line."""
    import fixer.api as api
    from fixer.errors import VerificationError

    save(softmax_chain(1), tmp_path / "m.onnx")

    def failing(*a, **k):
        raise VerificationError("m.onnx: the rewrites before quantization failed verification (rules X); nothing written.")

    monkeypatch.setattr(api, "fix", failing)
    code, out, err = run([tmp_path / "m.onnx", "--dry-run"], capsys)
    assert reason(code, err) == "verification failed (the error above)"
    assert err.splitlines()[-2].startswith("error: m.onnx: the rewrites before quantization failed verification")
