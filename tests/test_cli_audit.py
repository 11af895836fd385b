"""``nafix audit``: formats, exit codes, folder audits, and every kind of bad input.

Most tests run the CLI in-process (``fixer.cli.main``) with capsys; a few run the installed
console script to prove it works end to end, including what really lands on stderr.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers import run_cli as run
from tests.helpers import QDQ, make_model, save, sha256_tree

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
SOFTMAX = SAMPLES / "classifier_softmax.onnx"
NAFIX = Path(sys.executable).parent / "nafix"
#: core 2.2 with float graph edges kept (as MobileFaceNet's report was built): the figures below assume
#: the input copy epoch and the SW conversions at the float edges (NEURAL_ART.md s7); both option forms
FLOAT_IO = ["--core", "2.2", "--stedgeai-option", "--input-data-type float32",
            "--stedgeai-option=--output-data-type float32"]



def no_sw_model():
    """int8 input -> DQ -> Conv -> Q -> int8 output: nothing for the CPU to do."""
    b = QDQ()
    y = b.op("Conv", [b.input("x", [1, 2, 4, 4]), b.weight("w", [4, 2, 1, 1])], name="conv")
    b.output(y)
    return b.model()


@pytest.fixture
def no_sw(tmp_path) -> Path:
    p = tmp_path / "no_sw.onnx"
    save(no_sw_model(), p)
    return p


# ---------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------


def test_json_schema(capsys):
    code, out, err = run(["audit", *FLOAT_IO, SAMPLES, "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["profile"] == "stm32n6" and data["estimated"] is True and data["nafix_version"]
    names = sorted(Path(m["path"]).name for m in data["models"])
    assert names == sorted(p.name for p in SAMPLES.glob("*.onnx"))
    for m in data["models"]:
        assert isinstance(m["path"], str) and m["error"] is None
        e = m["estimate"]
        assert isinstance(e["epochs"], int) and isinstance(e["sw_epochs"], int)
        assert 0 <= e["sw_epochs"] <= e["epochs"]
        assert isinstance(e["hw_ratio"], float) and e["hw_ratio"] == round((e["epochs"] - e["sw_epochs"]) / e["epochs"], 4)
        for n in m["sw_nodes"]:
            assert isinstance(n["name"], str) and isinstance(n["op_type"], str)
            # each reason names the node: the SW node itself, or the node whose lowering inserts the epoch
            named = [n["name"], *n["from_nodes"]]
            assert n["reasons"] and all(isinstance(r, str) and any(f"'{x}'" in r for x in named) for r in n["reasons"])
            assert n["unit"] in ("SW", "hybrid") and n["why"], n
        mem = m["memory"]
        assert isinstance(mem["weights_bytes"], int) and isinstance(mem["peak_activation_bytes"], int)
        assert isinstance(mem["fits_on_chip"], bool)
    softmax = next(m for m in data["models"] if m["path"].endswith("classifier_softmax.onnx"))
    assert [n["name"] for n in softmax["sw_nodes"]] == ["image_QuantizeLinear", "softmax", "probs_DequantizeLinear"]
    assert softmax["estimate"]["sw_epochs"] == 3
    big = next(m for m in data["models"] if m["path"].endswith("big_activations.onnx"))
    assert big["memory"]["fits_on_chip"] is False


def test_markdown_format(capsys):
    code, out, err = run(["audit", *FLOAT_IO, SOFTMAX, "--format", "markdown"], capsys)
    assert code == 0, err
    assert out.startswith("# nafix audit (profile stm32n6)")
    assert "| `classifier_softmax.onnx` | ok | 9 | 3 | 66.7% |" in out
    assert "## classifier_softmax.onnx" in out
    assert "| `softmax` | Softmax | 1 SW | Softmax runs in SW unless stedgeai is given --expand-softmax" in out


def test_table_format(capsys):
    code, out, err = run(["audit", *FLOAT_IO, SOFTMAX], capsys)
    assert code == 0, err
    assert "nafix audit - profile stm32n6" in out
    assert "classifier_softmax.onnx: estimated 9 epochs, 3 SW" in out
    assert "Softmax runs in SW unless stedgeai is given --expand-softmax" in out
    assert "'softmax' is a Softmax" in out
    assert "estimated by nafix's placement" in out


def test_table_format_shows_bracketed_file_names_verbatim(tmp_path, capsys):
    # file names are text, not Rich markup: '[red]' must not vanish into a style
    p = tmp_path / "model[red].onnx"
    shutil.copy(SOFTMAX, p)
    dest = tmp_path / "report.txt"
    code, out, err = run(["audit", *FLOAT_IO, p, "-o", dest], capsys)
    assert code == 0, err
    text = dest.read_text()
    assert "│ model[red].onnx " in text  # the summary table row
    assert "model[red].onnx: estimated 9 epochs" in text  # the per-model line


def test_expand_softmax_option(capsys):
    code, out, err = run(["audit", *FLOAT_IO, SOFTMAX, "--format", "json", "--stedgeai-option", "--expand-softmax"], capsys)
    assert code == 0, err
    (m,) = json.loads(out)["models"]
    assert [n["op_type"] for n in m["sw_nodes"]] == ["QuantizeLinear", "DequantizeLinear"]


# ---------------------------------------------------------------------------------------------
# Exit codes, folders, -o
# ---------------------------------------------------------------------------------------------


def test_fail_on_sw_exits_1_when_sw_is_predicted(capsys):
    assert run(["audit", *FLOAT_IO, SOFTMAX, "--fail-on", "sw", "--format", "json"], capsys)[0] == 1
    assert run(["audit", SOFTMAX, "--format", "json"], capsys)[0] == 0  # default: never


def test_fail_on_sw_exits_0_without_sw(no_sw, capsys):
    code, out, err = run(["audit", *FLOAT_IO, no_sw, "--fail-on", "sw", "--format", "json"], capsys)
    assert code == 0, err
    (m,) = json.loads(out)["models"]
    # the conv epoch + the input copy epoch
    assert m["sw_nodes"] == [] and m["estimate"]["sw_epochs"] == 0 and m["estimate"]["epochs"] == 2


def test_folder_with_one_corrupt_file_reports_the_others(tmp_path, capsys):
    folder = tmp_path / "zoo"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(SOFTMAX, folder / "a_softmax.onnx")
    save(no_sw_model(), folder / "sub" / "c_no_sw.onnx")
    (folder / "b_corrupt.onnx").write_text("this is not a protobuf\n")
    before = sha256_tree(folder)
    code, out, err = run(["audit", *FLOAT_IO, folder, "--format", "json"], capsys)
    assert code == 2
    rows = {Path(m["path"]).name: m for m in json.loads(out)["models"]}
    assert sorted(rows) == ["a_softmax.onnx", "b_corrupt.onnx", "c_no_sw.onnx"]
    assert "b_corrupt.onnx" in rows["b_corrupt.onnx"]["error"] and rows["b_corrupt.onnx"]["estimate"] is None
    assert rows["a_softmax.onnx"]["error"] is None and rows["a_softmax.onnx"]["estimate"]["sw_epochs"] == 3
    assert rows["c_no_sw.onnx"]["error"] is None and rows["c_no_sw.onnx"]["estimate"]["sw_epochs"] == 0
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "b_corrupt.onnx" in lines[0]
    assert sha256_tree(folder) == before


def test_folder_error_row_in_table_and_markdown(tmp_path, capsys):
    shutil.copy(SOFTMAX, tmp_path / "a.onnx")
    (tmp_path / "b.onnx").write_bytes(b"")
    code, out, err = run(["audit", *FLOAT_IO, tmp_path, "--format", "markdown"], capsys)
    assert code == 2
    assert "| `a.onnx` | ok | 9 | 3 |" in out
    assert "b.onnx` | error |" in out and "the file is empty" in out
    code, out, err = run(["audit", *FLOAT_IO, tmp_path], capsys)
    assert code == 2 and "a.onnx: estimated 9 epochs, 3 SW" in out and "b.onnx" in out
    (line,) = err.splitlines()
    assert line.startswith("error: ") and line.endswith("b.onnx: the file is empty, not an ONNX model.")


@pytest.mark.parametrize("fmt,check", [
    ("json", lambda text: json.loads(text)["models"][0]["estimate"]["sw_epochs"] == 3),
    ("markdown", lambda text: text.startswith("# nafix audit")),
    ("table", lambda text: "classifier_softmax.onnx" in text and "Softmax runs in SW" in text),
])
def test_output_file(tmp_path, capsys, fmt, check):
    dest = tmp_path / "reports" / f"audit.{fmt}"
    code, out, err = run(["audit", *FLOAT_IO, SOFTMAX, "--format", fmt, "-o", dest], capsys)
    assert code == 0, err
    assert out == ""
    assert dest.is_file() and check(dest.read_text())
    assert f"wrote {dest}" in err
    assert not list(dest.parent.glob(".*.tmp"))  # atomic write left no temporary behind


# ---------------------------------------------------------------------------------------------
# Bad input: exit 2, exactly one 'error:' line, no traceback, input untouched
# ---------------------------------------------------------------------------------------------


def _external_data_model(folder: Path, location: str | None) -> Path:
    """A model whose weights live in external data; ``location`` rewrites the stored location
    (None: keep it and delete the data file)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ext.onnx"
    onnx.save_model(no_sw_model(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    if location is None:
        (folder / "weights.bin").unlink()
        return path
    m = onnx.load(str(path), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    path.write_bytes(m.SerializeToString())
    return path


def _opset_model(folder: Path, opset: int) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    p = folder / f"opset{opset}.onnx"
    save(make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [x], [y], opset=opset, infer=False), p)
    return p


def _cycle_model(folder: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="add_a"),
             helper.make_node("Relu", ["a"], ["b"], name="relu_b"),
             helper.make_node("Identity", ["b"], ["y"], name="out")]
    p = folder / "cycle.onnx"
    save(make_model(nodes, [x], [y], infer=False), p)
    return p


def _dangling_model(folder: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    p = folder / "dangling.onnx"
    save(make_model([helper.make_node("Add", ["x", "nope"], ["y"], name="add")], [x], [y], infer=False), p)
    return p


def _case(name: str, tmp: Path) -> tuple[list, str]:
    """(CLI arguments, a fragment the error line must contain) for bad-input case ``name``."""
    if name == "missing file":
        return [tmp / "missing.onnx"], "missing.onnx: no such file"
    if name == "folder without onnx":
        (tmp / "empty").mkdir()
        (tmp / "empty" / "notes.txt").write_text("no models here")
        return [tmp / "empty"], "no .onnx or .tflite model found"
    if name == "text renamed onnx":
        (tmp / "text.onnx").write_text("name,value\nconv,3\n" * 20)
        return [tmp / "text.onnx"], "not an ONNX model"
    if name == "truncated protobuf":
        data = SOFTMAX.read_bytes()
        (tmp / "half.onnx").write_bytes(data[: len(data) // 2])
        return [tmp / "half.onnx"], "half.onnx"
    if name == "empty file":
        (tmp / "empty.onnx").write_bytes(b"")
        return [tmp / "empty.onnx"], "the file is empty"
    if name == "external data missing":
        return [_external_data_model(tmp / "m", None)], "external data file 'weights.bin'"
    if name == "external data ../secret.bin":
        (tmp / "secret.bin").write_bytes(b"\0" * 4096)  # exists: only the traversal check may stop it
        return [_external_data_model(tmp / "m", "../secret.bin")], "outside the model's folder"
    if name == "external data absolute path":
        secret = tmp / "abs_secret.bin"
        secret.write_bytes(b"\0" * 4096)
        return [_external_data_model(tmp / "m", str(secret))], "absolute path"
    if name == "external data too short":
        path = _external_data_model(tmp / "m", "weights.bin")
        data = (tmp / "m" / "weights.bin").read_bytes()
        (tmp / "m" / "weights.bin").write_bytes(data[: len(data) // 2])
        return [path], "is too short for tensor"
    if name == "opset 99":
        return [_opset_model(tmp, 99)], "opset 99 is outside what nafix supports"
    if name == "opset 5":
        return [_opset_model(tmp, 5)], "opset 5 is outside what nafix supports"
    if name == "cycle":
        return [_cycle_model(tmp)], "has a cycle"
    if name == "dangling input":
        return [_dangling_model(tmp)], "reads tensor 'nope'"
    if name == "input-shape wrong name":
        return [SOFTMAX, "--input-shape", "nope=1,3,64,64"], "'nope', which is not a graph input (inputs: 'image')"
    if name == "input-shape wrong rank":
        return [SOFTMAX, "--input-shape", "image=1,3,64"], "has 3 dimensions but input 'image' has 4"
    if name == "input-shape conflicts with a fixed dim":
        return [SOFTMAX, "--input-shape", "image=1,3,32,32"], "axis 2 is fixed to 64 in the model, not 32"
    if name == "input-shape bad syntax":
        return [SOFTMAX, "--input-shape", "image=1,3,a,b"], "is not a comma-separated list of integers"
    if name == "input-shape no name":
        return [SOFTMAX, "--input-shape", "1,3,64,64"], "is not of the form NAME=1,3,224,224"
    if name == "input-shape zero dim":
        return [SOFTMAX, "--input-shape", "image=1,0,64,64"], "every dimension must be a positive integer"
    if name == "unknown target profile":
        return [SOFTMAX, "--target-profile", "stm99"], "unknown target profile 'stm99'"
    if name == "missing mpool file":
        return [SOFTMAX, "--mpool", tmp / "none.mpool"], "none.mpool"
    if name == "unknown stedgeai option":
        return [SOFTMAX, "--stedgeai-option", "--turbo"], "unknown stedgeai option(s) --turbo"
    if name == "bracketed path":
        (tmp / "models[/old]").mkdir(parents=True)  # 'models[' / 'old]': '[/old]' reads as a Rich closing tag
        return [tmp / "models[/old]" / "x.onnx"], "models[/old]"
    if name == "long path":
        deep = tmp.joinpath(*["a_rather_long_folder_name"] * 6)
        deep.mkdir(parents=True)
        return [deep / "model_with_a_long_name.onnx"], "model_with_a_long_name.onnx: no such file"
    raise KeyError(name)


BAD_CASES = ["missing file", "folder without onnx", "text renamed onnx", "truncated protobuf", "empty file",
             "external data missing", "external data ../secret.bin", "external data absolute path",
             "external data too short",
             "opset 99", "opset 5", "cycle", "dangling input", "input-shape wrong name", "input-shape wrong rank",
             "input-shape conflicts with a fixed dim", "input-shape bad syntax", "input-shape no name",
             "input-shape zero dim", "unknown target profile", "missing mpool file", "unknown stedgeai option", "bracketed path", "long path"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input(case, tmp_path, capsys, caplog):
    args, fragment = _case(case, tmp_path)
    before = sha256_tree(tmp_path)
    with caplog.at_level(logging.WARNING):
        code, out, err = run(["audit", *args], capsys)
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in err + out
    assert out == ""
    # nothing that the real CLI would print as a log line on stderr
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert sha256_tree(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# Dynamic dimensions
# ---------------------------------------------------------------------------------------------


def dynamic_model(shape):
    b = QDQ()
    y = b.op("Relu", [b.input("x", shape)], name="relu")
    b.output(y)
    return b.model()


def test_dynamic_dim_reported_and_pinned(tmp_path, capsys):
    p = tmp_path / "dyn.onnx"
    save(dynamic_model([1, 2, "height", 4]), p)
    code, out, err = run(["audit", p, "--format", "json"], capsys)
    assert code == 0, err
    (m,) = json.loads(out)["models"]
    assert m["dynamic_dims"] == ["input 'x' axis 2 is dynamic ('height')"]
    (f,) = [f for f in m["findings"] if f["constraint"] == "static_shape"]
    assert f["severity"] == "compile_error" and "--input-shape" in f["requirement"]
    assert f["detail"] == "input 'x' axis 2 is dynamic ('height')"

    code, out, err = run(["audit", p, "--format", "json", "--input-shape", "x=1,2,8,4"], capsys)
    assert code == 0, err
    (m,) = json.loads(out)["models"]
    assert m["dynamic_dims"] == ["input 'x' axis 2 ('height') pinned to 8"]
    assert not [f for f in m["findings"] if f["constraint"] == "static_shape"]
    assert m["sw_nodes"] == []
    assert m["memory"]["peak_activation_bytes"] == 2 * (1 * 2 * 8 * 4)


def test_dynamic_batch_is_pinned_to_one(tmp_path, capsys):
    p = tmp_path / "batch.onnx"
    save(dynamic_model(["N", 2, 4, 4]), p)
    code, out, err = run(["audit", p, "--format", "json"], capsys)
    assert code == 0, err
    (m,) = json.loads(out)["models"]
    assert m["dynamic_dims"] == ["input 'x' axis 0 ('N') pinned to 1"]
    assert not [f for f in m["findings"] if f["constraint"] == "static_shape"]
    assert m["sw_nodes"] == []


# ---------------------------------------------------------------------------------------------
# The installed console script
# ---------------------------------------------------------------------------------------------


def console(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(NAFIX), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.skipif(not NAFIX.exists(), reason="nafix console script not installed next to this Python")
def test_console_script_audit_json():
    r = console("audit", SOFTMAX, *FLOAT_IO, "--format", "json", "--fail-on", "sw")
    assert r.returncode == 1, r.stderr
    (m,) = json.loads(r.stdout)["models"]
    assert m["estimate"]["epochs"] == 9 and m["estimate"]["sw_epochs"] == 3
    assert r.stderr == "nafix: exit 1 \u2014 1 model(s) with estimated SW epochs (--fail-on sw)\n"  # its reason, last


@pytest.mark.skipif(not NAFIX.exists(), reason="nafix console script not installed next to this Python")
def test_console_script_bad_input_prints_one_line(tmp_path):
    empty = tmp_path / "a_folder_with_a_long_name_to_make_the_message_wider_than_eighty_columns"
    empty.mkdir()
    before = sha256_tree(tmp_path)
    r = console("audit", empty)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no .onnx or .tflite model found under"), r.stderr
    assert str(empty) in lines[0]
    assert r.stdout == ""
    assert sha256_tree(tmp_path) == before
