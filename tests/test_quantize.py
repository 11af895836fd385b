"""fixer.quantize: calibration readers, NPU-recipe quantization through onnxruntime, exact uint8 -> int8,
float-island re-quantization, accuracy report, symmetric output parameters.

Models are the committed samples (float sources and the uint8 one) and tiny graphs built here; tests
on the third-party models in ../shared/models skip when that folder is absent. Images are generated
in the tests (PPM/PGM/BMP written by hand, a PNG by zlib), never downloaded.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer import ir
from fixer import quantize as Q
from fixer.api import analyze_model
from fixer.errors import InputError, UsageError
from fixer.graph import const_value
from fixer.npu.profile import load_profile
from fixer.rules import VerifyContract
from fixer.gate import session, verify

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
SHARED_MODELS = ROOT.parent / "shared" / "models"
MOBILEFACENET = SHARED_MODELS / "pele__mobilefacenet__PerChannel_quant.onnx"
CORAL_MOBILENET = SHARED_MODELS / "tfl2onnx-coral__mobilenet_v1_0.25_128_quant.onnx"
PROFILE = load_profile(None)



# ------------------------------------------------------------------------------------------------
# builders and helpers
# ------------------------------------------------------------------------------------------------


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def image_model(h=16, w=16, layout="nchw", seed=0) -> onnx.ModelProto:
    """A 3-channel float CNN with the NPU ops onnxruntime leaves in float by default:
    Conv -> PRelu -> Tanh -> HardSwish -> Sub(c) -> Max(c) -> Div(c) -> Conv -> GlobalMaxPool + ReduceMean -> Add."""
    rng = np.random.default_rng(seed)
    inits = []

    def c(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr, np.float32), name))
        return name

    nodes = []
    x = "image"
    if layout == "nhwc":
        nodes.append(helper.make_node("Transpose", ["image"], ["nchw"], perm=[0, 3, 1, 2], name="to_nchw"))
        x = "nchw"
    nodes += [
        helper.make_node("Conv", [x, c("w1", rng.normal(size=(8, 3, 3, 3)) * 0.3), c("b1", rng.normal(size=8) * 0.1)],
                         ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("PRelu", ["c1", c("slope", rng.uniform(0.05, 0.3, size=(8, 1, 1)))], ["p1"], name="prelu1"),
        helper.make_node("Tanh", ["p1"], ["t1"], name="tanh1"),
        helper.make_node("HardSwish", ["t1"], ["hs"], name="hswish1"),
        helper.make_node("Sub", ["hs", c("sub_c", [0.1])], ["s1"], name="sub1"),
        helper.make_node("Max", ["s1", c("max_c", [-0.5])], ["m1"], name="max1"),
        helper.make_node("Div", ["m1", c("div_c", [2.0])], ["d1"], name="div1"),
        helper.make_node("Conv", ["d1", c("w2", rng.normal(size=(4, 8, 1, 1)) * 0.5)], ["c2"], name="conv2"),
        helper.make_node("GlobalMaxPool", ["c2"], ["g1"], name="gmax"),
        helper.make_node("ReduceMean", ["c2"], ["r1"], axes=[2, 3], keepdims=1, name="rmean"),
        helper.make_node("Add", ["g1", "r1"], ["scores"], name="add"),
    ]
    shape = [1, 3, h, w] if layout == "nchw" else [1, h, w, 3]
    return _model(nodes, [helper.make_tensor_value_info("image", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4, 1, 1])], inits)


def prelu_island_model(seed=1) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(float model, QDQ model) where onnxruntime's default op list left the PRelu float (the
    MobileFaceNet pattern: DequantizeLinear -> PRelu(float slope) -> QuantizeLinear)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.normal(size=(8, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.uniform(0.05, 0.3, size=(8, 1, 1)).astype(np.float32), "slope"),
        numpy_helper.from_array((rng.normal(size=(4, 8, 1, 1)) * 0.4).astype(np.float32), "w2"),
    ]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("PRelu", ["c1", "slope"], ["p1"], name="prelu1"),
             helper.make_node("Conv", ["p1", "w2"], ["y"], name="conv2")]
    fm = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.data, None)

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "f.onnx", Path(tmp) / "q.onnx"
        onnx.save(fm, src)
        with Q._quiet_onnxruntime():
            quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
                            op_types_to_quantize=["Conv"],
                            extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
        qm = onnx.load(str(dst))
    return fm, qm


def write_ppm(path: Path, img: np.ndarray) -> Path:
    h, w = img.shape[:2]
    if img.ndim == 2:
        path.write_bytes(b"P5\n# made by a test\n%d %d\n255\n" % (w, h) + img.astype(np.uint8).tobytes())
    else:
        path.write_bytes(b"P6\n%d %d\n255\n" % (w, h) + img.astype(np.uint8).tobytes())
    return path


def write_bmp24(path: Path, img: np.ndarray) -> Path:
    h, w, _ = img.shape
    stride = (w * 3 + 3) // 4 * 4
    rows = b"".join(img[y, :, ::-1].astype(np.uint8).tobytes().ljust(stride, b"\0") for y in range(h - 1, -1, -1))
    header = b"BM" + struct.pack("<IHHI", 54 + len(rows), 0, 0, 54)
    dib = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    path.write_bytes(header + dib + rows)
    return path


def write_png(path: Path, img: np.ndarray) -> Path:
    h, w, _ = img.shape

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\0" + img[y].astype(np.uint8).tobytes() for y in range(h))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    path.write_bytes(png)
    return path


def _consts(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every stored constant of ``model`` by name (initializers and Constant nodes)."""
    out = {}
    for name, t in ir.import_onnx(model).tensors().items():
        v = const_value(t)
        if v is not None:
            out[name] = v
    return out


