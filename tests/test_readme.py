"""The README's set-up commands are what CI runs, and its main command works as documented."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Set-up", 1)[1].split("```", 2)[1]
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_readme_has_two_setup_commands_and_ci_runs_exactly_them():
    cmds = _setup_commands()
    assert len(cmds) == 2
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for cmd in cmds:
        assert cmd in ci, f".ci/run must run the README command verbatim: {cmd}"
    assert "pytest" in cmds[1] and "nafix" in cmds[0]


def test_readme_main_command_fixes_the_bundled_sample(tmp_path):
    first = _setup_commands()[0]
    m = re.search(r"\.venv/bin/nafix (\S+)$", first)
    assert m, first
    sample = ROOT / m.group(1)
    assert sample.exists()
    work = tmp_path / sample.name
    shutil.copy(sample, work)
    exe = Path(sys.executable).with_name("nafix")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "fixer.cli"]
    proc = subprocess.run(cmd + [str(work)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(work.with_name(work.stem + ".nafix.json").read_text())
    assert report["written"] and report["verification"]["ok"]
    assert report["estimate"]["after"]["hw_ratio"] > report["estimate"]["before"]["hw_ratio"]
    assert work.with_name(work.stem + ".nafix.onnx").exists()


def test_console_script_finds_the_rules_outside_the_source_tree(tmp_path):
    exe = Path(sys.executable).with_name("nafix")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "fixer.cli"]
    proc = subprocess.run(cmd + ["rules"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "NAF001" in proc.stdout


def test_readme_rule_example_loads_and_runs(tmp_path):
    """The 'Writing a rule' example is a working rule file, as a user would copy it."""
    from fixer.api import FixOptions, fix

    text = (ROOT / "README.md").read_text()
    block = text.split("### Writing a rule", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    rules = tmp_path / "myrules"
    rules.mkdir()
    (rules / "ACM001-pad-wide-convs.yaml").write_text(block)
    model = tmp_path / "d.onnx"
    shutil.copy(ROOT / "sample_models" / "denoiser_257.onnx", model)
    r = fix(model, FixOptions(rules_dirs=(str(rules),), select=("ACM001",), dry_run=True))
    assert {c.node for c in r.engine.changes} == {"conv_in", "conv_skip"}
    assert all(c.rule == "ACM001" and "pad" in c.detail.lower() for c in r.engine.changes)
    assert r.verified
