#!/usr/bin/env python3
"""Deterministic generator for nafix's committed sample models.

Every model is built from scratch with ``onnx.helper`` and seeded numpy
(``np.random.default_rng``), written as a float ONNX model, then quantized with
onnxruntime's ``quantize_static`` from a temporary copy of that float file, with
a calibration reader that yields seeded random data. The outputs are
post-processed (IR version, producer, node names, inferred shapes) so that two
runs on the same software stack give byte-identical files.

Common properties of every written file: default-domain opset 17, ``ir_version``
8 (set explicitly, also after quantization, because onnxruntime rejects the
newest IR versions), passes ``onnx.checker.check_model(full_check=True)``, runs
in onnxruntime, static shapes everywhere (inferred ``value_info`` is stored),
readable node names, ``producer_name`` "nafix-sample-models", under 2 MB.

"ST way" of quantizing (all models except ``uint8_default_quant``), the recipe
from NEURAL_ART.md section 2::

    quantize_static(float_path, out_path, reader,
                    quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    per_channel=True,
                    extra_options={'ActivationSymmetric': False, 'WeightSymmetric': True})

MinMax calibration (the default), 16 random samples (4 for the big model).

The models, and which real case of NEURAL_ART.md section 4 each reproduces:

``denoiser_257.onnx`` / ``denoiser_257_float.onnx``
    The "prime channel counts" forum case: a speech denoiser whose 257-channel
    1x1 Conv layers and Gemm(1024->257) compiled to SW epochs on core 2.1.0
    (ST called it a bug in splitting layers with certain prime channel counts;
    the layers that went to SW were the ones with 257 *output* channels).
    Input ``spec`` [1,257,1,8] (257 frequency bins as channels, 8 frames along
    W) -> ``conv_in`` 1x1 Conv 257->257 + Relu, plus ``conv_skip`` 1x1 Conv
    257->257 on the input, summed by ``add_skip`` -> ``conv_down`` 1x1 Conv
    257->32 + Relu (a 257-*input* layer, which the real compiler kept in HW) ->
    Reshape/Transpose to [8,1,32] -> ``lstm`` (hidden 128; ORT's QDQ mode does
    not quantize LSTM, so it stays a float island, as in a real export) ->
    Reshape to [1,1024] (8 frames x 128) -> ``gemm_mask`` Gemm 1024->257
    (constant B, constant C, transB=1) -> Sigmoid -> output ``mask`` [1,257].
    Three layers with 257 output channels (conv_in, conv_skip, gemm_mask), like
    the three SW ``Conv`` epochs of the forum log. ``conv_down`` goes to 32
    rather than 128 channels (so the LSTM input is 32) only to keep the float
    file under 2 MB: the Gemm alone is 1.05 MB of float32 weights.

``movenet_like.onnx`` / ``movenet_like_float.onnx``
    The MoveNet Lightning int8 case (75 epochs, 4 SW): three bilinear
    ``Resize`` in the decoder run in SW, and the trailing DequantizeLinear at
    the float output is a SW epoch; the float graph input also costs a SW
    QuantizeLinear (the "float graph input" case). Input ``image`` [1,3,96,96]
    -> three stride-2 3x3 Conv + Relu (16/24/32 channels) -> three
    ``Resize`` (mode linear, half_pixel, constant scales [1,1,2,2], empty roi),
    each followed by a 3x3 Conv + Relu (the first two also add the backbone
    feature map of the same size) -> 1x1 Conv to 13 channels + Sigmoid ->
    output ``heatmaps`` [1,13,96,96].

``classifier_softmax.onnx`` / ``classifier_softmax_float.onnx``
    The "Softmax at the end" case (MobileNetV2 QDQ, 56 epochs, the only SW one
    being Softmax unless ``--expand-softmax``): input ``image`` [1,3,64,64] ->
    three stride-2 3x3 Conv + Relu -> GlobalAveragePool -> Flatten -> Gemm to
    10 classes -> Softmax -> output ``probs`` [1,10].

``big_activations.onnx`` / ``big_activations_float.onnx``
    The "activations that overflow on-chip RAM" case (FastDepth at growing
    resolutions spilling into hyperRAM): input ``image`` [1,3,480,640] -> 3x3
    Conv 3->32 stride 1 + Relu (one int8 activation of 480*640*32 = 9.8 MB,
    far above the ~1.75 MB of npuRAM) -> three stride-2 3x3 Conv + Relu
    (32->16->16->8) -> GlobalAveragePool -> Flatten -> output ``features``
    [1,8]. Only a few thousand weights, so the file is tiny. Calibrated on 4
    samples.

``uint8_default_quant.onnx`` / ``uint8_default_quant_float.onnx``
    The "uint8 activations are rejected" case (``quantized unsigned integer
    format is not supported``, section 2): a small CNN (input ``image``
    [1,3,64,64], two stride-2 3x3 Conv + Relu, GlobalAveragePool, Flatten,
    Gemm to ``logits`` [1,10]) quantized with onnxruntime's *defaults*.
    Caveat: in onnxruntime 1.31 the keyword defaults of ``quantize_static``
    (and of ``StaticQuantConfig``) are QInt8 activations and QInt8 weights, so
    calling ``quantize_static(float, out, reader)`` bare no longer gives uint8
    (older releases defaulted to QUInt8 activations, which is what the 3P note
    describes). ORT's QDQ helper ``get_qdq_config`` still defaults to QDQ,
    QUInt8 activations (asymmetric), QInt8 symmetric per-tensor weights. The
    generator therefore calls ``quantize(float, out, get_qdq_config(float,
    reader))`` with nothing but the model and the reader, and asserts that the
    activation QuantizeLinear zero-points are uint8.

Usage::

    python sample_models/generate.py [--out DIR] [--only NAME ...]

``--out`` defaults to the folder of this script. One line is printed per file
written. Byte-identical output is expected with the library versions in
``GENERATED_WITH`` (onnx 1.23.2, onnxruntime 1.32.0, numpy 2.4.6; onnxruntime 1.31.1 gave the same
bytes).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    get_qdq_config,
    quantize,
    quantize_static,
)

SEED = 20250611  # base seed; each model derives its own generators from it
OPSET = 17
IR_VERSION = 8
PRODUCER_NAME = "nafix-sample-models"
PRODUCER_VERSION = "1"
MAX_BYTES = 2 * 1000 * 1000
# Library versions the committed files were generated with. Byte-identical output is only
# expected with these (quantization scales and serialization can change across releases).
GENERATED_WITH = {"onnx": "1.23.2", "onnxruntime": "1.32.0", "numpy": "2.4.6"}

ST_QUANT_KWARGS = dict(
    quant_format=QuantFormat.QDQ,
    activation_type=QuantType.QInt8,
    weight_type=QuantType.QInt8,
    per_channel=True,
    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
)


# --------------------------------------------------------------------------- helpers


def _rng(model_index: int, stream: int) -> np.random.Generator:
    """Independent, fixed generator per (model, purpose) so models can be built alone."""
    return np.random.default_rng([SEED, model_index, stream])


class _Graph:
    """Tiny builder around onnx.helper that keeps nodes and initializers together."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], std: float) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def node(self, op: str, name: str, inputs: list[str], outputs: list[str] | None = None, **attrs) -> str:
        outputs = outputs or [name]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0]

    def conv(self, name: str, x: str, cin: int, cout: int, k: int = 3, stride: int = 1,
             std: float | None = None, relu: bool = True) -> str:
        if std is None:
            std = float(np.sqrt(2.0 / (cin * k * k)))
        w = self.weight(f"{name}.weight", (cout, cin, k, k), std)
        b = self.weight(f"{name}.bias", (cout,), 0.01)
        p = k // 2
        y = self.node("Conv", name, [x, w, b], kernel_shape=[k, k], strides=[stride, stride],
                      pads=[p, p, p, p])
        if relu:
            y = self.node("Relu", "relu" + name.removeprefix("conv"), [y])  # conv_in -> relu_in
        return y

    def model(self, name: str, doc: str, inputs: list[onnx.ValueInfoProto],
              outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name=PRODUCER_NAME, producer_version=PRODUCER_VERSION)
        m.doc_string = doc
        return m