def quant_tensors(model: onnx.ModelProto) -> dict:
    """Every uint8 constant, zero-point or typed tensor in the model (should be empty)."""
    consts = _consts(model)
    u8 = [t.name for t in model.graph.initializer if t.data_type == TensorProto.UINT8]
    u8 += [vi.name for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)
           if vi.type.tensor_type.elem_type == TensorProto.UINT8]
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2:
            if consts[n.input[2]].dtype == np.uint8:
                u8.append(n.name)
    return {"uint8": u8}


def weight_params(model: onnx.ModelProto) -> list[tuple[str, np.ndarray, np.ndarray, int | None, np.ndarray]]:
    """(weight name, int values, zero-points, axis, scales) for every Conv/Gemm/MatMul/PRelu weight."""
    consts = _consts(model)
    prod = {o: n for n in model.graph.node for o in n.output}
    out = []
    for n in model.graph.node:
        if n.op_type in ("Conv", "Gemm", "MatMul", "PRelu") and n.input[1] in prod:
            dq = prod[n.input[1]]
            assert dq.op_type == "DequantizeLinear", f"{n.name} weight is not quantized"
            axis = next((a.i for a in dq.attribute if a.name == "axis"), None)
            out.append((n.input[1], consts[dq.input[0]], consts[dq.input[2]], axis, consts[dq.input[1]]))
    return out


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def assert_npu_scheme(model: onnx.ModelProto) -> None:
    assert quant_tensors(model) == {"uint8": []}
    weights = weight_params(model)
    assert weights
    for name, q, zp, axis, scale in weights:
        assert q.dtype == np.int8, name
        assert np.all(zp == 0), f"{name} is not symmetric"
        if q.shape[0] > 1:
            assert axis == 0 and scale.size == q.shape[0], f"{name} is not per channel"
    assert Q.check_npu_quantization(model) == []


def with_dq_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every DequantizeLinear output of an activation added as a graph output."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    consts = _consts(m)
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] not in consts and n.output[0] not in have:
            m.graph.output.append(helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None))
    return m


# ------------------------------------------------------------------------------------------------
# 2. quantize_float_model
# ------------------------------------------------------------------------------------------------


def test_denoiser_random_calibration_follows_the_npu_scheme():
    fm = onnx.load(SAMPLES / "denoiser_257_float.onnx")
    calib = Q.CalibrationOptions(random_samples=8)
    seen = []
    res = Q.quantize_float_model(fm, calib=calib, progress=lambda d, t: seen.append((d, t)),
                                 model_name="denoiser_257_float.onnx")
    assert res.calibration == "random" and res.samples == 8
    assert seen[-1] == (8, 8)
    assert any("random data" in w for w in res.warnings)
    assert res.ok, res.problems
    assert_npu_scheme(res.model)
    assert res.model.ir_version <= 10
    assert [i.name for i in res.model.graph.input] == ["spec"] and [o.name for o in res.model.graph.output] == ["mask"]
    # the LSTM is not on the NPU: its conversions are the only float islands left
    assert {i["op_type"] for i in res.islands} <= {"QuantizeLinear", "DequantizeLinear"}
    assert all("lstm" in " ".join(i["reasons"]) for i in res.islands)
    acc = Q.accuracy_report(fm, res.model, Q.open_calibration(fm, calib).take(8), calibration=res.calibration)
    out = acc.outputs[0]
    print(f"denoiser random: cosine {out['cosine']:.5f} snr {out['snr_db']:.1f} dB max {out['max_abs_error']:.4f}")
    assert out["name"] == "mask" and out["cosine"] >= 0.99


