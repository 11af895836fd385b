"""Baselines: ``--write-baseline`` records today's findings, ``--baseline`` fails only on what is new
or worse, improvements are reported and never fail, a corrupt baseline is one clear error."""

from __future__ import annotations

import copy
import json

import pytest

from fixer.zoo.baseline import compare, load_baseline, make_baseline
from fixer.errors import InputError
from tests.helpers import save
from tests.test_zoo import run, softmax_chain


def row(path="m.onnx", nodes=("a",), ratio=0.8, fits=True, compile_errors=(), sha="1" * 64):
    return {
        "path": path, "sha256": sha, "error": None,
        "estimate": {"epochs": 10, "sw_epochs": len(nodes), "hw_epochs": 10 - len(nodes), "hw_ratio": ratio},
        "sw_nodes": [{"name": n, "op_type": "Softmax", "constraints": ["op_supported"],
                      "reasons": [f"Softmax runs in SW ('{n}')"]} for n in nodes],
        "findings": [{"constraint": c, "requirement": f"{c} requirement", "detail": "d", "tag": "OBS",
                      "severity": "compile_error"} for c in compile_errors],
        "memory": {"fits_on_chip": fits},
    }


def report(*rows):
    return {"profile": "stm32n6", "models": list(rows)}


def kinds(changes):
    return sorted(c.kind for c in changes)


def test_unchanged_model_has_no_regression():
    base = make_baseline(report(row()))
    cmp = compare(report(row()), base)
    assert cmp.regressions == [] and cmp.improvements == []


@pytest.mark.parametrize("now,expected", [
    (row(nodes=("a", "b"), ratio=0.7), ["lower_hw_ratio", "new_sw_node"]),
    (row(ratio=0.79), ["lower_hw_ratio"]),
    (row(fits=False), ["no_longer_fits"]),
    (row(compile_errors=("uint8_activations",)), ["compile_error"]),
])
def test_new_or_worse_is_a_regression(now, expected):
    cmp = compare(report(now), make_baseline(report(row())))
    assert kinds(cmp.regressions) == expected


def test_a_node_failing_one_more_constraint_is_worse():
    now = row()
    now["sw_nodes"][0]["constraints"].append("max_channels")
    cmp = compare(report(now), make_baseline(report(row())))
    assert kinds(cmp.regressions) == ["worse_sw_node"] and "max_channels" in cmp.regressions[0].message


def test_improvements_never_regress():
    base = make_baseline(report(row(nodes=("a", "b"), ratio=0.7, fits=False, compile_errors=("x",))))
    cmp = compare(report(row(nodes=("a",), ratio=0.8, fits=True)), base)
    assert cmp.regressions == []
    assert kinds(cmp.improvements) == ["compile_error_fixed", "fits_now", "fixed_sw_node", "higher_hw_ratio"]


def test_a_model_missing_from_the_baseline_is_new_but_a_renamed_one_is_found_by_hash():
    base = make_baseline(report(row(path="old/name.onnx", sha="f" * 64)))
    assert kinds(compare(report(row(path="new.onnx", sha="e" * 64)), base).regressions) == ["new_sw_node"]
    assert compare(report(row(path="new.onnx", sha="f" * 64)), base).regressions == []
    assert kinds(compare(report(row(path="new.onnx", nodes=(), fits=False, sha="e" * 64)), base).regressions) == ["no_longer_fits"]


@pytest.mark.parametrize("text,needle", [
    ("{oops", "not valid JSON"),
    ('{"schema": "other"}', "not a nafix baseline"),
    ('{"schema": "nafix-baseline/1", "models": []}', "models must be an object, not a list"),
    ('{"schema": "nafix-baseline/1", "models": {"m.onnx": {"sw_nodes": {}, "hw_ratio": "x", "fits_on_chip": true}}}', "hw_ratio"),
    ('{"schema": "nafix-baseline/1", "models": {"m.onnx": {"sw_nodes": [], "hw_ratio": 1, "fits_on_chip": true}}}', "sw_nodes"),
])
def test_corrupt_baseline_is_one_error_line(tmp_path, capsys, text, needle):
    bad = tmp_path / "nafix-baseline.json"
    bad.write_text(text)
    with pytest.raises(InputError, match=needle.replace('"', '.')):
        load_baseline(bad)
    model = tmp_path / "m.onnx"
    save(softmax_chain(1), model)
    code, out, err = run(["audit", model, "--baseline", bad], capsys)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("error: ") and str(bad) in line


def test_cli_write_then_compare(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save(softmax_chain(1), tmp_path / "m.onnx")
    code, out, err = run(["audit", "m.onnx", "--write-baseline", "b.json", "-f", "json"], capsys)
    assert code == 0 and json.loads(out)["models"][0]["sw_nodes"][0]["name"] == "softmax0"
    base = json.loads((tmp_path / "b.json").read_text())
    assert base["schema"] == "nafix-baseline/1" and base["models"]["m.onnx"]["sw_nodes"]["softmax0"]["op_type"] == "Softmax"
    code, out, err = run(["audit", "m.onnx", "--baseline", "b.json", "--fail-on", "sw", "-f", "json"], capsys)
    assert code == 0, err  # the known SW node does not fail, even with --fail-on sw
    assert json.loads(out)["baseline"] == {"file": "b.json", "regressions": [], "improvements": []}
    save(softmax_chain(0), tmp_path / "m.onnx")
    code, out, err = run(["audit", "m.onnx", "--baseline", "b.json"], capsys)
    assert code == 0 and "improved: m.onnx: 'softmax0' (Softmax) no longer runs in SW" in err
    save(softmax_chain(2), tmp_path / "m.onnx")
    code, out, err = run(["audit", "m.onnx", "--baseline", "b.json"], capsys)
    assert code == 1 and "new: m.onnx: new SW node 'softmax1'" in err
    assert "new: m.onnx: estimated HW ratio fell from" in err
    assert "new: m.onnx: estimated time rose from" in err  # one more SW Softmax: more than the 5 % tolerance
    assert "3 finding(s) new or worse than the baseline b.json" in err
    missing = run(["audit", "m.onnx", "--baseline", "nope.json"], capsys)
    assert missing[0] == 2 and "baseline file not found" in missing[2]


def test_write_baseline_refreshes_its_own_file_but_never_a_foreign_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save(softmax_chain(1), tmp_path / "m.onnx")
    assert run(["audit", "m.onnx", "--write-baseline", "b.json"], capsys)[0] == 0
    save(softmax_chain(2), tmp_path / "m.onnx")
    assert run(["audit", "m.onnx", "--write-baseline", "b.json"], capsys)[0] == 0  # nafix's own file: refreshed
    assert list(json.loads((tmp_path / "b.json").read_text())["models"]["m.onnx"]["sw_nodes"]) == ["softmax0", "softmax1"]
    (tmp_path / "notes.json").write_text('{"mine": true}\n')
    code, out, err = run(["audit", "m.onnx", "--write-baseline", "notes.json"], capsys)
    assert code == 2 and "not written by nafix" in err and len(err.splitlines()) == 1
    assert (tmp_path / "notes.json").read_text() == '{"mine": true}\n'


@pytest.mark.parametrize("fmt", ["sarif", "html", "github", "markdown", "json", "table"])
def test_every_format_can_rewrite_its_own_output(tmp_path, capsys, fmt):
    save(softmax_chain(1), tmp_path / "m.onnx")
    dest = tmp_path / f"report.{fmt}"
    for _ in range(2):
        code, out, err = run(["audit", tmp_path / "m.onnx", "-f", fmt, "-o", dest], capsys)
        assert code == 0 and f"wrote {dest}" in err, err
