"""Truncated, corrupt and hostile TFLite files (issue 32, "Smaller"): one ``error:`` line naming the
file and saying it is not a complete/valid TFLite flatbuffer (what was being read, which byte), never
the reader's exception text; absurd dimensions refused with a sentence, not "not a valid ONNX model";
a TFLite recognised by its identifier (bytes 4..8), whatever the file is called."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from fixer.errors import InputError
from fixer.importers.tflite import MAX_TENSOR_BYTES, import_tflite
from tests.helpers import run_cli as run

DATA = Path(__file__).resolve().parent / "data" / "tflite"
CNN = (DATA / "int8_cnn.tflite").read_bytes()
RAW_TEXT = ("struct.error", "unpack_from", "Traceback", "IndexError", "not a valid ONNX model", "Error:")


def one_error(code: int, err: str, *needles: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    for n in needles:
        assert n in errors[0], errors[0]
    for raw in RAW_TEXT:
        assert raw not in err, err
    return errors[0]


def _shape_vector(data: bytes, tensor: int) -> tuple[int, list[int]]:
    """(byte offset of the first dimension of tensor ``tensor``'s shape, the shape)."""
    import tflite

    t = tflite.Model.GetRootAsModel(data, 0).Subgraphs(0).Tensors(tensor)
    return t._tab.Vector(t._tab.Offset(4)), [int(d) for d in t.ShapeAsNumpy()]


def _with_dims(data: bytes, tensor: int, dims: dict[int, int]) -> bytes:
    pos, shape = _shape_vector(data, tensor)
    out = bytearray(data)
    for axis, value in dims.items():
        struct.pack_into("<i", out, pos + 4 * axis, value)
    return bytes(out)


def _input_and_weight() -> tuple[int, int]:
    import tflite

    m = tflite.Model.GetRootAsModel(CNN, 0)
    sg = m.Subgraphs(0)
    weight = next(t for t in range(sg.TensorsLength()) if m.Buffers(sg.Tensors(t).Buffer()).DataLength() > 0)
    return sg.Inputs(0), weight


@pytest.mark.parametrize("cut", [10, 20, 50, 200, 400, 2000, len(CNN) - 1])
def test_truncated_tflite_is_one_sentence(tmp_path, capsys, cut):
    path = tmp_path / "cut.tflite"
    blob = CNN[:cut]
    path.write_bytes(blob)
    with pytest.raises(InputError, match="not a complete TFLite flatbuffer") as info:
        import_tflite(blob, path)
    assert not any(raw in str(info.value) for raw in RAW_TEXT), info.value
    code, out, err = run([path], capsys)
    line = one_error(code, err, str(path), "not a complete TFLite flatbuffer")
    assert f"{cut}-byte file" in line or f"only {cut} bytes" in line
    assert path.read_bytes() == blob and [p.name for p in tmp_path.iterdir()] == ["cut.tflite"]


def test_truncated_tflite_says_what_was_read_and_which_byte(tmp_path):
    with pytest.raises(InputError) as info:
        import_tflite(CNN[:400], tmp_path / "x.tflite")
    msg = str(info.value)
    assert "while reading operator code" in msg and "refers to byte" in msg and "past the end of the 400-byte" in msg


@pytest.mark.parametrize("which,dims,needle", [
    ("input", {1: 2**31 - 1}, "[1, 2147483647, 16, 4]"),
    ("input", {1: 65536, 2: 65536}, "more than any model for the STM32N6 can hold"),
    ("input", {0: 2**31 - 1}, "more than any model for the STM32N6 can hold"),
    ("weight", {1: 2**31 - 1}, "more than any model for the STM32N6 can hold"),
    ("input", {1: -2**31}, "negative dimension"),
])
def test_absurd_dimensions_are_refused_with_a_sentence(tmp_path, capsys, which, dims, needle):
    inp, weight = _input_and_weight()
    blob = _with_dims(CNN, inp if which == "input" else weight, dims)
    for name in ("huge.tflite", "huge_renamed.onnx"):  # a TFLite by its identifier, whatever its name
        path = tmp_path / name
        path.write_bytes(blob)
        code, out, err = run([path, "--dry-run"], capsys)
        one_error(code, err, str(path), "TFLite", "tensor '", needle)
        path.unlink()


def test_the_tensor_bound_leaves_real_models_alone():
    """The bound is far above any tensor of the committed models (and of the shared pairs' models)."""
    import tflite

    for path in sorted(DATA.glob("*.tflite")):
        sg = tflite.Model.GetRootAsModel(path.read_bytes(), 0).Subgraphs(0)
        for t in range(sg.TensorsLength()):
            n = 1
            for d in sg.Tensors(t).ShapeAsNumpy() if sg.Tensors(t).ShapeLength() else ():
                n *= int(d)
            assert n * 8 < MAX_TENSOR_BYTES


def test_a_tflite_name_without_the_identifier(tmp_path, capsys):
    blob = bytearray(CNN)
    blob[4:8] = b"XXXX"
    path = tmp_path / "m.tflite"
    path.write_bytes(bytes(blob))
    code, out, err = run([path], capsys)
    one_error(code, err, str(path), "not a TFLite model", "'TFL3' identifier", "b'XXXX'")
    tiny = tmp_path / "tiny.tflite"
    tiny.write_bytes(CNN[:5])
    code, out, err = run([tiny], capsys)
    one_error(code, err, str(tiny), "not a TFLite model", "only 5 bytes")


def test_audit_gives_each_corrupt_tflite_an_error_row(tmp_path, capsys):
    inp, _ = _input_and_weight()
    files = {"cut.tflite": CNN[:300], "huge.tflite": _with_dims(CNN, inp, {1: 2**31 - 1})}
    for name, blob in files.items():
        (tmp_path / name).write_bytes(blob)
    code, out, err = run(["audit", *[tmp_path / n for n in files], "--format", "json"], capsys)
    rows = {Path(r["path"]).name: r for r in json.loads(out)["models"]}
    assert "not a complete TFLite flatbuffer" in rows["cut.tflite"]["error"]
    assert "more than any model" in rows["huge.tflite"]["error"]
    assert not any(raw in json.dumps(rows) for raw in RAW_TEXT)