def test_denoiser_npz_folder_calibration(tmp_path):
    fm = onnx.load(SAMPLES / "denoiser_257_float.onnx")
    rng = np.random.default_rng(7)
    folder = tmp_path / "calib"
    folder.mkdir()
    for i in range(6):
        np.savez(folder / f"s{i:02d}.npz", spec=rng.normal(0, 0.5, (1, 257, 1, 8)).astype(np.float32))
    (folder / "README.txt").write_text("ignored")
    calib = Q.CalibrationOptions(path=str(folder))
    res = Q.quantize_float_model(fm, calib=calib, model_name="denoiser_257_float.onnx")
    assert res.calibration == "npz" and res.samples == 6
    assert any("ignored" in w for w in res.warnings)
    assert not any("random data" in w for w in res.warnings)
    assert_npu_scheme(res.model)
    feeds = Q.open_calibration(fm, calib).take(6)
    acc = Q.accuracy_report(fm, res.model, feeds, calibration=res.calibration)
    out = acc.outputs[0]
    print(f"denoiser npz: cosine {out['cosine']:.5f} snr {out['snr_db']:.1f} dB max {out['max_abs_error']:.4f}")
    assert out["cosine"] >= 0.99
    d = acc.as_dict()
    assert set(d) == {"calibration", "accuracy_samples", "outputs", "worst_tensors"}
    assert d["accuracy_samples"] == 6
    assert d["calibration"] == "npz"
    assert set(d["outputs"][0]) == {"name", "cosine", "snr_db", "max_abs_error"}
    assert 0 < len(d["worst_tensors"]) <= 10
    assert all(set(r) == {"tensor", "sqnr_db"} for r in d["worst_tensors"])
    sq = [r["sqnr_db"] for r in d["worst_tensors"]]
    assert sq == sorted(sq)


def test_single_npz_with_sample_axis_and_missing_batch_axis(tmp_path):
    fm = onnx.load(SAMPLES / "denoiser_257_float.onnx")
    rng = np.random.default_rng(3)
    one = tmp_path / "all.npz"
    np.savez(one, spec=rng.normal(size=(5, 1, 257, 1, 8)).astype(np.float64))  # float64 is converted
    src = Q.open_calibration(fm, Q.CalibrationOptions(path=str(one)))
    assert (src.kind, src.total) == ("npz", 5)
    feeds = src.take(10)
    assert len(feeds) == 5 and feeds[0]["spec"].shape == (1, 257, 1, 8) and feeds[0]["spec"].dtype == np.float32
    stacked = tmp_path / "stacked.npz"  # N samples along a batch axis of 1
    np.savez(stacked, spec=rng.normal(size=(4, 257, 1, 8)).astype(np.float32))
    assert Q.open_calibration(fm, Q.CalibrationOptions(path=str(stacked), max_samples=3)).total == 3
    folder = tmp_path / "nobatch"
    folder.mkdir()
    np.savez(folder / "a.npz", spec=np.zeros((257, 1, 8), np.float32))  # batch axis left out
    assert Q.open_calibration(fm, Q.CalibrationOptions(path=str(folder))).take(1)[0]["spec"].shape == (1, 257, 1, 8)


