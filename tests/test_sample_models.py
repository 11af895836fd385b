"""Tests for the committed sample models in sample_models/ and their generator.

The whole generation takes about a second, so the determinism test regenerates every model.
The byte-for-byte comparison is skipped (the regeneration itself still runs) when the installed
onnx / onnxruntime / numpy differ from the versions recorded in generate.py's GENERATED_WITH.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
GENERATOR = SAMPLES / "generate.py"

QUANTIZED = ["denoiser_257", "movenet_like", "classifier_softmax", "big_activations", "uint8_default_quant"]
ST_WAY = [n for n in QUANTIZED if n != "uint8_default_quant"]
FILES = [f"{n}.onnx" for n in QUANTIZED] + [f"{n}_float.onnx" for n in QUANTIZED]

# graph input / output names and shapes (a contract other code depends on)
IO = {
    "denoiser_257": ({"spec": [1, 257, 1, 8]}, {"mask": [1, 257]}),
    "movenet_like": ({"image": [1, 3, 96, 96]}, {"heatmaps": [1, 13, 96, 96]}),
    "classifier_softmax": ({"image": [1, 3, 64, 64]}, {"probs": [1, 10]}),
    "big_activations": ({"image": [1, 3, 480, 640]}, {"features": [1, 8]}),
    "uint8_default_quant": ({"image": [1, 3, 64, 64]}, {"logits": [1, 10]}),
}


def _base(fname: str) -> str:
    return fname[: -len(".onnx")].removesuffix("_float")


def _load(fname: str) -> onnx.ModelProto:
    return onnx.load(str(SAMPLES / fname))


def _dims(vi: onnx.ValueInfoProto) -> list[int]:
    dims = vi.type.tensor_type.shape.dim
    assert all(d.HasField("dim_value") for d in dims), f"{vi.name} has a non-static dim"
    return [d.dim_value for d in dims]


def _inits(m: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in m.graph.initializer}


def _producers(m: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in m.graph.node for o in n.output}


def _attrs(n: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def _activation_qs(m: onnx.ModelProto) -> list[onnx.NodeProto]:
    inits = _inits(m)
    return [n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits]


def _weight_dq(m: onnx.ModelProto, node: onnx.NodeProto) -> onnx.NodeProto:
    """The DequantizeLinear that feeds the weight input (input 1) of a Conv/Gemm in a QDQ model."""
    dq = _producers(m).get(node.input[1])
    assert dq is not None and dq.op_type == "DequantizeLinear", f"{node.name}: weight not from a DQ"
    assert dq.input[0] in _inits(m), f"{node.name}: quantized weight is not a constant"
    return dq


def _out_channels(m: onnx.ModelProto, node: onnx.NodeProto) -> int:
    """Output channels of a Conv (W[0]) or a Gemm (B[0] with transB=1, else B[1])."""
    inits = _inits(m)
    name = node.input[1]
    if name not in inits:  # QDQ: look through the weight DQ
        name = _weight_dq(m, node).input[0]
    shape = list(inits[name].dims)
    if node.op_type == "Gemm" and not _attrs(node).get("transB", 0):
        return shape[1]
    return shape[0]


# ----------------------------------------------------------------------------- every file


@pytest.mark.parametrize("fname", FILES)
def test_file_exists_and_small(fname):
    path = SAMPLES / fname
    assert path.is_file()
    assert path.stat().st_size < 2 * 1000 * 1000


@pytest.mark.parametrize("fname", FILES)
def test_checker_metadata_static_shapes(fname):
    m = _load(fname)
    onnx.checker.check_model(m, full_check=True)
    assert m.ir_version == 8
    assert m.producer_name == "nafix-sample-models"
    opsets = {o.domain: o.version for o in m.opset_import}
    assert opsets == {"": 17}
    assert all(n.domain in ("", "ai.onnx") for n in m.graph.node)
    names = [n.name for n in m.graph.node]
    assert all(names) and len(set(names)) == len(names)

    ins, outs = IO[_base(fname)]
    inits = _inits(m)
    assert {i.name: _dims(i) for i in m.graph.input if i.name not in inits} == ins
    assert {o.name: _dims(o) for o in m.graph.output} == outs
    # every intermediate tensor has a stored, fully static shape
    typed = {vi.name for vi in m.graph.value_info}
    for vi in m.graph.value_info:
        _dims(vi)
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        _dims(vi)
    produced = {o for n in m.graph.node for o in n.output if o} - {o.name for o in m.graph.output}
    assert produced <= typed


@pytest.mark.parametrize("fname", FILES)
def test_runs_in_onnxruntime(fname):
    sess = ort.InferenceSession(str(SAMPLES / fname), providers=["CPUExecutionProvider"])
    ins, outs = IO[_base(fname)]
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        assert i.shape == ins[i.name]  # all ints: no symbolic dims
        feeds[i.name] = rng.random(i.shape, dtype=np.float32)
    results = sess.run(None, feeds)
    for meta, r in zip(sess.get_outputs(), results):
        assert list(r.shape) == outs[meta.name]
        assert r.dtype == np.float32
        assert np.all(np.isfinite(r))


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_close_to_float(name):
    rng = np.random.default_rng(1)
    ins, _ = IO[name]
    feeds = {k: rng.random(v, dtype=np.float32) for k, v in ins.items()}
    q = ort.InferenceSession(str(SAMPLES / f"{name}.onnx")).run(None, feeds)
    f = ort.InferenceSession(str(SAMPLES / f"{name}_float.onnx")).run(None, feeds)
    for a, b in zip(q, f):
        spread = float(b.max() - b.min()) or 1.0
        assert np.abs(a - b).max() < 0.25 * spread + 0.05


# ----------------------------------------------------------------------------- quantization


@pytest.mark.parametrize("name", ST_WAY)
def test_st_way_quantization(name):
    """QDQ, int8 activations, int8 symmetric per-channel constant weights for every Conv/Gemm."""
    m = _load(f"{name}.onnx")
    inits = _inits(m)
    qs = _activation_qs(m)
    assert qs
    for q in qs:
        assert inits[q.input[2]].data_type == TensorProto.INT8, q.name
    layers = [n for n in m.graph.node if n.op_type in ("Conv", "Gemm")]
    assert layers
    for n in layers:
        dq = _weight_dq(m, n)
        assert "axis" in _attrs(dq), f"{n.name}: weights not per-channel"
        w = inits[dq.input[0]]
        zp = numpy_helper.to_array(inits[dq.input[2]])
        scale = numpy_helper.to_array(inits[dq.input[1]])
        assert w.data_type == TensorProto.INT8
        assert zp.dtype == np.int8 and np.all(zp == 0)
        assert scale.shape == (_out_channels(m, n),)


def test_uint8_model_has_uint8_activations():
    m = _load("uint8_default_quant.onnx")
    inits = _inits(m)
    qs = _activation_qs(m)
    assert qs
    assert {inits[q.input[2]].data_type for q in qs} == {TensorProto.UINT8}
    dqs = [n for n in m.graph.node if n.op_type == "DequantizeLinear"]
    assert any(inits[d.input[2]].data_type == TensorProto.UINT8 for d in dqs if len(d.input) > 2)
    # the graph input is quantized to uint8 right away
    first = [q for q in qs if q.input[0] == "image"]
    assert len(first) == 1 and inits[first[0].input[2]].data_type == TensorProto.UINT8


# ----------------------------------------------------------------------------- per-model structure


@pytest.mark.parametrize("fname", ["denoiser_257.onnx", "denoiser_257_float.onnx"])
def test_denoiser_257_channel_layers(fname):
    m = _load(fname)
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("LSTM") == 1
    wide = [n for n in m.graph.node if n.op_type in ("Conv", "Gemm") and _out_channels(m, n) == 257]
    assert sorted(n.name for n in wide) == ["conv_in", "conv_skip", "gemm_mask"]
    inits = _inits(m)
    for n in wide:
        if n.op_type == "Conv":
            assert _attrs(n)["kernel_shape"] == [1, 1]
        # constant weights and bias, directly or through a DQ of a constant
        for inp in n.input[1:]:
            src = inp if inp in inits else _producers(m)[inp].input[0]
            assert src in inits, f"{n.name}: {inp} is not constant"
    gemm = next(n for n in wide if n.op_type == "Gemm")
    assert _attrs(gemm).get("transB") == 1
    w = gemm.input[1] if gemm.input[1] in inits else _weight_dq(m, gemm).input[0]
    assert list(inits[w].dims) == [257, 1024]
    down = next(n for n in m.graph.node if n.name == "conv_down")
    w = down.input[1] if down.input[1] in inits else _weight_dq(m, down).input[0]
    assert list(inits[w].dims)[1] == 257  # a 257-input layer


def test_denoiser_quantized_lstm_stays_float_and_wide_layers_per_channel():
    m = _load("denoiser_257.onnx")
    inits = _inits(m)
    lstm = next(n for n in m.graph.node if n.op_type == "LSTM")
    for w in lstm.input[1:4]:
        assert inits[w].data_type == TensorProto.FLOAT
    for name in ("conv_in", "conv_skip", "gemm_mask"):
        node = next(n for n in m.graph.node if n.name == name)
        dq = _weight_dq(m, node)
        assert _attrs(dq)["axis"] == 0
        assert inits[dq.input[0]].data_type == TensorProto.INT8
        zp = numpy_helper.to_array(inits[dq.input[2]])
        assert zp.dtype == np.int8 and zp.shape == (257,)


@pytest.mark.parametrize("fname", ["movenet_like.onnx", "movenet_like_float.onnx"])
def test_movenet_three_linear_resizes(fname):
    m = _load(fname)
    inits = _inits(m)
    resizes = [n for n in m.graph.node if n.op_type == "Resize"]
    assert len(resizes) == 3
    for r in resizes:
        a = _attrs(r)
        assert a["mode"] == b"linear"
        assert a["coordinate_transformation_mode"] == b"half_pixel"
        assert r.input[1] == ""
        assert np.array_equal(numpy_helper.to_array(inits[r.input[2]]), [1, 1, 2, 2])
    head = next(n for n in m.graph.node if n.name == "conv_head")
    assert _out_channels(m, head) == 13


def test_movenet_float_edges():
    m = _load("movenet_like.onnx")
    q_in = [n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "image"]
    assert len(q_in) == 1
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    out = _producers(m)["heatmaps"]
    assert out.op_type == "DequantizeLinear"
    assert m.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT


@pytest.mark.parametrize("fname", ["classifier_softmax.onnx", "classifier_softmax_float.onnx"])
def test_classifier_ends_in_softmax(fname):
    m = _load(fname)
    prod = _producers(m)
    node = prod["probs"]
    while node.op_type in ("QuantizeLinear", "DequantizeLinear"):
        node = prod[node.input[0]]
    assert node.op_type == "Softmax"
    assert sum(n.op_type == "Softmax" for n in m.graph.node) == 1
    assert any(n.op_type == "GlobalAveragePool" for n in m.graph.node)


@pytest.mark.parametrize("fname", ["big_activations.onnx", "big_activations_float.onnx"])
def test_big_activation_exceeds_npu_ram(fname):
    m = _load(fname)
    biggest = max(int(np.prod(_dims(vi))) for vi in m.graph.value_info)
    assert biggest >= 480 * 640 * 32  # elements = int8 bytes: 9.8 MB >> ~1.75 MB npuRAM
    conv1 = next(n for n in m.graph.node if n.name == "conv1")
    assert _out_channels(m, conv1) == 32 and _attrs(conv1)["strides"] == [1, 1]


# ----------------------------------------------------------------------------- determinism


def test_generator_reproduces_committed_files_byte_for_byte(tmp_path):
    proc = subprocess.run([sys.executable, str(GENERATOR), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == len(FILES)
    produced = sorted(p.name for p in tmp_path.glob("*.onnx"))
    assert produced == sorted(FILES)
    recorded = dict(re.findall(r'"(onnx|onnxruntime|numpy)": "([^"]+)"',
                               re.search(r"GENERATED_WITH = \{[^}]*\}", GENERATOR.read_text()).group(0)))
    assert len(recorded) == 3
    installed = {k: importlib.metadata.version(k) for k in recorded}
    if installed != recorded:
        pytest.skip(f"byte comparison needs {recorded}, installed {installed}")
    for fname in FILES:
        assert (tmp_path / fname).read_bytes() == (SAMPLES / fname).read_bytes(), fname
