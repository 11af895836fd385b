"""Issue 8, class by class: no user file lost, no internal error on valid models, every bad input one
clear line. Each test names the class it covers; all run nafix in-process (``fixer.cli.main``)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from tests.helpers import run_cli as run

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "sample_models" / "classifier_softmax.onnx"
#: float graph edges for stedgeai: NAF004/NAF005 then fire on SOFTMAX, so fix writes model + JSON + .h
FLOAT_IO = ["--stedgeai-option=--input-data-type float32", "--stedgeai-option=--output-data-type float32"]
FAKE = ROOT / "tests" / "fake_stedgeai" / "stedgeai"
FLOAT = T.FLOAT



def contract(code: int, out: str, err: str, allowed=(0, 1, 2)) -> None:
    """Exit 0/1/2, at most one 'error:' line, never a traceback or an internal error."""
    assert code in allowed, (code, err)
    assert err.count("error:") <= 1, err
    assert "Traceback" not in err + out and "internal error" not in err, err


def one_error(code: int, err: str, *needles: str) -> str:
    """Exit 2 with exactly one line on stderr starting with 'error:' that holds every needle."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert code == 2, err
    assert len(errors) == 1, err
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


def save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    return h.make_model(h.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits)),
                        opset_imports=[h.make_opsetid("", opset)])


def tv(name, shape, elem=FLOAT):
    return h.make_tensor_value_info(name, elem, shape)


@pytest.fixture
def rewrite_float_models(monkeypatch):
    """These models are float (no Q/DQ): there every op is SW, so the engine's guard rightly keeps
    NAF006 off them (Sub -> Mul + Add is one SW epoch more; issue 11). The tests below are about what
    happens once a rewrite runs (the gate, subgraphs, --inputs), so for them the guard is lifted."""
    import fixer.engine

    monkeypatch.setattr(fixer.engine, "_worse", lambda new, old: False)

def sub_first(x: str = "x", out: str = "s", name: str = "sub", shape=(1, 4)):
    """Sub(constant, x): NAF006 rewrites it, so fix runs the equivalence gate."""
    return (h.make_node("Sub", ["c", x], [out], name=name),
            nh.from_array(np.linspace(-1, 1, int(np.prod(shape))).astype(np.float32).reshape(shape), "c"))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------
# Subgraphs (If/Loop/Scan), reading outer-scope tensors: analysed, fixed, never an internal error
# ---------------------------------------------------------------------------------------------


def if_model() -> onnx.ModelProto:
    """silero-VAD-like: an If whose branches read outer-scope tensors (one of them rewritten by NAF006);
    a branch node shares its name with a top-level node."""
    sub, c = sub_first()
    then_g = h.make_graph([h.make_node("MatMul", ["s", "W"], ["t0"], name="sub"),
                           h.make_node("Relu", ["t0"], ["then_out"], name="then_relu")],
                          "then", [], [tv("then_out", [1, 4])])
    else_g = h.make_graph([h.make_node("Sigmoid", ["x"], ["else_out"], name="else_sig")],
                          "else", [], [tv("else_out", [1, 4])])
    nodes = [sub, h.make_node("ReduceSum", ["s"], ["r"], name="rs", keepdims=0),
             h.make_node("Greater", ["r", "zero"], ["cond"], name="gt"),
             h.make_node("If", ["cond"], ["y0"], name="if", then_branch=then_g, else_branch=else_g),
             h.make_node("Relu", ["y0"], ["y"], name="post")]
    return model(nodes, [tv("x", [1, 4])], [tv("y", [1, 4])],
                 [c, nh.from_array(np.eye(4, dtype=np.float32), "W"), nh.from_array(np.array(-100, np.float32), "zero")])