def test_npu_ops_onnxruntime_skips_are_quantized_from_ppm_images(tmp_path):
    ops_added = Q.npu_op_types(PROFILE)[1]
    for op in ("PRelu", "Tanh", "HardSwish", "Sub", "Max", "Div", "GlobalMaxPool", "ReduceMean"):
        assert op in ops_added and op not in Q.ort_default_op_types()
    fm = image_model(16, 16)
    rng = np.random.default_rng(0)
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(4):
        write_ppm(folder / f"im{i}.ppm", rng.integers(0, 256, (24, 20, 3)))  # resized to 16x16
    write_ppm(folder / "gray.pgm", rng.integers(0, 256, (16, 16)))  # gray: replicated to 3 channels
    write_bmp24(folder / "im5.bmp", rng.integers(0, 256, (9, 13, 3)))
    calib = Q.CalibrationOptions(path=str(folder), mean=(0.5,), std=(0.25, 0.25, 0.25))
    src = Q.open_calibration(fm, calib)
    assert (src.kind, src.total) == ("images", 6)
    x = src.take(1)[0]["image"]
    assert x.shape == (1, 3, 16, 16) and x.dtype == np.float32
    assert -2.0 - 1e-6 <= x.min() and x.max() <= 2.0 + 1e-6  # (pixel/255 - 0.5) / 0.25
    res = Q.quantize_float_model(fm, calib=calib, model_name="image_model")
    assert res.calibration == "images" and res.samples == 6
    assert res.islands == [], res.islands
    assert_npu_scheme(res.model)
    quantized = {n.op_type for n in res.model.graph.node
                 if any(i.endswith("_DequantizeLinear_Output") for i in n.input)}
    assert {"PRelu", "Tanh", "HardSwish", "Sub", "Max", "Div", "GlobalMaxPool", "ReduceMean"} <= quantized
    slope = [w for w in weight_params(res.model) if w[0].startswith("slope")]
    assert slope and slope[0][3] == 0 and slope[0][4].size == 8  # PRelu slope symmetric per channel
    acc = Q.accuracy_report(fm, res.model, src.take(6), calibration="images")
    print(f"image model: cosine {acc.outputs[0]['cosine']:.5f} snr {acc.outputs[0]['snr_db']:.1f} dB")
    assert acc.outputs[0]["cosine"] >= 0.99
    assert analyze_model(res.model, profile=PROFILE).estimate.sw_epochs <= 2  # the float edges only


def test_nhwc_layout_and_channel_order(tmp_path):
    fm = image_model(8, 8, layout="nhwc")
    folder = tmp_path / "imgs"
    folder.mkdir()
    img = np.zeros((8, 8, 3), np.uint8)
    img[..., 0] = 255  # pure red
    write_ppm(folder / "red.ppm", img)
    rgb = Q.open_calibration(fm, Q.CalibrationOptions(path=str(folder))).take(1)[0]["image"]
    assert rgb.shape == (1, 8, 8, 3) and rgb[0, 0, 0].tolist() == [1.0, 0.0, 0.0]
    bgr = Q.open_calibration(fm, Q.CalibrationOptions(path=str(folder), channel_order="bgr", scale=1.0)).take(1)[0]
    assert bgr["image"][0, 0, 0].tolist() == [0.0, 0.0, 255.0]


def test_16_bit_and_ascii_grey_images_are_scaled_to_0_255(tmp_path):
    (tmp_path / "deep.pgm").write_bytes(b"P5\n2 2\n1023\n" + np.array([0, 341, 682, 1023], ">u2").tobytes())
    (tmp_path / "ascii.pgm").write_bytes(b"P2\n2 2\n15\n0 5 10 15\n")
    for name in ("deep.pgm", "ascii.pgm"):
        img = Q.read_image(tmp_path / name)
        assert img.shape == (2, 2, 1) and img.dtype == np.float32
        assert np.allclose(img[:, :, 0], [[0, 85], [170, 255]], atol=0.01), (name, img[:, :, 0])


def test_png_images_become_inputs(tmp_path):
    fm = image_model(8, 8)
    folder = tmp_path / "png"
    folder.mkdir()
    img = np.random.default_rng(0).integers(0, 256, (8, 8, 3))
    write_png(folder / "a.png", img)
    src = Q.open_calibration(fm, Q.CalibrationOptions(path=str(folder), scale=1.0))
    x = src.take(1)[0]["image"]
    assert src.kind == "images" and x.shape == (1, 3, 8, 8)
    assert np.array_equal(x[0].transpose(1, 2, 0), img.astype(np.float32))  # same pixels, NCHW, RGB order


def test_resize_nearest_and_bilinear():
    img = np.arange(16, dtype=np.float32).reshape(4, 4, 1)
    assert Q.resize_image(img, (2, 2), "nearest")[:, :, 0].tolist() == [[0, 2], [8, 10]]
    assert Q.resize_image(img, (2, 2), "bilinear")[:, :, 0].tolist() == [[2.5, 4.5], [10.5, 12.5]]
    assert Q.resize_image(img, (4, 4)) is img


# ------------------------------------------------------------------------------------------------
# calibration errors: whole sentences naming the file and the input
# ------------------------------------------------------------------------------------------------


def test_empty_folder(tmp_path):
    with pytest.raises(InputError) as exc:
        Q.open_calibration(image_model(), Q.CalibrationOptions(path=str(tmp_path)))
    assert str(tmp_path) in str(exc.value) and "no .npz files and no images" in str(exc.value)


