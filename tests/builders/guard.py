"""Builders for issue 11's tests (never worse, compilable, noise-floor gate) and NAF014/NAF015 cases.

Deterministic (seeded), opset 17, IR version 8, static shapes. QDQ models are quantized the "ST
way" with onnxruntime's ``quantize_static`` (tests.builders.common.quantize_st); where onnxruntime
drops an activation into the QuantizeLinear range, ``keep_relu`` puts it back between the op and
its QuantizeLinear (Conv -> Relu -> QuantizeLinear, as TFLite-converted and hand-written QDQ models
have it).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.builders.common import GraphParts, infer, quantize_st

OPSET = 17
IR_VERSION = 8
SEED = 20251123


class _Net(GraphParts):
    def __init__(self, seed: int):
        super().__init__(SEED, seed)

    def weight(self, name: str, shape, std: float | None = None) -> str:
        if std is None:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            std = float(np.sqrt(2.0 / max(fan_in, 1)))
        return self.const(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def node(self, op: str, name: str, inputs, **attrs) -> str:
        self.nodes.append(helper.make_node(op, list(inputs), [name], name=name, **attrs))
        return name

    def model(self, name: str, inp: tuple[str, list[int]], outs: list[str]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info(inp[0], TensorProto.FLOAT, inp[1])],
                                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                                  initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="nafix-tests")
        m.ir_version = IR_VERSION
        return infer(m)


def _qdq(m: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    return infer(quantize_st(m, np.random.default_rng([SEED, seed, 1])))


def _restore_relus(q: onnx.ModelProto, convs: list[str]) -> onnx.ModelProto:
    """Put a Relu back between each named Conv and the QuantizeLinear onnxruntime gave it."""
    nodes = list(q.graph.node)
    out: list[onnx.NodeProto] = []
    for n in nodes:
        out.append(n)
        if n.op_type == "Conv" and n.name in convs:
            y = n.output[0]
            r = y + "_relu"
            for c in nodes:
                if c.op_type == "QuantizeLinear" and c.input[0] == y:
                    c.input[0] = r
            out.append(helper.make_node("Relu", [y], [r], name=n.name + "_relu"))
    del q.graph.node[:]
    q.graph.node.extend(out)
    return infer(q)


def conv_chain(widths=(16, 257, 32), cin: int = 8, hw=(6, 6), qdq: bool = True, keep_relu: bool = True,
               seed: int = 1, float_reader: bool = False) -> onnx.ModelProto:
    """x[1,cin,H,W] -> len(widths) x (3x3 Conv + Relu) -> output ``y``. With ``qdq`` and ``keep_relu``
    every Conv reads Conv -> Relu -> QuantizeLinear (else onnxruntime's Conv -> QuantizeLinear).
    ``float_reader``: the widest layer's Relu output is also read in float by a Sigmoid (output ``z``),
    so its chunks could not be quantized before their Concat."""
    g = _Net(seed)
    t = "x"
    c = cin
    for i, w in enumerate(widths):
        y = g.node("Conv", f"conv{i}", [t, g.weight(f"w{i}", (w, c, 3, 3)), g.weight(f"b{i}", (w,), 0.1)],
                   kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        t = g.node("Relu", f"relu{i}", [y]) if i < len(widths) - 1 else y
        c = w
    g.nodes[-1].output[0] = "y"
    g.nodes[-1].name = "conv_last"
    m = g.model("conv_chain", ("x", [1, cin, *hw]), ["y"])
    if not qdq:
        return m
    q = _qdq(m, seed)
    if keep_relu:
        q = _restore_relus(q, [f"conv{i}" for i in range(len(widths) - 1)])
    if float_reader:
        wide = f"conv{int(np.argmax(widths))}"
        conv_out = next(n.output[0] for n in q.graph.node if n.name == wide)
        relu = next(n for n in q.graph.node if n.op_type == "Relu" and n.input[0] == conv_out)
        q.graph.node.append(helper.make_node("Sigmoid", [relu.output[0]], ["z"], name="sig"))
        q.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
        q = infer(q)
    return q


# ------------------------------------------------------------------------------------------------
# NAF014: uint8 activations
# ------------------------------------------------------------------------------------------------


def uint8_edges(maxpool: bool = True, asym_weights: bool = False, uint8_add: bool = False, seed: int = 3) -> onnx.ModelProto:
    """A hand-made uint8 QDQ model with uint8 graph edges: x (uint8) -> DequantizeLinear -> Conv
    (int8 symmetric weights, or uint8 asymmetric with ``asym_weights``) -> Relu -> QuantizeLinear
    (uint8) [-> MaxPool on the uint8 tensor -> DequantizeLinear -> QuantizeLinear(uint8)] -> output
    ``y`` (uint8). ``uint8_add``: the MaxPool is an Add of the uint8 tensor with itself (arithmetic on
    uint8 codes, which no exact shift preserves)."""
    rng = np.random.default_rng([SEED, seed])
    inits = []

    def c(name, v):
        inits.append(onnx.numpy_helper.from_array(np.asarray(v), name))
        return name

    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.3
    if asym_weights:
        lo, hi = float(w.min()), float(w.max())
        ws = (hi - lo) / 255
        wz = int(round(-lo / ws))
        wq = np.clip(np.rint(w / ws) + wz, 0, 255).astype(np.uint8)
        wparams = [c("w_scale", np.float32(ws)), c("w_zp", np.uint8(wz))]
    else:
        ws = np.abs(w).max(axis=(1, 2, 3)) / 127
        wq = np.clip(np.rint(w / ws[:, None, None, None]), -127, 127).astype(np.int8)
        wparams = [c("w_scale", ws.astype(np.float32)), c("w_zp", np.zeros(8, np.int8))]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", c("x_scale", np.float32(0.02)), c("x_zp", np.uint8(128))],
                         ["x_dq"], name="x_dq"),
        helper.make_node("DequantizeLinear", [c("w_q", wq)] + wparams, ["w_dq"], name="w_dq",
                         **({} if asym_weights else {"axis": 0})),
        helper.make_node("Conv", ["x_dq", "w_dq", c("b", (rng.standard_normal(8) * 0.1).astype(np.float32))],
                         ["conv"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("QuantizeLinear", ["relu", c("r_scale", np.float32(0.01)), c("r_zp", np.uint8(0))],
                         ["relu_q" if maxpool else "y"], name="relu_q"),
    ]
    if maxpool:
        nodes += [
            helper.make_node("Add", ["relu_q", "relu_q"], ["pool"], name="pool") if uint8_add else
            helper.make_node("MaxPool", ["relu_q"], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("DequantizeLinear", ["pool", "r_scale", "r_zp"], ["pool_dq"], name="pool_dq"),
            helper.make_node("Sigmoid", ["pool_dq"], ["sig"], name="sig"),
            helper.make_node("QuantizeLinear", ["sig", c("s_scale", np.float32(1 / 255)), c("s_zp", np.uint8(0))],
                             ["y"], name="y_q"),
        ]
    graph = helper.make_graph(nodes, "uint8_edges", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="nafix-tests")
    m.ir_version = IR_VERSION
    return infer(m)


# ------------------------------------------------------------------------------------------------
# NAF015: dilated convolutions
# ------------------------------------------------------------------------------------------------


def tcn(dilations=(2, 4), channels: int = 16, length: int = 64, k: int = 3, qdq: bool = True,
        seed: int = 5) -> onnx.ModelProto:
    """A temporal conv net block stack: x[1,C,T] -> per dilation d: depthwise 1-D Conv (k, dilation d,
    causal-style 'same' padding) -> Relu -> pointwise 1-D Conv -> Relu -> output ``y``."""
    g = _Net(seed)
    t = "x"
    for i, d in enumerate(dilations):
        p = (k - 1) * d // 2
        t = g.node("Conv", f"dw{i}", [t, g.weight(f"dw{i}.w", (channels, 1, k)), g.weight(f"dw{i}.b", (channels,), 0.1)],
                   kernel_shape=[k], dilations=[d], pads=[p, p], group=channels)
        t = g.node("Relu", f"dw{i}_relu", [t])
        t = g.node("Conv", f"pw{i}", [t, g.weight(f"pw{i}.w", (channels, channels, 1)), g.weight(f"pw{i}.b", (channels,), 0.1)],
                   kernel_shape=[1])
        t = g.node("Relu", f"pw{i}_relu", [t])
    g.nodes[-1].output[0] = "y"
    m = g.model("tcn", ("x", [1, channels, length]), ["y"])
    return _qdq(m, seed) if qdq else m


def dilated_conv2d(cin: int = 8, cout: int = 16, k: int = 3, dilations=(2, 2), group: int = 1, hw=(12, 12),
                   strides=(1, 1), qdq: bool = True, seed: int = 6) -> onnx.ModelProto:
    """x[1,cin,H,W] -> Conv(k x k, dilations, group, 'same' pads) -> Relu -> output ``y``."""
    g = _Net(seed)
    ph, pw = (k - 1) * dilations[0] // 2, (k - 1) * dilations[1] // 2
    y = g.node("Conv", "conv", ["x", g.weight("w", (cout, cin // group, k, k)), g.weight("b", (cout,), 0.1)],
               kernel_shape=[k, k], dilations=list(dilations), pads=[ph, pw, ph, pw], group=group,
               strides=list(strides))
    g.node("Relu", "y", [y])
    m = g.model("dilated_conv2d", ("x", [1, cin, *hw]), ["y"])
    return _qdq(m, seed) if qdq else m


# ------------------------------------------------------------------------------------------------
# the gate's noise floor
# ------------------------------------------------------------------------------------------------


def sparse_heatmaps(c: int = 8, hw=(12, 12), keypoints: int = 4, threshold: float = 2.5, seed: int = 7) -> onnx.ModelProto:
    """A heatmap decoder with a sparse output, QDQ: x[1,c,H,W] -> Conv 3x3 + Relu -> bilinear Resize x2
    (half_pixel) -> a smoothing 3x3 Conv (positive weights, as a decoder's blur) with a negative
    bias -> Relu -> output ``heatmaps`` [1,keypoints,2H,2W], zero almost everywhere."""
    g = _Net(seed)
    t = g.node("Conv", "conv_in", ["x", g.weight("w_in", (c, c, 3, 3)), g.weight("b_in", (c,), 0.1)],
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    t = g.node("Relu", "relu_in", [t])
    t = g.node("Resize", "resize", [t, "", g.const("scales", np.array([1, 1, 2, 2], np.float32))], mode="linear",
               coordinate_transformation_mode="half_pixel")
    w = np.abs(g.rng.standard_normal((keypoints, c, 3, 3))).astype(np.float32) / (c * 9) * 4
    t = g.node("Conv", "conv_out", [t, g.const("w_out", w), g.const("b_out", np.full(keypoints, -threshold, np.float32))],
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    g.node("Relu", "heatmaps", [t])
    m = g.model("sparse_heatmaps", ("x", [1, c, *hw]), ["heatmaps"])
    return _qdq(m, seed)