def if_inner_only_model() -> onnx.ModelProto:
    """The tensor NAF006 rewrites is read only inside the then-branch (an implicit input of the If)."""
    sub, c = sub_first()
    then_g = h.make_graph([h.make_node("Relu", ["s"], ["then_out"], name="then_relu")], "then", [], [tv("then_out", [1, 4])])
    else_g = h.make_graph([h.make_node("Sigmoid", ["x"], ["else_out"], name="else_sig")], "else", [], [tv("else_out", [1, 4])])
    nodes = [sub, h.make_node("ReduceSum", ["x"], ["r"], name="rs", keepdims=0),
             h.make_node("Greater", ["r", "zero"], ["cond"], name="gt"),
             h.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    return model(nodes, [tv("x", [1, 4])], [tv("y", [1, 4])], [c, nh.from_array(np.array(-100, np.float32), "zero")])


def loop_model() -> onnx.ModelProto:
    sub, c = sub_first()
    body = h.make_graph([h.make_node("Add", ["v_in", "s"], ["v_out"], name="body_add"),
                         h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_id")],
                        "body", [tv("i", [], T.INT64), tv("cond_in", [], T.BOOL), tv("v_in", [1, 4])],
                        [tv("cond_out", [], T.BOOL), tv("v_out", [1, 4])])
    return model([sub, h.make_node("Loop", ["n", "cond", "x"], ["y"], name="loop", body=body)],
                 [tv("x", [1, 4])], [tv("y", [1, 4])],
                 [c, nh.from_array(np.array(3, np.int64), "n"), nh.from_array(np.array(True), "cond")])


def scan_model() -> onnx.ModelProto:
    sub, c = sub_first(shape=(3, 4))
    body = h.make_graph([h.make_node("Add", ["acc_in", "xi"], ["acc_out"], name="sadd"),
                         h.make_node("Mul", ["acc_out", "k"], ["yi"], name="smul")],
                        "sbody", [tv("acc_in", [4]), tv("xi", [4])], [tv("acc_out", [4]), tv("yi", [4])])
    return model([sub, h.make_node("Scan", ["init", "s"], ["final", "ys"], name="scan", body=body, num_scan_inputs=1)],
                 [tv("x", [3, 4])], [tv("final", [4]), tv("ys", [3, 4])],
                 [c, nh.from_array(np.zeros(4, np.float32), "init"), nh.from_array(np.float32(2.0), "k")])


@pytest.mark.parametrize("build,op", [(if_model, "If"), (if_inner_only_model, "If"), (loop_model, "Loop"),
                                      (scan_model, "Scan")])
def test_subgraph_models_audit_and_fix(rewrite_float_models, tmp_path, capsys, build, op):
    src = save(build(), tmp_path / "m.onnx")
    code, out, err = run(["audit", src, "-f", "json"], capsys)
    contract(code, out, err, allowed=(0,))
    row = json.loads(out)["models"][0]
    sw = [n for n in row["sw_nodes"] if n["op_type"] == op]
    assert len(sw) == 1 and "one SW epoch" in " ".join(sw[0]["reasons"]), sw
    # no node of a subgraph is listed on its own: the control-flow node stands for them
    assert not {n["name"] for n in row["sw_nodes"]} & {"then_relu", "else_sig", "body_add", "sadd", "smul"}
    code, out, err = run(["fix", src, "-o", str(tmp_path / "out") + "/", "-f", "json"], capsys)
    contract(code, out, err, allowed=(0,))
    rep = json.loads(out)
    assert [c["rule"] for c in rep["changes"]] == ["NAF006"] and rep["verification"]["ok"]
    fixed = onnx.load(str(tmp_path / "out" / "m.nafix.onnx"))
    assert any(n.op_type == op for n in fixed.graph.node)
    onnx.checker.check_model(fixed)


# ---------------------------------------------------------------------------------------------
# Odd but valid models
# ---------------------------------------------------------------------------------------------


def dup_names_model():
    sub, c = sub_first()
    return model([sub, h.make_node("Relu", ["s"], ["a"], name="sub"), h.make_node("Sigmoid", ["a"], ["y"], name="sub")],
                 [tv("x", [1, 4])], [tv("y", [1, 4])], [c])


def zero_dim_model():
    sub, c = sub_first(shape=(1, 0, 4))
    return model([sub, h.make_node("Relu", ["s"], ["y"], name="r")], [tv("x", [1, 0, 4])], [tv("y", [1, 0, 4])], [c])


def sequence_input_model():
    seq = h.make_tensor_sequence_value_info("seq", FLOAT, [1, 4])
    sub, c = sub_first(x="a")
    return model([h.make_node("SequenceAt", ["seq", "idx"], ["a"], name="at"), sub,
                  h.make_node("Relu", ["s"], ["y"], name="r")],
                 [seq], [tv("y", [1, 4])], [c, nh.from_array(np.array(0, np.int64), "idx")])


def nan_scale_model():
    return model([h.make_node("QuantizeLinear", ["x", "sc", "zp"], ["q"], name="q"),
                  h.make_node("DequantizeLinear", ["q", "sc", "zp"], ["d"], name="dq"),
                  h.make_node("Softmax", ["d"], ["y"], name="sm")],
                 [tv("x", [1, 4])], [tv("y", [1, 4])],
                 [nh.from_array(np.array(np.nan, np.float32), "sc"), nh.from_array(np.array(0, np.int8), "zp")])


@pytest.mark.parametrize("build", [dup_names_model, zero_dim_model, sequence_input_model, nan_scale_model])
def test_odd_valid_models_never_crash(tmp_path, capsys, build):
    src = save(build(), tmp_path / "m.onnx")
    before = src.read_bytes()
    code, out, err = run(["audit", src], capsys)
    contract(code, out, err, allowed=(0,))
    code, out, err = run(["fix", src, "-o", str(tmp_path / "out") + "/"], capsys)
    contract(code, out, err)
    assert src.read_bytes() == before
    assert not list(tmp_path.rglob(".*.tmp"))


def test_infinite_constants_verify_as_equal(tmp_path, capsys):
    sub = h.make_node("Sub", ["c", "x"], ["y"], name="sub")
    src = save(model([sub], [tv("x", [1, 4])], [tv("y", [1, 4])],
                     [nh.from_array(np.array([[np.inf, -np.inf, 1, 2]], np.float32), "c")]), tmp_path / "m.onnx")
    code, out, err = run(["fix", src, "-f", "json"], capsys)
    contract(code, out, err, allowed=(0,))
    assert json.loads(out)["verification"]["ok"]


def test_empty_output_path_is_one_line(capsys):
    code, out, err = run(["audit", SOFTMAX, "-o", ""], capsys)
    one_error(code, err, "output path is empty")


def test_sequence_input_is_audited_and_fixed(rewrite_float_models, tmp_path, capsys):
    src = save(sequence_input_model(), tmp_path / "m.onnx")
    code, out, err = run(["audit", src, "-f", "json"], capsys)
    contract(code, out, err, allowed=(0,))
    # the sequence's unknown rank stays a COMPILE_ERROR finding: exit 1 by default, 0 with --fail-on never
    code, out, err = run(["fix", src, "-f", "json", "-o", tmp_path / "a.onnx"], capsys)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "static_shape" in errors[0] and "--fail-on never" in errors[0], err
    code, out, err = run(["fix", src, "-f", "json", "--fail-on", "never"], capsys)
    contract(code, out, err, allowed=(0,))
    rep = json.loads(out)
    assert [c["rule"] for c in rep["changes"]] == ["NAF006"] and rep["verification"]["ok"]
    assert rep["io"]["inputs"][0]["dtype"] == "seq(float32)"
    np.savez(tmp_path / "in.npz", seq=np.zeros((1, 4), np.float32))
    code, out, err = run(["fix", src, "--inputs", tmp_path / "in.npz"], capsys)
    one_error(code, err, "input 'seq' is seq(tensor(float))", "leave --inputs out")


def test_duplicate_names_are_fixed_and_verified(tmp_path, capsys):
    src = save(dup_names_model(), tmp_path / "m.onnx")
    code, out, err = run(["fix", src, "-f", "json"], capsys)
    contract(code, out, err, allowed=(0,))
    assert json.loads(out)["verification"]["ok"]


def dynamic_breaks_at_one(batch: str | int = 1) -> onnx.ModelProto:
    """openwakeword-melspectrogram-like: a dynamic sample axis that onnxruntime rejects at 1 (a
    length-8 kernel), then a pattern NAF006 rewrites (so the gate must run the original)."""
    return model([h.make_node("Unsqueeze", ["x", "ax"], ["x3"], name="unsq"),
                  h.make_node("Conv", ["x3", "wk"], ["cv"], name="conv", strides=[4]),
                  h.make_node("Sub", ["c", "cv"], ["y"], name="sub")],
                 [tv("x", [batch, "samples"])], [tv("y", [1, 2, "frames"])],
                 [nh.from_array(np.ones((2, 1, 8), np.float32), "wk"), nh.from_array(np.array([1], np.int64), "ax"),
                  nh.from_array(np.array([0.5], np.float32), "c")])


@pytest.mark.parametrize("batch", [1, "batch"])
def test_dynamic_dim_the_gate_cannot_pin_asks_for_input_shape(rewrite_float_models, tmp_path, capsys, batch):
    src = save(dynamic_breaks_at_one(batch), tmp_path / "m.onnx")
    code, out, err = run(["audit", src], capsys)
    contract(code, out, err, allowed=(0,))
    code, out, err = run(["fix", src], capsys)
    one_error(code, err, "--input-shape", "'x' axis 1 ('samples')")
    assert not (tmp_path / "m.nafix.onnx").exists()
    code, out, err = run(["fix", src, "--input-shape", "x=1,64", "-f", "json"], capsys)
    contract(code, out, err, allowed=(0,))
    assert json.loads(out)["verification"]["ok"]


# ---------------------------------------------------------------------------------------------
# External data
# ---------------------------------------------------------------------------------------------


def _ext_model(folder: Path) -> Path:
    m = model([h.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [tv("x", [1, 64])], [tv("y", [1, 64])],
              [nh.from_array(np.ones((64, 64), np.float32), "W")])
    m.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(folder / "ext.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    return folder / "ext.onnx"


def _set_external(path: Path, **fields) -> None:
    m = onnx.load(str(path), load_external_data=False)
    for t in m.graph.initializer:
        entries = {e.key: e for e in t.external_data}
        for k, v in fields.items():
            if k in entries:
                entries[k].value = v
            else:
                t.external_data.add(key=k, value=v)
    onnx.save(m, str(path))


@pytest.mark.parametrize("case,needle", [
    ("offset", "too short"), ("offset_text", "non-numeric"), ("negative", "negative"), ("hardlink", "hard links"),
])
def test_external_data_problems_are_one_line(tmp_path, capsys, case, needle):
    src = _ext_model(tmp_path)
    if case == "offset":
        _set_external(src, offset="99999999")
    elif case == "offset_text":
        _set_external(src, offset="abc")
    elif case == "negative":
        _set_external(src, offset="-5")
    else:
        os.link(tmp_path / "w.bin", tmp_path / "hl.bin")
        _set_external(src, location="hl.bin")
    for cmd in (["audit", src], ["fix", src]):
        code, out, err = run(cmd, capsys)
        one_error(code, err, needle)


# ---------------------------------------------------------------------------------------------
# Never lose a user file: every output goes through fixer.outputs
# ---------------------------------------------------------------------------------------------


def test_audit_output_never_replaces_the_model_or_a_foreign_file(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(SOFTMAX.read_bytes())
    other = tmp_path / "other.onnx"
    other.write_bytes(SOFTMAX.read_bytes())
    notes = tmp_path / "notes.md"
    notes.write_text("mine")
    for target in (src, other, notes):
        code, out, err = run(["audit", src, "-o", target], capsys)
        one_error(code, err, str(target))
    code, out, err = run(["audit", src, "-o", src, "--force"], capsys)
    one_error(code, err, "input")
    assert src.read_bytes() == SOFTMAX.read_bytes() and other.read_bytes() == SOFTMAX.read_bytes()
    assert notes.read_text() == "mine"
    code, out, err = run(["audit", src, "-o", notes, "--force"], capsys)
    assert code == 0 and notes.read_text().startswith("Generated by nafix")


@pytest.mark.parametrize("fmt,name", [("json", "nafix-audit.json"), ("markdown", "nafix-audit.md"),
                                      ("table", "nafix-audit.txt")])
def test_audit_output_folder_and_rerun(tmp_path, capsys, fmt, name):
    dest = tmp_path / "new" / "reports"
    for _ in range(2):  # the second run replaces nafix's own report without --force
        code, out, err = run(["audit", SOFTMAX, "-f", fmt, "-o", str(dest) + os.sep], capsys)
        assert code == 0, err
    assert (dest / name).is_file() and sorted(p.name for p in dest.iterdir()) == [name]
    code, out, err = run(["audit", SOFTMAX, "-f", fmt, "-o", dest], capsys)  # an existing folder
    assert code == 0, err


def test_fix_never_overwrites_foreign_sidecars(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(SOFTMAX.read_bytes())
    for suffix in (".nafix.json", ".nafix.h", ".nafix.onnx"):
        side = tmp_path / f"m{suffix}"
        side.write_text("user data")
        code, out, err = run(["fix", src, *FLOAT_IO], capsys)
        one_error(code, err, str(side), "--force")
        assert side.read_text() == "user data"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.onnx", side.name])
        side.unlink()
    # nothing to fix: the JSON report is still protected
    plain = save(model([h.make_node("Relu", ["x"], ["y"], name="r")], [tv("x", [1, 4])], [tv("y", [1, 4])]),
                 tmp_path / "plain.onnx")
    (tmp_path / "plain.nafix.json").write_text("keep")
    code, out, err = run(["fix", plain], capsys)
    one_error(code, err, "plain.nafix.json")
    assert (tmp_path / "plain.nafix.json").read_text() == "keep"
    # -o: its sidecar JSON too
    (tmp_path / "o.json").write_text("keep")
    code, out, err = run(["fix", src, *FLOAT_IO, "-o", tmp_path / "o.onnx"], capsys)
    one_error(code, err, "o.json")
    assert not (tmp_path / "o.onnx").exists()


def test_fix_outputs_into_new_folder_and_rerun(tmp_path, capsys):
    out_dir = tmp_path / "newdir"
    for _ in range(2):
        code, out, err = run(["fix", SOFTMAX, *FLOAT_IO, "-o", str(out_dir) + "/"], capsys)
        assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "classifier_softmax.nafix.h", "classifier_softmax.nafix.json", "classifier_softmax.nafix.onnx"]
    assert not (tmp_path / "newdir.h").exists() and not (tmp_path / "newdir.json").exists()


def test_written_files_honour_the_umask(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        code, out, err = run(["fix", SOFTMAX, *FLOAT_IO, "-o", tmp_path / "f.onnx"], capsys)
    finally:
        os.umask(old)
    assert code == 0, err
    for p in tmp_path.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p


def test_read_only_outputs_are_one_line(tmp_path, capsys):
    ro_dir = tmp_path / "ro"
    ro_dir.mkdir()
    ro_dir.chmod(0o555)
    ro_file = tmp_path / "report.json"
    ro_file.write_text('{"nafix_version": "0"}')
    ro_file.chmod(0o444)
    try:
        code, out, err = run(["fix", SOFTMAX, *FLOAT_IO, "-o", ro_dir / "m.onnx"], capsys)
        one_error(code, err, "not writable")
        code, out, err = run(["audit", SOFTMAX, "-f", "json", "-o", ro_dir / "a.json"], capsys)
        one_error(code, err, "not writable")
        code, out, err = run(["audit", SOFTMAX, "-f", "json", "-o", ro_file], capsys)
        one_error(code, err, "read-only")
    finally:
        ro_dir.chmod(0o755)
    assert list(ro_dir.iterdir()) == []


def test_rules_and_explain_outputs(tmp_path, capsys):
    code, out, err = run(["rules", "--markdown", "-o", str(tmp_path / "docs") + "/"], capsys)
    assert code == 0 and (tmp_path / "docs" / "RULES.md").is_file(), err
    code, out, err = run(["rules", "--markdown", "-o", tmp_path / "docs" / "RULES.md"], capsys)  # ours: replaced
    assert code == 0, err
    foreign = tmp_path / "README.md"
    foreign.write_text("mine")
    code, out, err = run(["rules", "--markdown", "-o", foreign], capsys)
    one_error(code, err, "not written by nafix")
    log = tmp_path / "gen.log"
    log.write_text("E010(InvalidModelError): Unsupported layer types: If\n")
    code, out, err = run(["explain", log, "-f", "json", "-o", str(tmp_path / "ex") + "/"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "ex" / "gen.log.explain.json").read_text())["nafix_version"]
    code, out, err = run(["explain", log, "-o", log], capsys)
    one_error(code, err, "input")
    assert log.read_text().startswith("E010")


# ---------------------------------------------------------------------------------------------
# Unclear or missing errors
# ---------------------------------------------------------------------------------------------


def test_unreadable_model_gets_an_error_row_and_others_are_reported(tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked.onnx"
    locked.write_bytes(SOFTMAX.read_bytes())
    # the audit's workers read the models: the same failure in a nafix process of its own, whose
    # workers are forked from it (this test process has loaded onnxruntime: its workers never are);
    # every read of a named file goes through fixer.fsutil.open_regular (tests run as root: chmod is no use)
    import subprocess

    script = ("import sys, pathlib, fixer.fsutil; real = fixer.fsutil.open_regular\n"
              "def open_regular(path):\n"
              "    if pathlib.Path(path).name == 'locked.onnx':\n"
              "        raise PermissionError(13, 'Permission denied', str(path))\n"
              "    return real(path)\n"
              "fixer.fsutil.open_regular = open_regular\n"
              "from fixer.cli import main; main(sys.argv[1:])")
    done = subprocess.run([sys.executable, "-c", script, "audit", str(locked), str(SOFTMAX), "-f", "json", "--no-cache"],
                          capture_output=True, text=True, timeout=300)
    code, out, err = done.returncode, done.stdout, done.stderr
    one_error(code, err, "Permission denied")
    rows = json.loads(out)["models"]
    assert [r["path"] for r in rows] == sorted(r["path"] for r in rows)  # sorted by path, wherever the repo is
    by_name = {Path(r["path"]).name: r for r in rows}
    assert sorted(by_name) == ["classifier_softmax.onnx", "locked.onnx"]
    assert "Permission denied" in by_name["locked.onnx"]["error"]
    assert by_name["classifier_softmax.onnx"]["estimate"]["epochs"] > 0
    import fixer.fsutil  # the fix runs in this process: the same failure patched here

    real = fixer.fsutil.open_regular

    def open_regular(path):
        if Path(path).name == "locked.onnx":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(fixer.fsutil, "open_regular", open_regular)
    code, out, err = run(["fix", locked], capsys)
    one_error(code, err, "cannot be read (Permission denied)")


def test_fifo_in_audit_does_not_hang(tmp_path, capsys):
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    code, out, err = run(["audit", fifo, SOFTMAX, "-f", "json"], capsys)
    one_error(code, err, "not a regular file")
    assert len(json.loads(out)["models"]) == 2


def test_every_audit_path_gets_a_row(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out, err = run(["audit", tmp_path / "empty", tmp_path / "missing.onnx", SOFTMAX, "-f", "json"], capsys)
    one_error(code, err, "2 of 3 models")
    rows = {Path(r["path"]).name: r for r in json.loads(out)["models"]}
    assert sorted(rows) == ["classifier_softmax.onnx", "empty", "missing.onnx"]
    assert "no .onnx model found" in rows["empty"]["error"] and "no such file" in rows["missing.onnx"]["error"]
    assert rows["classifier_softmax.onnx"]["error"] is None


def test_more_than_one_error_row_is_still_one_error_line(tmp_path, capsys):
    bad1, bad2 = tmp_path / "a.onnx", tmp_path / "b.onnx"
    bad1.write_bytes(b"garbage")
    bad2.write_bytes(b"")
    code, out, err = run(["audit", bad1, bad2, SOFTMAX], capsys)
    one_error(code, err, "2 of 3 models")


@pytest.mark.parametrize("kind,needle", [
    ("text", "not an .npz archive"), ("npy", "single .npy array"), ("object", "Python objects"),
    ("shape", "expects (1, 4)"), ("missing", "has no array named 'x'"), ("folder", "a folder"),
])
def test_inputs_npz_problems(rewrite_float_models, tmp_path, capsys, kind, needle):
    src = save(model([sub_first()[0]], [tv("x", [1, 4])], [tv("s", [1, 4])], [sub_first()[1]]), tmp_path / "m.onnx")
    npz = tmp_path / "in.npz"
    if kind == "text":
        npz.write_text("x = 1, 2, 3")
    elif kind == "npy":
        np.save(open(npz, "wb"), np.zeros((1, 4), np.float32))
    elif kind == "object":
        np.savez(npz, x=np.array([{"a": 1}, None], dtype=object))
    elif kind == "shape":
        np.savez(npz, x=np.zeros((1, 5), np.float32))
    elif kind == "missing":
        np.savez(npz, y=np.zeros((1, 4), np.float32))
    else:
        npz.mkdir()
    code, out, err = run(["fix", src, "--inputs", npz], capsys)
    line = one_error(code, err, needle)
    assert "allow_pickle" not in line and "pickle" not in line.replace("Python objects", "")


@pytest.mark.parametrize("args,needle", [
    (["audit", "--bogus", "x.onnx"], "see 'nafix audit --help'"),
    (["audit", str(SOFTMAX), "--format", "xml"], "--format"),
    (["audit"], "Missing argument"),
    (["fix"], "Missing argument"),
    (["fix", str(SOFTMAX), "--seed", "-1"], "--seed"),
    (["fix", str(SOFTMAX), "--seed", "abc"], "--seed"),
    (["compile"], "Missing argument"),
    (["explain", "--nope", "x"], "see 'nafix explain --help'"),
    (["rules", "--nope"], "see 'nafix rules --help'"),
    (["nosuchfile.onnx", "--bogus"], "see 'nafix fix --help'"),
])
def test_usage_errors_are_one_line(capsys, args, needle):
    code, out, err = run(args, capsys)
    one_error(code, err, needle)
    assert "Usage:" not in err and "╭" not in err


def test_yaml_errors_are_one_line_with_file_and_line(tmp_path, capsys):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "NAF900-bad.yaml").write_text("id: NAF900\nname: [unclosed\nwhy: x\n")
    code, out, err = run(["rules", "--rules", rules], capsys)
    one_error(code, err, "NAF900-bad.yaml, line ")
    (rules / "NAF900-bad.yaml").write_bytes(b"\x7fELF\x02\x01\x00\x00" + bytes(range(256)))
    code, out, err = run(["fix", SOFTMAX, "--rules", rules, "--dry-run"], capsys)
    one_error(code, err, "binary")
    (rules / "NAF900-bad.yaml").write_text("!!python/object/apply:os.system ['echo pwned']\n")
    code, out, err = run(["rules", "--rules", rules], capsys)
    one_error(code, err, "NAF900-bad.yaml")
    assert "pwned" not in out
    prof = tmp_path / "p.yaml"
    prof.write_text("name: x\nlimits:\n  a: {value: 1\n")
    code, out, err = run(["audit", SOFTMAX, "--target-profile", prof], capsys)
    one_error(code, err, "p.yaml, line ")


@pytest.mark.parametrize("text", [
    "name: x\nlimits: [1, 2]\noperators: {}\n",
    "name: x\nlimits: {}\noperators: {Conv: {tier: hw, tag: DOC, constraints: 5}}\n",
    "name: x\nlimits: {}\noperators: {}\nsw_int8_kernels: [Conv]\n",
    "name: x\nlimits: {}\noperators: {Softmax: {tier: sw, tag: DOC, constraints: [no_such_check]}}\n",
    "name: x\nlimits: {}\noperators: {Softmax: {tier: sw, tag: DOC, constraints: [{a: 1}]}}\n",
])
def test_profile_with_wrong_types_is_one_line(tmp_path, capsys, text):
    prof = tmp_path / "p.yaml"
    prof.write_text(text)
    code, out, err = run(["audit", SOFTMAX, "--target-profile", prof], capsys)
    one_error(code, err, "p.yaml")


def test_explain_on_a_folder_or_fifo(tmp_path, capsys):
    code, out, err = run(["explain", tmp_path], capsys)
    one_error(code, err, "is a folder")
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    code, out, err = run(["explain", fifo], capsys)
    one_error(code, err, "not a regular file")


# ---------------------------------------------------------------------------------------------
# --compile: options checked before any work; tool output printed verbatim; timeouts honoured
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def fake_env(monkeypatch):
    for var in ("STEDGEAI_CORE_DIR", "FAKE_STEDGEAI_FORMAT", "FAKE_STEDGEAI_FAIL", "FAKE_STEDGEAI_HANG",
                "FAKE_STEDGEAI_VERSION_HANG", "FAKE_STEDGEAI_WARN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    return monkeypatch


@pytest.mark.parametrize("extra,needle", [
    (["--stedgeai", "/nonexistent/stedgeai"], "does not exist"),
    (["--stedgeai", str(ROOT / "README.md")], "not executable"),
    (["--stedgeai", str(FAKE), "--compile-timeout", "-5"], "finite number of seconds above 0"),
    (["--stedgeai", str(FAKE), "--compile-timeout", "0"], "finite number of seconds above 0"),
    (["--stedgeai", str(FAKE), "--workdir", str(SOFTMAX)], "not a folder"),
])
def test_compile_option_problems_come_before_any_work(tmp_path, capsys, fake_env, extra, needle):
    code, out, err = run(["fix", SOFTMAX, "-o", str(tmp_path / "out") + "/", "--compile", *extra], capsys)
    one_error(code, err, needle)
    assert not (tmp_path / "out").exists()


def test_tool_output_is_plain_text(tmp_path, capsys, fake_env):
    fake_env.setenv("FAKE_STEDGEAI_WARN", "[/tmp/ws/x],[bold]y[/bold]")
    code, out, err = run(["compile", SOFTMAX, "--stedgeai", FAKE], capsys)
    contract(code, out, err, allowed=(0,))
    assert "WARNING: [/tmp/ws/x] is not quantized" in err and "[bold]y[/bold] is not quantized" in err


def test_version_hang_honours_the_timeout(tmp_path, capsys, fake_env):
    import time

    fake_env.setenv("FAKE_STEDGEAI_VERSION_HANG", "60")
    t0 = time.monotonic()
    code, out, err = run(["compile", SOFTMAX, "--stedgeai", FAKE, "--timeout", "1"], capsys)
    one_error(code, err, "--version", "did not finish within 1 s")
    assert time.monotonic() - t0 < 30  # not the former fixed 60 s


def test_compile_stages_share_the_timeout_and_reports_are_written(tmp_path, capsys, fake_env):
    import time

    fake_env.setenv("FAKE_STEDGEAI_HANG", "60")
    t0 = time.monotonic()
    code, out, err = run(["fix", SOFTMAX, *FLOAT_IO, "-o", str(tmp_path / "o") + "/", "--compile", "--stedgeai", FAKE,
                          "--compile-timeout", "2"], capsys)
    line = one_error(code, err, "did not finish", "--workdir")
    assert "/nafix-before-" not in line  # never a folder nafix has already removed
    assert time.monotonic() - t0 < 30
    # the model was written before stedgeai ran: its JSON report and header are beside it
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "classifier_softmax.nafix.h", "classifier_softmax.nafix.json", "classifier_softmax.nafix.onnx"]


# ---------------------------------------------------------------------------------------------
# --quantize: calibration data and dynamic dimensions
# ---------------------------------------------------------------------------------------------


def dynamic_hw_conv() -> onnx.ModelProto:
    """A float Conv with dynamic height and width (a YOLO-style export)."""
    rng = np.random.default_rng(0)
    return model([h.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                  h.make_node("Relu", ["c"], ["y"], name="relu")],
                 [tv("x", [1, 3, "h", "w"])], [tv("y", [1, 4, "h", "w"])],
                 [nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")])


def test_quantize_random_calibration_with_dynamic_hw_asks_for_input_shape(tmp_path, capsys):
    src = save(dynamic_hw_conv(), tmp_path / "m.onnx")
    code, out, err = run(["fix", src, "--quantize"], capsys)
    one_error(code, err, "--input-shape x=1,3,N,N", "axis 2, 3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    code, out, err = run(["fix", src, "--quantize", "--input-shape", "x=1,3,8,8", "--calib-samples", "4"], capsys)
    contract(code, out, err, allowed=(0, 1))
    assert (tmp_path / "m.nafix.onnx").is_file()


@pytest.mark.parametrize("kind,needle", [("text", "not an .npz archive"), ("object", "Python objects"),
                                         ("npy", "single .npy array")])
def test_quantize_calib_files_are_checked_and_never_unpickled(tmp_path, capsys, kind, needle):
    src = save(dynamic_hw_conv(), tmp_path / "m.onnx")
    calib = tmp_path / "calib.npz"
    if kind == "text":
        calib.write_text("not numbers")
    elif kind == "object":
        np.savez(calib, x=np.array([object(), None], dtype=object))
    else:
        with open(calib, "wb") as fh:
            np.save(fh, np.zeros((1, 3, 8, 8), np.float32))
    code, out, err = run(["fix", src, "--quantize", "--input-shape", "x=1,3,8,8", "--calib", calib], capsys)
    line = one_error(code, err, needle, "--calib")
    assert "allow_pickle" not in line


# ---------------------------------------------------------------------------------------------
# Corrupt files that parse: text fields that are not UTF-8, models the onnx checker rejects
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", [b"NODENAME", b"MODEATTR"])
def test_non_utf8_text_is_one_line(tmp_path, capsys, field):
    m = model([h.make_node("Sub", ["c", "x"], ["s"], name="NODENAME"),
               h.make_node("Resize", ["s", "", "sc"], ["y"], name="rs", mode="MODEATTR")],
              [tv("x", [1, 1, 2, 2])], [tv("y", [1, 1, 4, 4])],
              [nh.from_array(np.ones((1, 1, 2, 2), np.float32), "c"),
               nh.from_array(np.array([1, 1, 2, 2], np.float32), "sc")])
    m.ir_version = 8
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString().replace(field, b"\xff\xfe" + field[2:]))
    for cmd in (["audit", src], ["fix", src]):
        code, out, err = run(cmd, capsys)
        one_error(code, err, "not UTF-8 text")


def test_checker_rejected_model_that_breaks_nafix_is_bad_input(tmp_path, capsys, monkeypatch):
    """An unexpected failure on a model the onnx checker rejects is the file's fault: exit 2, one line;
    on a model the checker accepts it stays an internal error (exit 3)."""
    import fixer.api as api

    def boom(*a, **k):
        raise TypeError("Cannot interpret '0' as a data type")

    monkeypatch.setattr(api, "analyze_model", boom)
    bad = model([h.make_node("Relu", ["x"], ["y"], name="r")], [tv("x", [1, 4])], [tv("y", [1, 4])])
    bad.ir_version = 2  # IR < 3 with an opset import: the checker refuses it
    src = tmp_path / "bad.onnx"
    src.write_bytes(bad.SerializeToString())
    code, out, err = run(["fix", src], capsys)
    one_error(code, err, "not a valid ONNX model (onnx checker", "TypeError")
    code, out, err = run(["fix", SOFTMAX, "--dry-run"], capsys)
    assert code == 3 and "internal error" in err


@pytest.mark.parametrize("opts,needle", [
    (["--calib-mean", "nan"], "finite numbers"), (["--calib-std", "inf"], "finite numbers"),
    (["--calib-size", "100000x100000"], "fixed at 64x64"),
])
def test_calibration_options_that_cannot_work_are_one_line(tmp_path, capsys, opts, needle):
    from PIL import Image

    imgs = tmp_path / "imgs"
    imgs.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(imgs / "a.png")
    code, out, err = run(["fix", ROOT / "sample_models" / "classifier_softmax_float.onnx", "--quantize",
                          "--calib", imgs, *opts, "-o", str(tmp_path / "o") + "/"], capsys)
    one_error(code, err, needle)
    assert not (tmp_path / "o").exists()


def test_out_of_memory_is_one_line(capsys, monkeypatch):
    import fixer.api as api

    def oom(*a, **k):
        raise MemoryError()

    monkeypatch.setattr(api, "load_model", oom)
    code, out, err = run(["fix", SOFTMAX, "--dry-run"], capsys)
    one_error(code, err, "ran out of memory")


def test_non_ascii_names_on_an_ascii_terminal(tmp_path):
    import subprocess

    src = tmp_path / "m\u00f8del [bold].onnx"
    src.write_bytes(SOFTMAX.read_bytes())
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "LC_ALL": "C"}
    done = subprocess.run([sys.executable, "-c", "from fixer.cli import main; main()", "audit", str(src)],
                          capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert b"m\\xf8del [bold]" in done.stdout and b"Traceback" not in done.stderr


@pytest.mark.parametrize("case", ["mpool", "profile", "target-profile", "inputs", "calib", "explain", "calibrate",
                                  "rules", "audit", "baseline", "merge"])
def test_a_fifo_given_anywhere_never_blocks(tmp_path, capsys, case):
    import signal

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    args = {
        "mpool": ["audit", SOFTMAX, "--mpool", fifo],
        "profile": ["audit", SOFTMAX, "--profile", f"p@{fifo}"],
        "target-profile": ["audit", SOFTMAX, "--target-profile", fifo],
        "inputs": ["fix", save(model([sub_first()[0]], [tv("x", [1, 4])], [tv("s", [1, 4])], [sub_first()[1]]),
                               tmp_path / "m.onnx"), "--inputs", fifo],
        "calib": ["fix", SOFTMAX, "--quantize", "--calib", fifo],
        "explain": ["explain", fifo],
        "calibrate": ["calibrate", tmp_path],
        "rules": ["rules", "--rules", tmp_path],
        "audit": ["audit", tmp_path, SOFTMAX],
        "baseline": ["audit", SOFTMAX, "--baseline", fifo],
        "merge": ["audit", "merge", fifo, "-o", tmp_path / "all.json"],
    }[case]
    if case == "calibrate":
        (tmp_path / "pair").mkdir()
        os.mkfifo(tmp_path / "pair" / "network_generate_report.txt")
    if case == "rules":
        os.mkfifo(tmp_path / "NAF900-x.yaml")
    if case == "audit":
        os.mkfifo(tmp_path / "x.onnx")

    def hang(*_):
        raise TimeoutError("nafix blocked on a FIFO")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(30)
    try:
        code, out, err = run(args, capsys)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    contract(code, out, err)
    if case in ("baseline", "merge"):
        assert code == 2 and "not a regular file" in err