def test_missing_path(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        Q.open_calibration(image_model(), Q.CalibrationOptions(path=str(tmp_path / "nope")))


def test_wrong_input_name(tmp_path):
    np.savez(tmp_path / "a.npz", picture=np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(InputError) as exc:
        Q.open_calibration(image_model(), Q.CalibrationOptions(path=str(tmp_path)))
    msg = str(exc.value)
    assert "a.npz" in msg and "'image'" in msg and "picture" in msg and msg.endswith(".")


def test_mismatched_shape(tmp_path):
    np.savez(tmp_path / "a.npz", image=np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(InputError) as exc:
        Q.open_calibration(image_model(), Q.CalibrationOptions(path=str(tmp_path)))
    assert "a.npz" in str(exc.value) and "[1, 3, 32, 32]" in str(exc.value) and "float32[1,3,16,16]" in str(exc.value)


def test_mismatched_dtype(tmp_path):
    np.savez(tmp_path / "a.npz", image=np.zeros((1, 3, 16, 16), np.uint8))
    with pytest.raises(InputError, match="has dtype uint8 but the model input 'image' is float32"):
        Q.open_calibration(image_model(), Q.CalibrationOptions(path=str(tmp_path)))


def test_sample_count_mismatch_in_single_npz(tmp_path):
    m = _model([helper.make_node("Add", ["a", "b"], ["y"])],
               [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4]),
                helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [])
    np.savez(tmp_path / "x.npz", a=np.zeros((3, 1, 4), np.float32), b=np.zeros((2, 1, 4), np.float32))
    with pytest.raises(InputError, match="different numbers of samples"):
        Q.open_calibration(m, Q.CalibrationOptions(path=str(tmp_path / "x.npz")))
    with pytest.raises(UsageError, match="one image input"):
        (tmp_path / "imgs").mkdir()
        write_ppm(tmp_path / "imgs" / "a.ppm", np.zeros((4, 4, 3)))
        Q.open_calibration(m, Q.CalibrationOptions(path=str(tmp_path / "imgs")))


def test_unreadable_files(tmp_path):
    (tmp_path / "npz").mkdir()
    (tmp_path / "npz" / "bad.npz").write_bytes(b"this is not a zip file")
    with pytest.raises(InputError) as exc:
        Q.open_calibration(image_model(), Q.CalibrationOptions(path=str(tmp_path / "npz")))
    assert "bad.npz" in str(exc.value) and "not an .npz archive" in str(exc.value)
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "bad.ppm").write_bytes(b"P6\n16 16\n255\n\x00\x01")
    with pytest.raises(InputError) as exc:
        Q.open_calibration(image_model(), Q.CalibrationOptions(path=str(tmp_path / "img")))
    assert "bad.ppm" in str(exc.value) and "not a readable image" in str(exc.value)
    (tmp_path / "img" / "bad.ppm").write_bytes(b"GIF89a")
    with pytest.raises(InputError, match="not a readable image"):
        Q.open_calibration(image_model(), Q.CalibrationOptions(path=str(tmp_path / "img")))


def test_a_bad_file_later_in_the_folder_names_itself(tmp_path):
    np.savez(tmp_path / "a.npz", image=np.zeros((1, 3, 16, 16), np.float32))
    np.savez(tmp_path / "b.npz", image=np.zeros((1, 3, 16, 15), np.float32))
    with pytest.raises(InputError, match="b.npz"):
        Q.quantize_float_model(image_model(), calib=Q.CalibrationOptions(path=str(tmp_path)))


def test_option_and_usage_errors():
    with pytest.raises(UsageError, match="layout must be auto, nchw or nhwc"):
        Q.CalibrationOptions(layout="chw")
    with pytest.raises(UsageError, match="already quantized"):
        Q.quantize_float_model(onnx.load(SAMPLES / "denoiser_257.onnx"), calib=Q.CalibrationOptions(),
                               model_name="denoiser_257.onnx")
    with pytest.raises(UsageError, match="not quantized at all"):
        Q.requantize_islands(image_model(), calib=Q.CalibrationOptions())
    with pytest.raises(UsageError, match="no node named 'nope'"):
        Q.quantize_float_model(image_model(), calib=Q.CalibrationOptions(), nodes_to_exclude=("nope",))


# ------------------------------------------------------------------------------------------------
# 3. uint8 -> int8
# ------------------------------------------------------------------------------------------------


def test_uint8_sample_becomes_int8_bit_exactly():
    um = onnx.load(SAMPLES / "uint8_default_quant.onnx")
    before = analyze_model(um, profile=PROFILE)
    assert any(f.constraint == "int8_activations" for f in before.findings)
    conv = Q.convert_uint8_to_int8(um, model_name="uint8_default_quant.onnx")
    model, changes = conv  # unpacks as (model, changes)
    onnx.checker.check_model(model)
    assert changes and conv.exact and conv.max_weight_error == 0.0
    assert quant_tensors(model) == {"uint8": []}
    after = analyze_model(model, profile=PROFILE)
    assert not any(f.constraint == "int8_activations" for f in after.findings)
    assert not any(f.severity == "compile_error" for f in after.findings)
    # every interior activation (each DequantizeLinear output) and the output: bit-identical
    feeds = [{"image": np.random.default_rng(s).uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)} for s in range(3)]
    a, b = with_dq_outputs(um), with_dq_outputs(model)
    sa, sb = session(a), session(b)
    names = [o.name for o in sa.get_outputs()]
    assert len(names) >= 6
    for f in feeds:
        for n, x, y in zip(names, sa.run(names, f), sb.run(names, f)):
            assert np.array_equal(x, y), n
    v = verify(um, model, contract=VerifyContract("exact"), inputs=feeds)
    assert v.ok and all(o.bit_exact_fraction == 1.0 for o in v.outputs)


