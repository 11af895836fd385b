"""Builders for the ``channels`` rule family (NAF001 split-output-channels, NAF002 split-input-channels,
NAF011 gemm-dynamic-bias).

Every builder returns a small, deterministic (seeded) float model, opset 17, IR version 8, static
shapes, or with ``qdq=True`` the same model quantized the "ST way" with onnxruntime's
``quantize_static`` (QDQ, int8 activations asymmetric, int8 weights symmetric per-channel, 8 seeded
calibration samples), so the QDQ structure is exactly what users get from onnxruntime.
"""

from __future__ import annotations


import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.builders.common import GraphParts, infer, quantize_st

OPSET = 17

IR_VERSION = 8
SEED = 20250612
CALIB_SAMPLES = 8


# ------------------------------------------------------------------------------------------ helpers


class _G(GraphParts):
    def __init__(self, seed: int):
        super().__init__(SEED, seed)

    def weight(self, name: str, shape, std: float = None) -> str:
        if std is None:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            std = float(np.sqrt(2.0 / max(fan_in, 1)))
        return self.const(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def node(self, op: str, name: str, inputs, outputs=None, **attrs) -> str:
        outputs = outputs or [name]
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=name, **attrs))
        return outputs[0]

    def input(self, name: str, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def output(self, name: str) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))

    def model(self, name: str, qdq: bool) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="nafix-tests")
        m.ir_version = IR_VERSION
        m = _infer(m)
        if qdq:
            m = _quantize_st(m, self.rng)
        return m


def _infer(m: onnx.ModelProto, *, data_prop: bool = False) -> onnx.ModelProto:
    return infer(m, data_prop=data_prop)


