"""A closed stdout pipe (``nafix audit DIR | head``) ends no command early and changes no exit code:
the reader chose to stop reading; nafix finishes quietly and exits with the command's own result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"


def _nafix(args, *, close_stdout: bool):
    cmd = [sys.executable, "-c", "from fixer.cli import main; main()", *args]
    if not close_stdout:
        res = subprocess.run(cmd, capture_output=True, cwd=ROOT, timeout=300)
        return res.returncode, res.stdout, res.stderr
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    p.stdout.close()  # the reader is gone before nafix writes its first byte
    err = p.stderr.read()
    return p.wait(timeout=300), b"", err


@pytest.mark.parametrize("args", [
    ["audit", str(SAMPLES / "denoiser_257.onnx"), "--fail-on", "sw"],  # findings: exit 1
    ["audit", str(SAMPLES / "denoiser_257.onnx"), "--fail-on", "never"],  # exit 0
    ["audit", str(SAMPLES / "denoiser_257.onnx"), "--fail-on", "sw", "-f", "json"],
    ["rules"],
    ["rules", "NAF001"],
])
def test_closed_stdout_keeps_exit_code_and_is_silent(args):
    code, out, _ = _nafix(args, close_stdout=False)
    assert out  # the command does print something to stdout
    closed, _, err = _nafix(args, close_stdout=True)
    assert closed == code
    assert b"Traceback" not in err and b"error" not in err.lower() and b"BrokenPipe" not in err


def test_sw_findings_give_exit_one():
    code, _, _ = _nafix(["audit", str(SAMPLES / "denoiser_257.onnx"), "--fail-on", "sw"], close_stdout=False)
    assert code == 1
