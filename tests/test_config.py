"""[tool.nafix] in pyproject.toml / nafix.toml: discovery, validation, precedence, per-path, `nafix config`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import run_cli as run

SAMPLE = Path(__file__).resolve().parent.parent / "sample_models" / "classifier_softmax.onnx"

PYPROJECT = """\
[project]
name = "scratch"

[tool.nafix]
core = "2.2"
stedgeai-option = ["--input-data-type float32"]
fail-on = "sw"
ignore = ["NAF005"]

[tool.nafix.per-path."models/ocr/*.onnx"]
input-shape = ["image=1,3,64,64"]
"""


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / "models" / "ocr").mkdir(parents=True)
    shutil.copy(SAMPLE, tmp_path / "models" / "ocr" / "c.onnx")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _json(out: str) -> dict:
    return json.loads(out)


def test_audit_file_equals_explicit_flags(repo, capsys):
    code_file, out_file, _ = run(["audit", "models/ocr/c.onnx", "-f", "json", "--no-cache"], capsys)
    (repo / "pyproject.toml").unlink()  # the same run with every value on the command line instead
    code_cli, out_cli, _ = run(["audit", "models/ocr/c.onnx", "-f", "json", "--no-cache", "--core", "2.2",
                                "--stedgeai-option", "--input-data-type float32", "--fail-on", "sw",
                                "--input-shape", "image=1,3,64,64"], capsys)
    code_none, out_none, _ = run(["audit", "models/ocr/c.onnx", "-f", "json", "--no-cache"], capsys)
    assert code_file == code_cli == 1  # fail-on = "sw" from the file: the sample has SW epochs
    assert code_none == 0  # without the file, audit never fails on SW
    assert _json(out_file) == _json(out_cli)
    est = _json(out_file)["models"][0]["estimate"]
    assert est.get("core") == "2.2" or "2.2" in json.dumps(est)


def test_fix_ignore_from_file_equals_flag(repo, capsys):
    code_file, out_file, _ = run(["fix", "models/ocr/c.onnx", "--dry-run", "-f", "json"], capsys)
    (repo / "pyproject.toml").unlink()
    code_cli, out_cli, _ = run(["fix", "models/ocr/c.onnx", "--dry-run", "-f", "json", "--ignore", "NAF005",
                                "--core", "2.2", "--stedgeai-option", "--input-data-type float32",
                                "--fail-on", "sw", "--input-shape", "image=1,3,64,64"], capsys)
    code_none, out_none, _ = run(["fix", "models/ocr/c.onnx", "--dry-run", "-f", "json"], capsys)
    assert code_file == code_cli
    a, b, c = _json(out_file), _json(out_cli), _json(out_none)
    assert a == b
    ran = json.dumps(a["rules_run"])
    assert "NAF005" not in ran and "NAF005" in json.dumps(c["rules_run"])


def test_cli_flag_overrides_file(repo, capsys):
    code, _, _ = run(["audit", "models/ocr/c.onnx", "-f", "json", "--no-cache", "--fail-on", "never"], capsys)
    assert code == 0
    code, out, _ = run(["audit", "models/ocr/c.onnx", "-f", "json", "--no-cache", "--core", "2.1"], capsys)
    assert '"2.1"' in out and '"2.2"' not in out


def test_per_path_applies_only_to_matching_models(repo, capsys):
    # a shape that does not fit the model: the error proves the per-path value reached the model
    (repo / "pyproject.toml").write_text(PYPROJECT.replace("image=1,3,64,64", "nosuchinput=1,3,8,8"))
    shutil.copy(SAMPLE, repo / "models" / "other.onnx")
    code, _, err = run(["audit", "models/ocr/c.onnx", "-f", "json", "--no-cache"], capsys)
    assert code == 2 and "nosuchinput" in err
    code, _, err = run(["audit", "models/other.onnx", "-f", "json", "--no-cache", "--fail-on", "never"], capsys)
    assert code == 0, err


def test_later_per_path_table_wins(repo, capsys):
    (repo / "pyproject.toml").write_text(PYPROJECT + '\n[tool.nafix.per-path."models/ocr/c.onnx"]\ncore = "2.1"\n')
    code, out, _ = run(["config", "models/ocr/c.onnx"], capsys)
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("core ="))
    assert "'2.1'" in line and 'per-path."models/ocr/c.onnx".core' in line


def test_discovery_upwards_and_skip_pyproject_without_table(repo, capsys, monkeypatch):
    sub = repo / "a" / "b"
    sub.mkdir(parents=True)
    (repo / "a" / "pyproject.toml").write_text('[project]\nname = "inner"\n')  # no [tool.nafix]: skipped
    monkeypatch.chdir(sub)
    code, out, _ = run(["config"], capsys)
    assert code == 0
    assert f"# config: {repo / 'pyproject.toml'}" in out
    assert "fail-on = 'sw'" in out


def test_nafix_toml_top_level_keys_and_relative_paths(repo, capsys, monkeypatch):
    sub = repo / "sub"
    sub.mkdir()
    (sub / "nafix.toml").write_text('fail-on = "error"\nbaseline = "base/b.json"\n')
    monkeypatch.chdir(sub)
    code, out, _ = run(["config"], capsys)
    assert code == 0
    assert f"# config: {sub / 'nafix.toml'}" in out
    assert f"fail-on = 'error'  # {sub / 'nafix.toml'}:fail-on" in out
    assert f"baseline = '{sub / 'base' / 'b.json'}'" in out  # relative to the config file, not the cwd
    assert "core = None  # default" in out


@pytest.mark.parametrize("body, key, expected", [
    ('core = true', "tool.nafix.core", "expected a string"),
    ('fail-on = "maybe"', "tool.nafix.fail-on", "expected one of"),
    ('timeout = "soon"', "tool.nafix.timeout", "expected a number"),
    ('jobs = 1.5', "tool.nafix.jobs", "expected an integer"),
    ('verbose = "yes"', "tool.nafix.verbose", "expected a boolean"),
    ('ignore = ["NAF001", 3]', "tool.nafix.ignore", "expected a list of strings"),
    ('no-such-option = 1', "tool.nafix.no-such-option", "unknown key"),
    ('output = "x.json"', "tool.nafix.output", "unknown key"),
    ('per-path = 3', "tool.nafix.per-path", "expected a table"),
    ('[tool.nafix.per-path."*.onnx"]\ncore = 2.2', None, None),  # a number is read as the string "2.2"
    ('[tool.nafix.per-path."*.onnx"]\nfail-on = 1', 'tool.nafix.per-path."*.onnx".fail-on', "expected one of"),
])
def test_bad_values_are_one_error_line(repo, capsys, body, key, expected):
    (repo / "pyproject.toml").write_text(f"[tool.nafix]\n{body}\n")
    code, out, err = run(["audit", "models/ocr/c.onnx", "-f", "json", "--no-cache"], capsys)
    if key is None:
        assert code == 0 and "error:" not in err
        return
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert f"{repo / 'pyproject.toml'}:{key}" in lines[0] and expected in lines[0]


def test_invalid_toml_names_the_file(repo, capsys):
    (repo / "pyproject.toml").write_text("[tool.nafix\ncore = 1\n")
    code, _, err = run(["audit", "models/ocr/c.onnx"], capsys)
    assert code == 2
    assert err.count("error:") == 1 and str(repo / "pyproject.toml") in err and "not valid TOML" in err


def test_config_command_shows_sources(repo, capsys):
    code, out, _ = run(["config", "models/ocr/c.onnx", "--command", "fix"], capsys)
    assert code == 0
    cfg = repo / "pyproject.toml"
    assert f"core = '2.2'  # {cfg}:tool.nafix.core" in out
    assert f"ignore = ['NAF005']  # {cfg}:tool.nafix.ignore" in out
    assert f"input-shape = ['image=1,3,64,64']  # {cfg}:tool.nafix.per-path.\"models/ocr/*.onnx\".input-shape" in out
    assert "seed = 0  # default" in out
    code, out, _ = run(["config"], capsys)  # no model: the per-path value is not shown
    assert "input-shape = None  # default" in out
    code, _, err = run(["config", "--command", "nope"], capsys)
    assert code == 2 and err.startswith("error:")


def test_no_config_is_defaults(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(["config"], capsys)
    assert code == 0 and "none found" in out and "fail-on = 'never'  # default" in out


def test_audit_groups_models_by_per_path_values(repo, capsys):
    # two models in one audit, only one matched by the per-path table: each gets its own values
    (repo / "pyproject.toml").write_text(PYPROJECT.replace("image=1,3,64,64", "nosuchinput=1,3,8,8"))
    shutil.copy(SAMPLE, repo / "models" / "other.onnx")
    code, out, err = run(["audit", "models/ocr/c.onnx", "models/other.onnx", "-f", "json", "--no-cache"], capsys)
    assert code == 2
    rows = {Path(m["path"]).name: m for m in _json(out)["models"]}
    assert "nosuchinput" in (rows["c.onnx"].get("error") or "")
    assert not rows["other.onnx"].get("error") and rows["other.onnx"]["estimate"]["sw_epochs"] > 0
    # the flag on the command line wins over the per-path table for every model
    code, out, err = run(["audit", "models/ocr/c.onnx", "models/other.onnx", "-f", "json", "--no-cache",
                          "--input-shape", "image=1,3,64,64"], capsys)
    assert code == 1 and not any(m.get("error") for m in _json(out)["models"])
