"""Builders for the ``qdq`` family (NAF004 int8 graph outputs, NAF005 int8 graph input).

Every builder is deterministic (seeded), small, opset 17, IR 8, static shapes. ``qdq=True`` quantizes
the float model the "ST way" with onnxruntime's ``quantize_static`` (see :func:`st_quantize`), so the
Q/DQ structure is exactly what users have. The helpers here (:class:`Net`, :func:`st_quantize`,
:func:`finish`) are shared with ``tests/builders/ops.py``.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
SEED = 4005
ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------
# Shared helpers
# ------------------------------------------------------------------------------------------------


class Net:
    """A tiny onnx.helper graph builder: nodes + initializers, seeded weights."""

    def __init__(self, seed: int = SEED):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._k = 0

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def weight(self, name: str, shape, std: float = 0.3) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def node(self, op: str, inputs: list[str], name: str | None = None, outputs: list[str] | None = None,
             **attrs) -> str:
        self._k += 1
        name = name or f"{op.lower()}{self._k}"
        outputs = outputs or [name]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0]

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, group: int = 1,
             name: str | None = None, pads: list[int] | None = None, out: str | None = None, **attrs) -> str:
        self._k += 1
        name = name or f"conv{self._k}"
        std = float(np.sqrt(2.0 / (cin // group * k * k)))
        w = self.weight(f"{name}.weight", (cout, cin // group, k, k), std)
        b = self.weight(f"{name}.bias", (cout,), 0.05)
        if pads is None and "auto_pad" not in attrs:
            pads = [k // 2] * 4
        if pads is not None:
            attrs["pads"] = pads
        return self.node("Conv", [x, w, b], name=name, outputs=[out] if out else None, kernel_shape=[k, k],
                         strides=[stride, stride] if isinstance(stride, int) else list(stride), group=group, **attrs)

    def model(self, inputs: dict[str, list[int]], outputs: dict[str, list[int] | None],
              name: str = "nafix_case") -> onnx.ModelProto:
        ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()]
        g = helper.make_graph(self.nodes, name, ins, outs, initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="nafix-tests")
        return finish(m)


def finish(model: onnx.ModelProto) -> onnx.ModelProto:
    """IR 8, opset 17 only in the default domain, inferred static shapes, checked."""
    model.ir_version = IR_VERSION
    del model.graph.value_info[:]
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def _input_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    return {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


class _Reader:
    def __init__(self, shapes: dict[str, list[int]], n: int, seed: int, kind: str):
        rng = np.random.default_rng(seed)
        self.data = []
        for _ in range(n):
            feed = {}
            for name, shape in shapes.items():
                if kind == "uniform":
                    feed[name] = rng.random(shape, dtype=np.float32)
                else:
                    feed[name] = rng.standard_normal(shape).astype(np.float32)
            self.data.append(feed)
        self.it = iter(self.data)

    def get_next(self):
        return next(self.it, None)

    def rewind(self):
        self.it = iter(self.data)


def st_quantize(model: onnx.ModelProto, *, seed: int = SEED, n: int = 8, kind: str = "normal",
                activation: str = "int8", keep_activations: bool = False, op_types: list[str] | None = None,
                exclude: list[str] | None = None) -> onnx.ModelProto:
    """Quantize ``model`` the ST way: QDQ, int8 activations (asymmetric), int8 symmetric per-channel
    weights, MinMax calibration on ``n`` seeded random samples. ``keep_activations`` keeps Relu/Clip
    (QDQKeepRemovableActivations); ``op_types`` adds op types to quantize (Sub, DepthToSpace are not in
    onnxruntime's default list); ``exclude`` names nodes to leave in float. ``activation='uint8'`` gives
    onnxruntime's old uint8 default (for non-firing cases)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.registry import QLinearOpsRegistry

    logging.getLogger().setLevel(logging.ERROR)
    reader = _Reader(_input_shapes(model), n, seed, kind)
    CalibrationDataReader.register(_Reader)
    extra = {"ActivationSymmetric": False, "WeightSymmetric": True}
    if keep_activations:
        extra["QDQKeepRemovableActivations"] = True
    kwargs = {}
    if op_types:
        kwargs["op_types_to_quantize"] = sorted(set(QLinearOpsRegistry) | set(op_types) | {"BatchNormalization", "ConvTranspose"})
    if exclude:
        kwargs["nodes_to_exclude"] = list(exclude)
    with tempfile.TemporaryDirectory(prefix="nafix_case_") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
        onnx.save(model, str(src))
        quantize_static(str(src), str(dst), reader, quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8 if activation == "uint8" else QuantType.QInt8,
                        weight_type=QuantType.QInt8, per_channel=True, extra_options=extra, **kwargs)
        q = onnx.load(str(dst))
    # Keep only the default-domain opset 17 import (the quantizer may add com.microsoft).
    used = {n.domain for n in q.graph.node}
    keep = [o for o in q.opset_import if o.domain in ("", "ai.onnx") or o.domain in used]
    del q.opset_import[:]
    q.opset_import.extend(keep)
    return finish(q)


def maybe_quantize(model: onnx.ModelProto, qdq: bool, **kw) -> onnx.ModelProto:
    return st_quantize(model, **kw) if qdq else model


def sample(name: str) -> onnx.ModelProto:
    """A committed sample model from ``sample_models/`` (e.g. ``movenet_like``)."""
    return onnx.load(str(ROOT / "sample_models" / f"{name}.onnx"))


# ------------------------------------------------------------------------------------------------
# NAF004: DequantizeLinear at a graph output
# ------------------------------------------------------------------------------------------------


def output_dq(qdq: bool = True, via: str | None = None, extra_consumer: bool = False, two_outputs: bool = False,
              activation: str = "int8", seed: int = SEED) -> onnx.ModelProto:
    """image [1,3,16,16] -> Conv 3->8 + Relu -> Conv 8->6 -> ``y`` (float) ... -> graph output ``out``.

    ``via``: None (``y`` is the output), "reshape" ([1,6,256]), "flatten", "squeeze" (GlobalAveragePool then
    Squeeze to [1,6]), "transpose" (NHWC) or "reshape_transpose": data movement between the last DequantizeLinear
    and the output; those movement ops are kept in float (excluded from quantization), as converters
    other than onnxruntime produce them. ``extra_consumer``: ``y`` also feeds a Sigmoid whose result
    is a second output ``aux``. ``two_outputs``: the model has a second head ``out2``.
    """
    g = Net(seed)
    h = g.conv("image", 3, 8, name="conv_a")
    h = g.node("Relu", [h], name="relu_a")
    excl = []
    y = g.conv(h, 8, 6, name="conv_b")
    if via == "squeeze":
        y = g.node("GlobalAveragePool", [y], name="gap")
    outs: dict[str, list[int] | None] = {}
    if via is None:
        g.nodes[-1].output[0] = "out"
        y = "out"
        outs["out"] = None
    elif via == "reshape":
        g.node("Reshape", [y, g.const("shape", np.array([1, 6, 256], np.int64))], name="reshape_out", outputs=["out"])
        excl.append("reshape_out")
    elif via == "flatten":
        g.node("Flatten", [y], name="flatten_out", outputs=["out"], axis=1)
        excl.append("flatten_out")
    elif via == "squeeze":
        g.node("Squeeze", [y, g.const("sq_axes", np.array([2, 3], np.int64))], name="squeeze_out", outputs=["out"])
        excl.append("squeeze_out")
    elif via == "transpose":
        g.node("Transpose", [y], name="transpose_out", outputs=["out"], perm=[0, 2, 3, 1])
        excl.append("transpose_out")
    elif via == "reshape_transpose":
        r = g.node("Reshape", [y, g.const("shape", np.array([1, 6, 256], np.int64))], name="reshape_out")
        g.node("Transpose", [r], name="transpose_out", outputs=["out"], perm=[0, 2, 1])
        excl += ["reshape_out", "transpose_out"]
    else:
        raise ValueError(via)
    outs.setdefault("out", None)
    if extra_consumer:
        g.node("Sigmoid", [y], name="sigmoid_aux", outputs=["aux"])
        outs["aux"] = None
    if two_outputs:
        z = g.conv(h, 8, 4, k=1, name="conv_c", pads=[0, 0, 0, 0])
        g.node("Sigmoid", [z], name="sigmoid_out2", outputs=["out2"])
        outs["out2"] = None
    m = g.model({"image": [1, 3, 16, 16]}, outs)
    return maybe_quantize(m, qdq, seed=seed, exclude=excl, activation=activation)


def output_dq_per_axis() -> onnx.ModelProto:
    """A hand-made QDQ model whose output DequantizeLinear is per-channel (axis 1): NAF004 near-miss."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    per_axis (float[1,4,8,8] x) => (float[1,4,8,8] y) {
        s = Constant <value = float {0.05}> ()
        z = Constant <value = int8 {0}> ()
        q = QuantizeLinear (x, s, z)
        d = DequantizeLinear (q, s, z)
        r = Relu (d)
        sc = Constant <value = float[4] {0.01, 0.02, 0.03, 0.04}> ()
        zc = Constant <value = int8[4] {0, 1, -2, 3}> ()
        q2 = QuantizeLinear <axis = 1> (r, sc, zc)
        y = DequantizeLinear <axis = 1> (q2, sc, zc)
    }
    """
    return finish(onnx.parser.parse_model(text))


# ------------------------------------------------------------------------------------------------
# NAF005: QuantizeLinear on a float graph input
# ------------------------------------------------------------------------------------------------


def input_q(qdq: bool = True, prologue: str | None = None, extra_consumer: bool = False, raw_reader: bool = False,
            activation: str = "int8", seed: int = SEED + 1) -> onnx.ModelProto:
    """Float graph input ``x`` -> (prologue) -> Conv 3->8 + Relu -> GlobalAveragePool -> Flatten -> ``y``.

    ``prologue``: None (``x`` is [1,3,16,16] NCHW), "transpose" (yamnet-style: ``x`` is NHWC
    [1,16,16,3], a float Transpose to NCHW before the first QuantizeLinear), "reshape_transpose"
    (``x`` is [1,256,3] -> Reshape [1,16,16,3] -> Transpose). The prologue is kept in float (excluded
    from quantization), as in the real yamnet model. ``extra_consumer``: ``x`` also feeds a
    ReduceMean (second output ``stats``; onnxruntime makes it read the input's DequantizeLinear);
    ``raw_reader``: with ``extra_consumer``, that ReduceMean reads the float input ``x`` itself.
    """
    g = Net(seed)
    excl = []
    if prologue is None:
        shape = [1, 3, 16, 16]
        h = "x"
    elif prologue == "transpose":
        shape = [1, 16, 16, 3]
        h = g.node("Transpose", ["x"], name="transpose_in", perm=[0, 3, 1, 2])
        excl.append("transpose_in")
    elif prologue == "reshape_transpose":
        shape = [1, 256, 3]
        h = g.node("Reshape", ["x", g.const("shape_in", np.array([1, 16, 16, 3], np.int64))], name="reshape_in")
        h = g.node("Transpose", [h], name="transpose_in", perm=[0, 3, 1, 2])
        excl += ["reshape_in", "transpose_in"]
    else:
        raise ValueError(prologue)
    h = g.conv(h, 3, 8, name="conv_a")
    h = g.node("Relu", [h], name="relu_a")
    h = g.conv(h, 8, 8, name="conv_b", stride=2)
    h = g.node("GlobalAveragePool", [h], name="gap")
    g.node("Flatten", [h], name="flatten", outputs=["y"], axis=1)
    outs = {"y": [1, 8]}
    if extra_consumer:
        g.node("ReduceMean", ["x"], name="stats_mean", outputs=["stats"], keepdims=0)
        outs["stats"] = None
        excl.append("stats_mean")
    m = g.model({"x": shape}, outs)
    m = maybe_quantize(m, qdq, seed=seed, exclude=excl, activation=activation, kind="uniform")
    if raw_reader:
        for n in m.graph.node:
            if n.name == "stats_mean":
                n.input[0] = "x"
        m = finish(m)
    return m


def input_q_per_axis() -> onnx.ModelProto:
    """A hand-made QDQ model quantizing its float input per channel (axis 1): NAF005 near-miss."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    per_axis_in (float[1,4,8,8] x) => (float[1,4,8,8] y) {
        sc = Constant <value = float[4] {0.01, 0.02, 0.03, 0.04}> ()
        zc = Constant <value = int8[4] {0, 1, -2, 3}> ()
        q = QuantizeLinear <axis = 1> (x, sc, zc)
        d = DequantizeLinear <axis = 1> (q, sc, zc)
        r = Relu (d)
        s = Constant <value = float {0.05}> ()
        z = Constant <value = int8 {-128}> ()
        q2 = QuantizeLinear (r, s, z)
        y = DequantizeLinear (q2, s, z)
    }
    """
    return finish(onnx.parser.parse_model(text))


def float_sub_chain(blocks: int, c: int = 8, hw: int = 8, sub_every: int = 8, seed: int = 0) -> onnx.ModelProto:
    """input -> blocks x (Conv 1x1 c->c + bias -> Relu), with Sub(constant, x) after every
    ``sub_every``-th Conv (NAF006 rewrites it once quantized: one change per ``sub_every`` blocks).
    Also the synthetic chains of ``scripts/bench_speed.py``."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "input"
    for i in range(blocks):
        inits += [numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.3).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(c) * 0.1).astype(np.float32), f"b{i}")]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"conv{i}"], name=f"conv{i}"))
        x = f"conv{i}"
        if sub_every and i % sub_every == sub_every - 1:
            inits.append(numpy_helper.from_array((1 + 0.5 * rng.standard_normal((1, c, 1, 1))).astype(np.float32),
                                                 f"subc{i}"))
            nodes.append(helper.make_node("Sub", [f"subc{i}", x], [f"sub{i}"], name=f"sub{i}"))
            x = f"sub{i}"
        nodes.append(helper.make_node("Relu", [x], [f"relu{i}"], name=f"relu{i}"))
        x = f"relu{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, hw, hw])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def qdq_sub_chain(blocks: int) -> onnx.ModelProto:
    """:func:`float_sub_chain` (4 channels, a Sub every 4th block) quantized the ST way, the Sub too:
    NAF006 rewrites each Sub, LSB-level changes the gate judges."""
    return st_quantize(float_sub_chain(blocks, c=4, hw=6, sub_every=4, seed=2), op_types=["Sub"])