def _io(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


class RandomReader(CalibrationDataReader):
    """Yields ``n`` seeded random samples for a single-input model."""

    def __init__(self, input_name: str, shape: list[int], rng: np.random.Generator, n: int,
                 kind: str = "uniform"):
        if kind == "uniform":
            make = lambda: rng.random(shape, dtype=np.float32)  # noqa: E731
        elif kind == "abs_normal":
            make = lambda: np.abs(rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
        else:
            raise ValueError(kind)
        self._data = [{input_name: make()} for _ in range(n)]
        self._it = iter(self._data)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):
        self._it = iter(self._data)


def _finalize(model: onnx.ModelProto, doc: str) -> onnx.ModelProto:
    """Normalise metadata, names and shapes; validate. Returns a new model."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.ir_version = IR_VERSION
    m.producer_name = PRODUCER_NAME
    m.producer_version = PRODUCER_VERSION
    m.domain = ""
    m.model_version = 1
    m.doc_string = doc
    del m.metadata_props[:]

    # Opsets: default domain must be 17; drop imports of domains no node uses.
    used = {n.domain for n in m.graph.node}
    keep = []
    for imp in m.opset_import:
        if imp.domain in ("", "ai.onnx"):
            assert imp.version == OPSET, f"opset changed to {imp.version}"
            keep.append(helper.make_opsetid("", OPSET))
        elif imp.domain in used:
            keep.append(imp)
    assert "com.microsoft" not in used, "unexpected contrib op in sample model"
    del m.opset_import[:]
    m.opset_import.extend(keep)

    # Node names: non-empty and unique.
    seen: set[str] = set()
    for i, n in enumerate(m.graph.node):
        if not n.name:
            n.name = f"{n.op_type}_{n.output[0]}" if n.output else f"{n.op_type}_{i}"
        assert n.name not in seen, f"duplicate node name {n.name}"
        seen.add(n.name)

    # Re-infer shapes from scratch so value_info is complete, static and reproducible.
    del m.graph.value_info[:]
    m = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True, data_prop=True)
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        dims = vi.type.tensor_type.shape.dim
        assert vi.type.tensor_type.HasField("shape"), f"{vi.name}: no shape"
        assert all(d.HasField("dim_value") for d in dims), f"{vi.name}: dynamic shape"
    onnx.checker.check_model(m, full_check=True)
    return m


def _run(path: Path, rng: np.random.Generator) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in sess.get_inputs():
        assert all(isinstance(d, int) for d in i.shape), f"{path.name}: dynamic input {i.shape}"
        feeds[i.name] = rng.random(i.shape, dtype=np.float32)
    outs = sess.run(None, feeds)
    for o, meta in zip(outs, sess.get_outputs()):
        assert list(o.shape) == list(meta.shape), (path.name, o.shape, meta.shape)
        assert np.all(np.isfinite(o)), f"{path.name}: non-finite output"
    return outs


def _save(model: onnx.ModelProto, path: Path) -> int:
    data = model.SerializeToString(deterministic=True)
    assert len(data) < MAX_BYTES, f"{path.name} is {len(data)} bytes"
    path.write_bytes(data)
    return len(data)


def _activation_zero_point_types(model: onnx.ModelProto) -> set[int]:
    """Element types of the zero-points of QuantizeLinear nodes fed by non-constant tensors."""
    inits = {t.name: t for t in model.graph.initializer}
    consts = set(inits) | {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    types = set()
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in consts:
            types.add(inits[n.input[2]].data_type)
    return types


# --------------------------------------------------------------------------- builders


def build_denoiser(rng: np.random.Generator) -> onnx.ModelProto:
    g = _Graph(rng)
    frames, bins, down, hidden = 8, 257, 32, 128
    x = "spec"
    a = g.conv("conv_in", x, bins, bins, k=1, std=0.05, relu=True)
    s = g.conv("conv_skip", x, bins, bins, k=1, std=0.05, relu=False)
    h = g.node("Add", "add_skip", [a, s])
    h = g.conv("conv_down", h, bins, down, k=1, std=0.05, relu=True)  # [1,32,1,8]
    h = g.node("Reshape", "reshape_seq", [h, g.const("reshape_seq.shape", np.array([1, down, frames], np.int64))])
    h = g.node("Transpose", "transpose_seq", [h], perm=[2, 0, 1])  # [8,1,32]
    w = g.weight("lstm.W", (1, 4 * hidden, down), 0.05)
    r = g.weight("lstm.R", (1, 4 * hidden, hidden), 0.05)
    b = g.weight("lstm.B", (1, 8 * hidden), 0.01)
    y = g.node("LSTM", "lstm", [h, w, r, b], ["lstm_y"], hidden_size=hidden)  # [8,1,1,128]
    y = g.node("Reshape", "reshape_flat", [y, g.const("reshape_flat.shape", np.array([1, frames * hidden], np.int64))])
    gw = g.weight("gemm_mask.weight", (bins, frames * hidden), 0.05)
    gb = g.weight("gemm_mask.bias", (bins,), 0.01)
    y = g.node("Gemm", "gemm_mask", [y, gw, gb], transB=1)
    g.node("Sigmoid", "sigmoid_mask", [y], ["mask"])
    return g.model("denoiser_257", "", [_io("spec", [1, bins, 1, frames])], [_io("mask", [1, bins])])


def build_movenet(rng: np.random.Generator) -> onnx.ModelProto:
    g = _Graph(rng)
    f1 = g.conv("conv1", "image", 3, 16, stride=2)  # 48x48
    f2 = g.conv("conv2", f1, 16, 24, stride=2)  # 24x24
    f3 = g.conv("conv3", f2, 24, 32, stride=2)  # 12x12

    def up(i: int, x: str) -> str:
        scales = g.const(f"resize_up{i}.scales", np.array([1, 1, 2, 2], np.float32))
        return g.node("Resize", f"resize_up{i}", [x, "", scales], mode="linear",
                      coordinate_transformation_mode="half_pixel")

    d = g.conv("conv_dec1", up(1, f3), 32, 24)  # 24x24
    d = g.node("Add", "add_skip1", [d, f2])
    d = g.conv("conv_dec2", up(2, d), 24, 16)  # 48x48
    d = g.node("Add", "add_skip2", [d, f1])
    d = g.conv("conv_dec3", up(3, d), 16, 16)  # 96x96
    d = g.conv("conv_head", d, 16, 13, k=1, relu=False)
    g.node("Sigmoid", "sigmoid_head", [d], ["heatmaps"])
    return g.model("movenet_like", "", [_io("image", [1, 3, 96, 96])], [_io("heatmaps", [1, 13, 96, 96])])


def build_classifier(rng: np.random.Generator) -> onnx.ModelProto:
    g = _Graph(rng)
    x = g.conv("conv1", "image", 3, 16, stride=2)
    x = g.conv("conv2", x, 16, 32, stride=2)
    x = g.conv("conv3", x, 32, 64, stride=2)
    x = g.node("GlobalAveragePool", "gap", [x])
    x = g.node("Flatten", "flatten", [x], axis=1)
    x = g.node("Gemm", "gemm_fc", [x, g.weight("gemm_fc.weight", (10, 64), 0.2),
                                   g.weight("gemm_fc.bias", (10,), 0.01)], transB=1)
    g.node("Softmax", "softmax", [x], ["probs"], axis=-1)
    return g.model("classifier_softmax", "", [_io("image", [1, 3, 64, 64])], [_io("probs", [1, 10])])


def build_big(rng: np.random.Generator) -> onnx.ModelProto:
    g = _Graph(rng)
    x = g.conv("conv1", "image", 3, 32, stride=1)  # 480x640x32
    x = g.conv("conv2", x, 32, 16, stride=2)  # 240x320
    x = g.conv("conv3", x, 16, 16, stride=2)  # 120x160
    x = g.conv("conv4", x, 16, 8, stride=2)  # 60x80
    x = g.node("GlobalAveragePool", "gap", [x])
    g.node("Flatten", "flatten", [x], ["features"], axis=1)
    return g.model("big_activations", "", [_io("image", [1, 3, 480, 640])], [_io("features", [1, 8])])


def build_uint8(rng: np.random.Generator) -> onnx.ModelProto:
    g = _Graph(rng)
    x = g.conv("conv1", "image", 3, 8, stride=2)
    x = g.conv("conv2", x, 8, 16, stride=2)
    x = g.node("GlobalAveragePool", "gap", [x])
    x = g.node("Flatten", "flatten", [x], axis=1)
    g.node("Gemm", "gemm_fc", [x, g.weight("gemm_fc.weight", (10, 16), 0.2),
                               g.weight("gemm_fc.bias", (10,), 0.01)], ["logits"], transB=1)
    return g.model("uint8_default_quant", "", [_io("image", [1, 3, 64, 64])], [_io("logits", [1, 10])])


# (name, model index for seeding, builder, calibration samples, calibration kind, quantizer, doc)
SPECS: list[tuple[str, int, Callable, int, str, str, str]] = [
    ("denoiser_257", 1, build_denoiser, 16, "abs_normal", "st",
     "Denoiser with 257-output 1x1 Conv and Gemm 1024->257 around an LSTM (NEURAL_ART.md s4, prime channel counts)."),
    ("movenet_like", 2, build_movenet, 16, "uniform", "st",
     "MoveNet-like heatmap model: float I/O, three bilinear (linear/half_pixel) Resize (NEURAL_ART.md s4)."),
    ("classifier_softmax", 3, build_classifier, 16, "uniform", "st",
     "Small CNN classifier ending in Softmax (NEURAL_ART.md s4, Softmax at the end)."),
    ("big_activations", 4, build_big, 4, "uniform", "st",
     "480x640 input, 32-channel full-resolution activation (9.8 MB int8) overflowing npuRAM (NEURAL_ART.md s4)."),
    ("uint8_default_quant", 5, build_uint8, 16, "uniform", "ort_default",
     "Small CNN quantized with onnxruntime default QDQ config: uint8 activations (NEURAL_ART.md s2)."),
]
NAMES = [s[0] for s in SPECS]


def generate(out_dir: Path, only: list[str] | None = None, log=print) -> list[tuple[Path, int]]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[tuple[Path, int]] = []
    for name, idx, builder, n_calib, kind, quant, doc in SPECS:
        if only and name not in only:
            continue
        float_model = _finalize(builder(_rng(idx, 0)), doc + " Float source.")
        input_vi = float_model.graph.input[0]
        in_shape = [d.dim_value for d in input_vi.type.tensor_type.shape.dim]
        reader = RandomReader(input_vi.name, in_shape, _rng(idx, 1), n_calib, kind)

        with tempfile.TemporaryDirectory(prefix=f"nafix_{name}_") as tmp:
            fpath = Path(tmp) / f"{name}_float.onnx"
            qpath = Path(tmp) / f"{name}.onnx"
            _save(float_model, fpath)
            if quant == "st":
                quantize_static(str(fpath), str(qpath), reader, **ST_QUANT_KWARGS)
            else:
                # onnxruntime's default QDQ config: QUInt8 activations, QInt8 weights, per-tensor
                quantize(str(fpath), str(qpath), get_qdq_config(str(fpath), reader))
            qmodel = onnx.load(str(qpath))
        qmodel = _finalize(qmodel, doc)
        zp_types = _activation_zero_point_types(qmodel)
        if quant == "st":
            assert zp_types == {TensorProto.INT8}, f"{name}: activation zero-points {zp_types}"
        else:
            assert zp_types == {TensorProto.UINT8}, f"{name}: expected uint8 activations, got {zp_types}"

        for model, fname in ((float_model, f"{name}_float.onnx"), (qmodel, f"{name}.onnx")):
            path = out_dir / fname
            size = _save(model, path)
            _run(path, _rng(idx, 2))
            written.append((path, size))
            ops = len(model.graph.node)
            log(f"wrote {path} ({size} bytes, {ops} nodes)")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                    help="output folder (default: the folder of this script)")
    ap.add_argument("--only", nargs="+", choices=NAMES, help="generate only these models")
    args = ap.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)  # silence ORT quantizer advice on the root logger
    ort.set_default_logger_severity(3)
    t0 = time.perf_counter()
    generate(args.out, args.only)
    print(f"done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