def test_uint8_weights_requantized_symmetric_per_channel():
    """The sample's QDQ with its weights turned into uint8 asymmetric (exact arithmetic), then converted."""
    um = onnx.load(SAMPLES / "uint8_default_quant.onnx")
    consts = _consts(um)
    for n in um.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0].endswith("weight_quantized"):
            q = consts[n.input[0]]
            u8 = (q.astype(np.int16) + 128).astype(np.uint8)
            for t in um.graph.initializer:
                if t.name == n.input[0]:
                    t.CopyFrom(numpy_helper.from_array(u8, t.name))
                if t.name == n.input[2]:
                    t.CopyFrom(numpy_helper.from_array(np.array(128, np.uint8), t.name))
    conv = Q.convert_uint8_to_int8(um)
    assert not conv.exact and len(conv.weight_errors) == 3
    print(f"uint8 weights -> int8 symmetric per channel: max abs weight error {conv.max_weight_error:.3g}")
    assert 0 < conv.max_weight_error < 0.05
    assert Q.check_npu_quantization(conv.model) == []
    for name, q, zp, axis, scale in weight_params(conv.model):
        assert q.dtype == np.int8 and np.all(zp == 0) and axis in (0, 1) and scale.size > 1
    feeds = [{"image": np.random.default_rng(s).uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)} for s in range(3)]
    acc = Q.accuracy_report(um, conv.model, feeds)
    assert acc.outputs[0]["cosine"] > 0.99


def test_uint8_io_int8_mode_records_the_interface_change():
    """A tiny QDQ with a uint8 graph input read through a Reshape and a uint8 output after a Reshape."""
    s = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    z = numpy_helper.from_array(np.array(100, np.uint8), "z")
    shp = numpy_helper.from_array(np.array([1, 8], np.int64), "shp")
    nodes = [helper.make_node("Reshape", ["x", "shp"], ["xr"], name="r1"),
             helper.make_node("DequantizeLinear", ["xr", "s", "z"], ["xf"], name="dq1"),
             helper.make_node("Relu", ["xf"], ["yf"], name="relu"),
             helper.make_node("QuantizeLinear", ["yf", "s", "z"], ["yq"], name="q1"),
             helper.make_node("Reshape", ["yq", "shp"], ["y"], name="r2")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 4])],
               [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 8])], [s, z, shp])
    x = np.arange(8, dtype=np.uint8).reshape(2, 4) * 30
    ref = session(m).run(None, {"x": x})[0]
    keep = Q.convert_uint8_to_int8(m)
    assert [i.type.tensor_type.elem_type for i in keep.model.graph.input] == [TensorProto.UINT8]
    assert np.array_equal(session(keep.model).run(None, {"x": x})[0], ref)
    assert Q.check_npu_quantization(keep.model, allow_uint8_io=True) == []
    i8 = Q.convert_uint8_to_int8(m, io="int8")
    assert [(c.kind, c.name, c.dtype, c.zero_point, c.was) for c in i8.io_changes] == [
        ("input", "x", "int8", -28, "uint8"), ("output", "y", "int8", -28, "uint8")]
    got = session(i8.model).run(None, {"x": (x.astype(np.int16) - 128).astype(np.int8)})[0]
    assert np.array_equal(got.astype(np.int16) + 128, ref.astype(np.int16))
    assert Q.check_npu_quantization(i8.model) == []


