"""Every file the user names is checked before any work (issue 32, items 4 and 5): a bad ``--inputs``
.npz fails even when there is nothing to fix, a bad ``--calib`` before quantization starts, a target
profile with a value of the wrong type names the key and the type expected. Each: exit 2, one
``error:`` line naming the file, and nothing written."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto as T
from onnx import helper as h

from fixer.errors import ProfileError
from fixer.npu.profile import load_profile
from tests.helpers import run_cli as run

PROFILE = Path(__file__).resolve().parents[1] / "fixer" / "npu" / "profiles" / "stm32n6.yaml"


def relu_model(elem=T.FLOAT) -> onnx.ModelProto:
    """x [1, 4] -> Relu -> y: nothing for nafix to fix."""
    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                         [h.make_tensor_value_info("x", elem, [1, 4])], [h.make_tensor_value_info("y", elem, [1, 4])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def one_error_nothing_written(code: int, err: str, folder: Path, before: set[str], *needles: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    for n in needles:
        assert n in errors[0], errors[0]
    assert "Traceback" not in err and "allow_pickle" not in errors[0]
    assert {p.name for p in folder.iterdir()} == before, "an output was written"
    return errors[0]


def test_good_inputs_and_nothing_to_fix_writes_the_report(tmp_path, capsys):
    """(The case below fails on: with nothing to fix, nafix exits 0 and writes its report.)"""
    src = tmp_path / "m.onnx"
    onnx.save(relu_model(), src)
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 1, 4), np.float32))
    code, out, err = run([src, "--inputs", tmp_path / "in.npz"], capsys)
    assert code == 0, err
    assert (tmp_path / "m.nafix.json").is_file()


def _write(kind: str, npz: Path) -> None:
    if kind == "shape":
        np.savez(npz, x=np.zeros((1, 5), np.float32))
    elif kind == "rank":
        np.savez(npz, x=np.zeros((4,), np.float32))
    elif kind == "unknown_key":
        np.savez(npz, x=np.zeros((1, 4), np.float32), z=np.zeros((1, 4), np.float32))
    elif kind == "missing_key":
        np.savez(npz, y=np.zeros((1, 4), np.float32))
    elif kind == "text":
        npz.write_text("x = 1, 2, 3")
    elif kind == "npy":
        with open(npz, "wb") as fh:
            np.save(fh, np.zeros((1, 4), np.float32))
    elif kind == "pickle":
        np.savez(npz, x=np.array([{"a": 1}, None], dtype=object))
    elif kind == "samples":
        np.savez(npz, x=np.zeros((0, 1, 4), np.float32))
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind,needles", [
    ("shape", ["expects (1, 4)", "(1, 5)"]),
    ("rank", ["has rank 2"]),
    ("unknown_key", ["array 'z' is not a graph input", "inputs: x"]),
    ("missing_key", ["has no array named 'x'"]),
    ("text", ["not an .npz archive"]),
    ("npy", ["single .npy array"]),
    ("pickle", ["Python objects", "never loads"]),
    ("samples", ["holds no sample"]),
])
def test_bad_inputs_file_fails_before_any_work(tmp_path, capsys, kind, needles):
    src = tmp_path / "m.onnx"
    onnx.save(relu_model(), src)
    npz = tmp_path / "in.npz"
    _write(kind, npz)
    before = {p.name for p in tmp_path.iterdir()}
    code, out, err = run([src, "--inputs", npz], capsys)
    one_error_nothing_written(code, err, tmp_path, before, str(npz), *needles)


@pytest.mark.parametrize("values,needle", [
    (np.array([[0.5, 1, 2, 3]], np.float32), "fractional values"),
    (np.array([[0, 1, 2, 300]], np.int32), "outside -128..127"),
    (np.array([[0, 1, np.nan, 3]], np.float32), "NaN"),
])
def test_inputs_an_integer_input_cannot_take(tmp_path, capsys, values, needle):
    src = tmp_path / "m.onnx"
    onnx.save(relu_model(T.INT8), src)
    npz = tmp_path / "in.npz"
    np.savez(npz, x=values)
    before = {p.name for p in tmp_path.iterdir()}
    code, out, err = run([src, "--inputs", npz], capsys)
    one_error_nothing_written(code, err, tmp_path, before, str(npz), "array 'x'", "int8", needle)


def test_inputs_whole_floats_for_an_integer_input_are_taken(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(relu_model(T.INT8), src)
    np.savez(tmp_path / "in.npz", x=np.array([[0, 1, -2, 127]], np.float32))
    code, out, err = run([src, "--inputs", tmp_path / "in.npz"], capsys)
    assert code == 0, err


def test_bad_calib_file_fails_before_any_work(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(relu_model(), src)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.zeros((3, 1, 7), np.float32))
    before = {p.name for p in tmp_path.iterdir()}
    code, out, err = run([src, "--quantize", "--calib", calib], capsys)
    one_error_nothing_written(code, err, tmp_path, before, str(calib), "shape")


# -- target profiles: a value of the wrong type ----------------------------------------------------


def _first_core(d):
    return next(iter(d["cores"]["versions"].values()))


PROFILE_CASES = {
    "limits is a number": (lambda d: d.__setitem__("limits", 3), "'limits' must be a mapping", "the number 3"),
    "operators is a list": (lambda d: d.__setitem__("operators", ["Conv"]), "'operators' must be a mapping", "a list"),
    "an operator is a number": (lambda d: d["operators"].__setitem__("Conv", 5), "'operators.Conv' must be a mapping",
                                "the number 5"),
    "constraints a mapping": (lambda d: d["operators"]["Conv"].__setitem__("constraints", {"a": 1}),
                              "'operators.Conv.constraints' must be a list of text", "a mapping"),
    "a constraint a mapping": (lambda d: d["operators"]["Conv"].__setitem__("constraints", [{"a": 1}]),
                               "'operators.Conv.constraints[0]' must be text", "a mapping"),
    "a core's limits a number": (lambda d: _first_core(d).__setitem__("limits", 7), ".limits' must be a mapping of names"
                                 " to a number", "the number 7"),
    "sw_lowered entry a number": (lambda d: _first_core(d).__setitem__("sw_lowered", {"Softmax": 3}),
                                  ".sw_lowered.Softmax' must be a list of text", "the number 3"),
    "float_suffix text": (lambda d: _first_core(d).__setitem__("float_suffix", "yes"), ".float_suffix' must be true or "
                          "false", "the text 'yes'"),
    "sw_int8_kernels.ops text": (lambda d: d["sw_int8_kernels"].__setitem__("ops", "Conv"),
                                 "'sw_int8_kernels.ops' must be a list of text", "the text 'Conv'"),
    "sw_int8_kernels a number": (lambda d: d.__setitem__("sw_int8_kernels", 4), "'sw_int8_kernels' must be a mapping",
                                 "the number 4"),
    "lowering inserts a mapping": (lambda d: next(iter(d["lowerings"].values())).__setitem__("inserts", {"x": 1}),
                                   ".inserts' must be text or a list of text", "a mapping"),
    "extra_epochs text": (lambda d: d["operators"]["Conv"].__setitem__("extra_epochs", "two"),
                          "'operators.Conv.extra_epochs' must be a whole number", "the text 'two'"),
}


@pytest.mark.parametrize("case", sorted(PROFILE_CASES))
def test_profile_value_of_the_wrong_type_names_key_and_type(tmp_path, case):
    edit, key, found = PROFILE_CASES[case]
    data = yaml.safe_load(PROFILE.read_text())
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and key in msg and found in msg, msg
    assert "Error" not in msg and "object has no attribute" not in msg


def test_profile_wrong_type_on_the_cli(tmp_path, capsys):
    data = yaml.safe_load(PROFILE.read_text())
    data["limits"] = 3
    prof = tmp_path / "bad.yaml"
    prof.write_text(yaml.safe_dump(data))
    src = tmp_path / "m.onnx"
    onnx.save(relu_model(), src)
    before = {p.name for p in tmp_path.iterdir()}
    code, out, err = run([src, "--target-profile", prof], capsys)
    one_error_nothing_written(code, err, tmp_path, before, str(prof), "'limits' must be a mapping")


def test_the_built_in_profile_passes_the_structure_check():
    data = yaml.safe_load(PROFILE.read_text())
    assert load_profile(None).name == data["name"]
    again = copy.deepcopy(data)
    again["description"] = None  # an empty optional value is as if not given
    from fixer.npu.profile import parse_profile

    assert parse_profile(again, "x.yaml").operators.keys() == load_profile(None).operators.keys()