def _quantize_st(m: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    return infer(quantize_st(m, rng, samples=CALIB_SAMPLES))


def conv(cin: int = 16, cout: int = 257, k: int = 1, hw: tuple = (4, 6), group: int = 1, qdq: bool = False,
         relu: bool = False, bias: bool = True, stride: int = 1, extra_consumer: bool = False) -> onnx.ModelProto:
    """x[1,cin,H,W] -> Conv(cout, k x k, group) [-> Relu] -> graph output ``y``.

    ``extra_consumer``: the Conv output also feeds a second branch (Sigmoid -> output ``z``), so it has
    two consumers."""
    g = _G(1)
    x = g.input("x", [1, cin, *hw])
    ins = [x, g.weight("conv.weight", (cout, cin // group, k, k))]
    if bias:
        ins.append(g.weight("conv.bias", (cout,), 0.1))
    p = k // 2
    y = g.node("Conv", "conv", ins, ["conv_out" if relu or extra_consumer else "y"], kernel_shape=[k, k],
               pads=[p, p, p, p], strides=[stride, stride], group=group)
    if relu:
        g.node("Relu", "relu", [y], ["y"])
    elif extra_consumer:
        g.node("Identity", "ident", [y], ["y"])
    g.output("y")
    if extra_consumer:
        g.node("Sigmoid", "sig", [y], ["z"])
        g.output("z")
    return g.model("conv", qdq)


def gemm(k: int = 1024, n: int = 257, m: int = 1, trans_a: int = 0, trans_b: int = 1, alpha: float = 1.0,
         beta: float = 1.0, bias: str = "vector", qdq: bool = False) -> onnx.ModelProto:
    """x -> Gemm(constant B, constant C) -> output ``y`` [m, n]. ``bias``: vector ([n]), row ([1, n]),
    full ([m, n]), scalar ([1]) or none."""
    g = _G(2)
    x = g.input("x", [k, m] if trans_a else [m, k])
    b = g.weight("gemm.weight", (n, k) if trans_b else (k, n), 1.0 / np.sqrt(k))
    ins = [x, b]
    shapes = {"vector": (n,), "row": (1, n), "full": (m, n), "scalar": (1,)}
    if bias != "none":
        ins.append(g.weight("gemm.bias", shapes[bias], 0.1))
    g.node("Gemm", "gemm", ins, ["y"], transA=trans_a, transB=trans_b, alpha=float(alpha), beta=float(beta))
    g.output("y")
    return g.model("gemm", qdq)


def matmul(batch: tuple = (1, 8), k: int = 64, n: int = 257, qdq: bool = False, add_bias: bool = False,
           w_batch: tuple = ()) -> onnx.ModelProto:
    """x[*batch, k] -> MatMul(constant W[*w_batch, k, n]) [-> Add(constant b)] -> output ``y``."""
    g = _G(3)
    x = g.input("x", [*batch, k])
    y = g.node("MatMul", "matmul", [x, g.weight("matmul.weight", (*w_batch, k, n), 1.0 / np.sqrt(k))],
               ["mm_out" if add_bias else "y"])
    if add_bias:
        g.node("Add", "add", [y, g.weight("add.bias", (n,), 0.1)], ["y"])
    g.output("y")
    return g.model("matmul", qdq)


def matmul_act(k: int = 64, n: int = 257, qdq: bool = False) -> onnx.ModelProto:
    """x[1,8,k] x w[1,k,n] (two activations) -> output ``y``: NAF001's weights_constant precondition fails."""
    g = _G(4)
    x = g.input("x", [1, 8, k])
    w = g.input("w", [1, k, n])
    g.node("MatMul", "matmul", [x, w], ["y"])
    g.output("y")
    return g.model("matmul_act", qdq)


def conv_transpose(cin: int = 16, cout: int = 257, k: int = 2, stride: int = 2, group: int = 1,
                   qdq: bool = False) -> onnx.ModelProto:
    """x[1,cin,4,4] -> ConvTranspose(cout, k, stride) -> output ``y``."""
    g = _G(5)
    x = g.input("x", [1, cin, 4, 4])
    w = g.weight("deconv.weight", (cin, cout // group, k, k), 0.2)
    b = g.weight("deconv.bias", (cout,), 0.1)
    g.node("ConvTranspose", "deconv", [x, w, b], ["y"], kernel_shape=[k, k], strides=[stride, stride], group=group)
    g.output("y")
    return g.model("conv_transpose", qdq)


# ------------------------------------------------------------------------------------------ NAF002


def conv_in(cin: int = 257, cout: int = 32, k: int = 1, hw: tuple = (1, 8), qdq: bool = False,
            bias: bool = True) -> onnx.ModelProto:
    """A Conv with many INPUT channels: x[1,cin,H,W] -> Conv(cout) -> Relu -> output ``y``."""
    return conv(cin=cin, cout=cout, k=k, hw=hw, qdq=qdq, relu=True, bias=bias)


# ------------------------------------------------------------------------------------------ NAF011


def gemm_dynamic_bias(k: int = 64, n: int = 32, m: int = 1, trans_a: int = 0, trans_b: int = 1,
                      alpha: float = 1.0, beta: float = 1.0, qdq: bool = False,
                      bias_shape: str = "full", bias_act: str = "Relu") -> onnx.ModelProto:
    """x -> Gemm(x, constant B, C) where C is computed from a second input ``c_in`` (MatMul + ``bias_act``),
    so it is not a constant -> output ``y``. ``bias_shape``: full ([m, n]) or vector ([n], computed from
    a 1-D input). With ``bias_act='Softplus'`` (an op onnxruntime's quantizer leaves in float) C stays a
    float tensor in the QDQ model."""
    g = _G(6)
    x = g.input("x", [k, m] if trans_a else [m, k])
    b = g.weight("gemm.weight", (n, k) if trans_b else (k, n), 1.0 / np.sqrt(k))
    if bias_shape == "vector":
        c0 = g.input("c_in", [16])
        c = g.node("MatMul", "bias_mm", [c0, g.weight("bias_mm.weight", (16, n), 0.25)])
    else:
        c0 = g.input("c_in", [m, 16])
        c = g.node("MatMul", "bias_mm", [c0, g.weight("bias_mm.weight", (16, n), 0.25)])
    c = g.node(bias_act, "bias_" + bias_act.lower(), [c])
    g.node("Gemm", "gemm", [x, b, c], ["y"], transA=trans_a, transB=trans_b, alpha=float(alpha), beta=float(beta))
    g.output("y")
    return g.model("gemm_dynamic_bias", qdq)


def gemm_dynamic_weight(k: int = 64, n: int = 32, qdq: bool = False) -> onnx.ModelProto:
    """Gemm(x, B=activation, C=computed): NAF011 turns it into MatMul + Add, transposing B with a node."""
    g = _G(7)
    x = g.input("x", [1, k])
    w = g.input("w", [n, k])
    c0 = g.input("c_in", [1, 16])
    c = g.node("MatMul", "bias_mm", [c0, g.weight("bias_mm.weight", (16, n), 0.25)])
    g.node("Gemm", "gemm", [x, w, c], ["y"], transB=1)
    g.output("y")
    return g.model("gemm_dynamic_weight", qdq)


# ------------------------------------------------------------------------------------------ denoiser-like


def denoiser_like(cin: int = 16, c: int = 257, hw: tuple = (1, 4), qdq: bool = True) -> onnx.ModelProto:
    """The shape of the forum denoiser's wide layers (issue 32): x[1,cin,H,W] -> Conv(c, 1x1) -> Relu
    -> Conv(c -> c, 1x1) -> Relu -> GlobalAveragePool -> Flatten -> Gemm(c -> c) -> Sigmoid -> ``y``.
    A Conv with ``c`` output channels, one with ``c`` input and output channels, and a Gemm with ``c``
    input and output features; quantized the ST way with ``qdq``."""
    g = _G(8)
    x = g.input("x", [1, cin, *hw])
    y = g.node("Conv", "conv_a", [x, g.weight("conv_a.weight", (c, cin, 1, 1)), g.weight("conv_a.bias", (c,), 0.1)],
               kernel_shape=[1, 1])
    y = g.node("Relu", "relu_a", [y])
    y = g.node("Conv", "conv_b", [y, g.weight("conv_b.weight", (c, c, 1, 1)), g.weight("conv_b.bias", (c,), 0.1)],
               kernel_shape=[1, 1])
    y = g.node("Relu", "relu_b", [y])
    y = g.node("GlobalAveragePool", "gap", [y])
    y = g.node("Flatten", "flatten", [y])
    y = g.node("Gemm", "gemm", [y, g.weight("gemm.weight", (c, c), 1.0 / np.sqrt(c)), g.weight("gemm.bias", (c,), 0.1)],
               transB=1)
    g.node("Sigmoid", "sigmoid", [y], ["y"])
    g.output("y")
    return g.model("denoiser_like", qdq)