@pytest.mark.skipif(not CORAL_MOBILENET.is_file(), reason="../shared/models is absent")
def test_coral_mobilenet_uint8_tflite_conversion():
    um = onnx.load(CORAL_MOBILENET)
    x = [{"input": np.random.default_rng(s).integers(0, 256, (1, 128, 128, 3)).astype(np.uint8)} for s in range(2)]
    exact = Q.convert_uint8_to_int8(um, requantize_weights=False)
    v = verify(um, exact.model, contract=VerifyContract("exact"), inputs=x)
    assert v.ok, v.outputs  # activations only: bit-exact, uint8 interface kept
    assert [i.type.tensor_type.elem_type for i in exact.model.graph.input] == [TensorProto.UINT8]
    conv = Q.convert_uint8_to_int8(um)
    an = analyze_model(conv.model, profile=PROFILE)
    assert not any(f.constraint == "int8_activations" for f in an.findings)
    assert Q.check_npu_quantization(conv.model, allow_uint8_io=True) == []
    v2 = verify(um, conv.model, contract=VerifyContract("exact"), inputs=x)
    print(f"coral mobilenet: {len(conv.weight_errors)} weights re-quantized, max abs weight error "
          f"{conv.max_weight_error:.3g}, output cosine {v2.outputs[0].cosine:.4f}")
    assert v2.outputs[0].cosine > 0.99


# ------------------------------------------------------------------------------------------------
# 4. float islands
# ------------------------------------------------------------------------------------------------


def test_prelu_island_requantized_keeping_every_existing_parameter():
    fm, qm = prelu_island_model()
    assert Q.island_nodes(qm) == ["prelu1"]
    before = analyze_model(qm, profile=PROFILE)
    res = Q.requantize_islands(qm, calib=Q.CalibrationOptions(random_samples=4), model_name="prelu_island")
    onnx.checker.check_model(res.model)
    assert res.quantized_nodes == ["prelu1"] and res.remaining == [] and res.problems == []
    assert res.changed_params == [] and res.preserved == sum(
        n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in qm.graph.node)
    # the original Q/DQ nodes are all there with their original names and parameters
    orig = {n.name: list(n.input) for n in qm.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    new = {n.name: list(n.input) for n in res.model.graph.node}
    for name, ins in orig.items():
        assert name in new and new[name][1:] == ins[1:]
    after = analyze_model(res.model, profile=PROFILE)
    assert after.estimate.sw_epochs < before.estimate.sw_epochs
    feeds = [{"x": np.random.default_rng(s).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)} for s in range(4)]
    acc = Q.accuracy_report(fm, res.model, feeds)
    assert acc.outputs[0]["cosine"] > 0.99


@pytest.mark.skipif(not MOBILEFACENET.is_file(), reason="../shared/models is absent")
def test_mobilefacenet_float_prelu_islands():
    m = onnx.load(MOBILEFACENET)
    assert len(Q.island_nodes(m)) == 33
    res = Q.requantize_islands(m, calib=Q.CalibrationOptions(random_samples=4), model_name=MOBILEFACENET.name)
    assert len(res.quantized_nodes) == 33 and res.remaining == [] and res.problems == []
    assert res.changed_params == [] and res.preserved == 294
    before = analyze_model(Q._analysis_copy(m), profile=PROFILE).estimate
    after = analyze_model(Q._analysis_copy(res.model), profile=PROFILE).estimate
    print(f"mobilefacenet: {len(res.quantized_nodes)} PRelu islands quantized, estimated SW epochs "
          f"{before.sw_epochs}/{before.epochs} -> {after.sw_epochs}/{after.epochs}")
    # before: the 33 SW PRelu of its real report (2.1: 'PRelu x33', no Q/DQ epoch); after: none left, its 7x6
    # GDConv runs on the NPU as sub-mask convs (c_info Conv2D_233_subm_0..2, OBS), unlike the 7x7 GDConv
    # of the QOperator MobileFaceNet (3 SW bands of DequantizeLinear, Conv, Cast)
    gdconv = sum(1 for g in after.groups if g.lowering == "global_depthwise_decomposed")
    assert before.sw_epochs == 33 and dict(before.sw_ops) == {"PRelu": 33}
    assert gdconv == 0 and after.sw_epochs == 0
    feeds = [{"input": np.random.default_rng(s).uniform(-1, 1, (1, 3, 112, 96)).astype(np.float32)} for s in range(2)]
    acc = Q.accuracy_report(m, res.model, feeds, debug_samples=1)
    assert acc.outputs[0]["cosine"] > 0.999


