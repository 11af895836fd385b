"""Property tests of nafix's command-line contract (issue 8), run in-process with hypothesis.

Generated: corrupt and truncated model files, odd but valid models (dynamic and zero-size dims,
duplicate or empty node names, subgraphs, old opsets), and CLI invocations mixing commands, options,
values and output targets. Whatever the input, nafix must:

- exit 0, 1 or 2 (never 3, "internal error"), with at most one ``error:`` line and no traceback;
- leave every input file and every unrelated file byte-identical;
- leave no partial or temporary output behind (``.*.tmp``).

Examples are derandomized (the same on every run) and bounded so the module costs well under a minute.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixer.cli import main

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "sample_models" / "classifier_softmax.onnx"

FUZZ = settings(max_examples=18, deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def run(args: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def check_contract(args, code: int, out: str, err: str) -> None:
    what = f"nafix {' '.join(map(str, args))}"
    assert code in (0, 1, 2), f"{what}: exit {code}\n{err}"
    assert sum(ln.startswith("error:") for ln in err.splitlines()) <= 1, f"{what}: several error lines\n{err}"
    assert "Traceback" not in err + out and "internal error" not in err, f"{what}\n{err}"


def check_files(folder: Path, before: dict[str, bytes], written_ok: set[str]) -> None:
    """Inputs and unrelated files byte-identical; new files only where nafix may write; no temp files."""
    after = snapshot(folder)
    for name, data in before.items():
        if name not in written_ok:
            assert after.get(name) == data, f"{name} was changed or removed"
    leftovers = [p for p in folder.rglob(".*.tmp")]
    assert not leftovers, leftovers


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def _small_models() -> list[bytes]:
    sub = h.make_model(h.make_graph(
        [h.make_node("Sub", ["c", "x"], ["s"], name="sub"), h.make_node("Relu", ["s"], ["y"], name="r")], "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4])], [h.make_tensor_value_info("y", T.FLOAT, [1, 4])],
        [nh.from_array(np.arange(4, dtype=np.float32).reshape(1, 4), "c")]), opset_imports=[h.make_opsetid("", 17)])
    sub.ir_version = 8
    tflite = ROOT / "tests" / "data" / "tflite" / "movenet_like.tflite"  # read by content, whatever the name
    return [sub.SerializeToString(), SOFTMAX.read_bytes()] + ([tflite.read_bytes()] if tflite.is_file() else [])


BASES = _small_models()


@st.composite
def corrupt_models(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(BASES)))
    how = draw(st.sampled_from(["truncate", "flip", "insert", "garbage", "empty-ish"]))
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
        return bytes(data)
    if how == "insert":
        i = draw(st.integers(0, len(data)))
        return bytes(data[:i] + draw(st.binary(min_size=1, max_size=32)) + data[i:])
    if how == "garbage":
        return draw(st.binary(min_size=1, max_size=512))
    return draw(st.sampled_from([b"\x00", b"\n", b"PK\x03\x04", b"\x08\x07", b"{}"]))


@st.composite
def odd_models(draw) -> bytes:
    """Valid-looking models with odd features: dynamic/zero dims, duplicate or empty names, If, opsets."""
    opset = draw(st.sampled_from([11, 13, 17]))
    dims = draw(st.lists(st.sampled_from([1, 2, 4, 0, "n", "batch"]), min_size=1, max_size=4))
    op = draw(st.sampled_from(["Relu", "Sigmoid", "Softmax", "SubFirst", "Identity"]))
    names = draw(st.sampled_from(["unique", "duplicate", "empty"]))
    wrap_if = draw(st.booleans())
    nm = {"unique": ("a", "b"), "duplicate": ("n", "n"), "empty": ("", "")}[names]
    inits = []
    if op == "SubFirst":
        inits.append(nh.from_array(np.array(0.5, np.float32), "c"))
        first = h.make_node("Sub", ["c", "x"], ["t"], name=nm[0])
    else:
        first = h.make_node(op, ["x"], ["t"], name=nm[0])
    if wrap_if:
        then_g = h.make_graph([h.make_node("Relu", ["t"], ["o1"], name=nm[1])], "then", [],
                              [h.make_tensor_value_info("o1", T.FLOAT, None)])
        else_g = h.make_graph([h.make_node("Neg", ["x"], ["o2"], name=nm[1])], "else", [],
                              [h.make_tensor_value_info("o2", T.FLOAT, None)])
        inits.append(nh.from_array(np.array(True), "cond"))
        second = h.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g)
    else:
        second = h.make_node("Relu", ["t"], ["y"], name=nm[1])
    g = h.make_graph([first, second], "g", [h.make_tensor_value_info("x", T.FLOAT, dims)],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 7
    return m.SerializeToString()


def _audit_and_fix(model_bytes: bytes, extra: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        src = folder / "m.onnx"
        src.write_bytes(model_bytes)
        (folder / "notes.txt").write_text("unrelated")
        before = snapshot(folder)
        for args in (["audit", src, "-f", "json"], ["fix", src, *extra], ["fix", src, "--dry-run"]):
            code, out, err = run(args)
            check_contract(args, code, out, err)
        check_files(folder, before, written_ok=set())
        made = set(snapshot(folder)) - set(before)
        assert made <= {"m.nafix.onnx", "m.nafix.json", "m.nafix.h"}, made


@FUZZ
@given(corrupt_models())
def test_corrupt_and_truncated_models(data):
    _audit_and_fix(data, [])


@FUZZ
@given(odd_models(), st.sampled_from([[], ["--input-shape", "x=1,4"], ["--seed", "7"]]))
def test_odd_but_valid_models(data, extra):
    _audit_and_fix(data, extra)


# ---------------------------------------------------------------------------------------------
# CLI invocations
# ---------------------------------------------------------------------------------------------

#: Tokens an invocation is built from; {model}, {dir}, {new}, {notes}, {missing}, {fifo} are placeholders.
COMMANDS = ["audit", "fix", "compile", "explain", "rules", "{model}"]
OPTIONS = [
    ["-o", "{model}"], ["-o", "{notes}"], ["-o", "{dir}"], ["-o", "{new}/"], ["-o", "{new}/x.onnx"],
    ["--force"], ["--format", "json"], ["--format", "xml"], ["-f", "markdown"], ["--seed", "-3"], ["--seed", "x"],
    ["--input-shape", "x=1,4"], ["--input-shape", "bogus"], ["--input-shape", "x=0,-1"], ["--dry-run"],
    ["--inputs", "{notes}"], ["--inputs", "{missing}"], ["--rules", "{dir}"], ["--rules", "{notes}"],
    ["--target-profile", "{notes}"], ["--target-profile", "nope"], ["--select", "NAF999"], ["--ignore", "NAF004"],
    ["--compile", "--stedgeai", "{missing}"], ["--compile-timeout", "-1"], ["--markdown"], ["--verbose"],
    ["--bogus"], ["{fifo}"], ["{missing}"], ["{dir}"], ["--quantize", "--calib", "{notes}"], ["--fail-on", "sw"],
    ["--keep-failed"], ["--timeout", "0"], ["--help"],
]


@st.composite
def invocations(draw) -> list[str]:
    cmd = [draw(st.sampled_from(COMMANDS))]
    if cmd[0] in ("audit", "fix", "compile"):
        cmd.append(draw(st.sampled_from(["{model}", "{missing}", "{dir}", "{notes}", "{fifo}"])))
    elif cmd[0] == "explain":
        cmd.append(draw(st.sampled_from(["{notes}", "{dir}", "{missing}", "{fifo}"])))
    for opt in draw(st.lists(st.sampled_from(OPTIONS), max_size=3)):
        cmd.extend(opt)
    return cmd


@settings(FUZZ, max_examples=45)
@given(invocations())
def test_cli_invocations_keep_the_contract(tokens):
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "in").mkdir()
        model = folder / "in" / "m.onnx"
        model.write_bytes(SOFTMAX.read_bytes())
        notes = folder / "in" / "notes.txt"
        notes.write_text("unrelated user notes\n")
        fifo = folder / "in" / "pipe.onnx"
        os.mkfifo(fifo)
        (folder / "dir").mkdir()
        values = {"{model}": str(model), "{notes}": str(notes), "{dir}": str(folder / "dir"),
                  "{new}": str(folder / "new"), "{missing}": str(folder / "missing.onnx"), "{fifo}": str(fifo)}
        args = []
        for t in tokens:
            for k, v in values.items():
                t = t.replace(k, v)
            args.append(t)
        before = snapshot(folder / "in")
        code, out, err = run(args)
        check_contract(args, code, out, err)
        # the inputs, the notes and the FIFO are never written, even with --force
        assert snapshot(folder / "in") == {k: v for k, v in before.items()} | {
            k: v for k, v in snapshot(folder / "in").items() if k.startswith("m.nafix.")}
        assert not list(folder.rglob(".*.tmp"))