# ------------------------------------------------------------------------------------------------
# 6. symmetric output parameters (NAF013)
# ------------------------------------------------------------------------------------------------


def test_symmetric_output_params_cover_the_calibrated_range():
    s, z = Q.symmetric_output_params(0.1, 0)
    assert float(s) == pytest.approx(0.1) and int(z) == 0
    s, z = Q.symmetric_output_params(0.1, -128)  # a ReLU output: [0, 25.5]
    assert float(s) == pytest.approx(25.5 / 127) and int(z) == 0 and z.dtype == np.int8
    for scale, zp in [(0.02, 37), (0.5, -5), (0.003, 127), (1.0, -128)]:
        new, _ = Q.symmetric_output_params(scale, zp)
        lo, hi = (-128 - zp) * scale, (127 - zp) * scale
        assert -128 * float(new) <= lo + 1e-6 and 127 * float(new) >= hi - 1e-6
        assert float(new) >= scale - 1e-9  # never finer than the original
    arr, zeros = Q.symmetric_output_params(np.array([0.1, 0.2]), np.array([0, -128]))
    assert arr.shape == (2,) and zeros.tolist() == [0, 0]
    with pytest.raises(UsageError):
        Q.symmetric_output_params(0.1, 0, dtype=np.uint8)


def test_reader_streams_and_is_an_onnxruntime_calibration_reader(tmp_path):
    from onnxruntime.quantization import CalibrationDataReader

    fm = image_model(8, 8)
    for i in range(3):
        write_ppm(tmp_path / f"{i}.ppm", np.full((8, 8, 3), 40 * i))
    src = Q.open_calibration(fm, Q.CalibrationOptions(path=str(tmp_path)))
    seen = []
    reader = Q.NafixCalibrationReader(src, progress=lambda d, t: seen.append((d, t)))
    assert isinstance(reader, CalibrationDataReader)
    first = reader.get_next()
    assert seen == [(1, 3)] and first["image"].shape == (1, 3, 8, 8)
    assert len(list(reader)) == 2 and reader.get_next() is None and seen[-1] == (3, 3)
    reader.rewind()
    assert reader.get_next()["image"][0, 0, 0, 0] == pytest.approx(0.0)


def test_data_movement_island_after_a_dequantize_takes_its_parameters():
    """Conv -> Transpose -> Softmax quantized by onnxruntime with only Conv: the Transpose (reading a
    DequantizeLinear) and the Softmax are float islands. onnxruntime's own parameter sharing would
    loop forever on the Transpose; nafix gives it the input's parameters and onnxruntime the Softmax."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(5)
    w = numpy_helper.from_array((rng.normal(size=(6, 3, 1, 1)) * 0.5).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1], name="transpose"),
             helper.make_node("Softmax", ["t"], ["y"], axis=-1, name="softmax")]
    fm = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 6])], [w])
    feeds = [{"x": rng.uniform(-1, 1, (1, 3, 4, 4)).astype(np.float32)} for _ in range(4)]
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(fm, Path(tmp) / "f.onnx")
        with Q._quiet_onnxruntime():
            quantize_static(str(Path(tmp) / "f.onnx"), str(Path(tmp) / "q.onnx"), Q._FeedsReader(feeds),
                            quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8, op_types_to_quantize=["Conv"])
        qm = onnx.load(str(Path(tmp) / "q.onnx"))
    assert sorted(Q.island_nodes(qm)) == ["softmax", "transpose"]
    res = Q.requantize_islands(qm, calib=Q.CalibrationOptions(random_samples=4))
    assert sorted(res.quantized_nodes) == ["softmax", "transpose"] and res.changed_params == []
    assert any("data-movement" in c for c in res.changes)
    assert {i["op_type"] for i in res.remaining} <= {"DequantizeLinear"}  # only the trailing graph-output DQ
    prod = {o: n for n in res.model.graph.node for o in n.output}
    t_q = [n for n in res.model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "t"]
    c_dq = prod[next(n for n in res.model.graph.node if n.name == "transpose").input[0]]
    assert t_q and t_q[0].input[1:] == c_dq.input[1:]  # the Transpose output shares its input's parameters
    assert Q.accuracy_report(fm, res.model, feeds).outputs[0]["cosine"] > 0.99
