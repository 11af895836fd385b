"""Builders for the ``resize`` rule family (NAF003 bilinear-resize).

Every builder returns a small, deterministic (seeded) model, opset 17, IR version 8, static shapes
(unless it is about dynamic shapes), or with ``qdq=True`` the same model quantized the "ST way" with
onnxruntime's ``quantize_static`` (QDQ, int8 activations asymmetric, int8 weights symmetric
per-channel, 8 seeded calibration samples), which wraps the Resize as DequantizeLinear -> Resize ->
QuantizeLinear exactly as users get it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.builders.common import GraphParts, infer, quantize_st

OPSET = 17

IR_VERSION = 8
SEED = 20250603
CALIB_SAMPLES = 8


class _G(GraphParts):
    def __init__(self, seed: int):
        super().__init__(SEED, seed)

    def conv(self, name: str, x: str, cin: int, cout: int, k: int) -> str:
        std = float(np.sqrt(2.0 / (cin * k * k)))
        w = self.const(f"{name}.weight", (self.rng.standard_normal((cout, cin, k, k)) * std).astype(np.float32))
        b = self.const(f"{name}.bias", (self.rng.standard_normal(cout) * 0.1).astype(np.float32))
        return self.node("Conv", name, [x, w, b], kernel_shape=[k, k], pads=[k // 2] * 4)

    def node(self, op: str, name: str, inputs, outputs=None, **attrs) -> str:
        outputs = outputs or [name]
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=name, **attrs))
        return outputs[0]

    def input(self, name: str, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def output(self, name: str) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))

    def model(self, name: str, qdq: bool, *, data_prop: bool = False) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="nafix-tests")
        m.ir_version = IR_VERSION
        m = _infer(m, data_prop=data_prop)
        if qdq:
            m = _infer(_quantize_st(m, self.rng), data_prop=data_prop)
        return m


def _infer(m: onnx.ModelProto, *, data_prop: bool = False) -> onnx.ModelProto:
    return infer(m, data_prop=data_prop)


def _quantize_st(m: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    return quantize_st(m, rng, samples=CALIB_SAMPLES)


def _pair(v) -> tuple:
    return (v, v) if not isinstance(v, (list, tuple)) else tuple(v)


def resize(c: int = 8, hw: Sequence[int] = (6, 9), scale=2, ctm: str | None = "half_pixel", mode: str = "linear",
           sizes: Sequence[int] | None = None, qdq: bool = False, tail: str = "output", batch: int = 1,
           seed: int = 0) -> onnx.ModelProto:
    """x[batch, c, H, W] -> Conv 3x3 -> Relu -> Resize -> ``tail``.

    ``scale`` is one factor or [sh, sw] (a ``scales`` input [1, 1, sh, sw]); ``sizes`` = [oh, ow] uses
    a ``sizes`` input instead. ``ctm`` None leaves coordinate_transformation_mode at its default.
    ``tail``: "output" (the Resize output is the graph output ``y``), "conv" (a 1x1 Conv follows),
    "two" (the Resize output is graph output ``y`` and also feeds a 1x1 Conv -> ``z``)."""
    g = _G(seed)
    h, w = hw
    x = g.input("x", [batch, c, h, w])
    t = g.node("Relu", "relu", [g.conv("conv_in", x, c, c, 3)])
    ins = [t, ""]
    if sizes is None:
        sh, sw = _pair(scale)
        ins.append(g.const("resize.scales", np.array([1, 1, sh, sw], dtype=np.float32)))
    else:
        oh, ow = sizes
        ins += ["", g.const("resize.sizes", np.array([batch, c, oh, ow], dtype=np.int64))]
    attrs = {"mode": mode}
    if ctm is not None:
        attrs["coordinate_transformation_mode"] = ctm
    if tail == "output":
        g.node("Resize", "resize", ins, ["y"], **attrs)
        g.output("y")
    elif tail == "conv":
        r = g.node("Resize", "resize", ins, **attrs)
        g.node("Conv", "conv_out", [r, g.const("conv_out.weight", (g.rng.standard_normal((4, c, 1, 1)) * 0.3).astype(np.float32))], ["y"])
        g.output("y")
    elif tail == "two":
        g.node("Resize", "resize", ins, ["y"], **attrs)
        g.output("y")
        g.node("Conv", "conv_out", ["y", g.const("conv_out.weight", (g.rng.standard_normal((4, c, 1, 1)) * 0.3).astype(np.float32))], ["z"])
        g.output("z")
    else:
        raise ValueError(f"unknown tail '{tail}'")
    return g.model("resize", qdq)


def resize_rank3(c: int = 4, w: int = 8, scale: float = 2.0) -> onnx.ModelProto:
    """x[1, c, W] -> bilinear Resize (scales [1, 1, s]) -> y: a 1-D resize of a rank-3 tensor."""
    g = _G(3)
    x = g.input("x", [1, c, w])
    g.node("Resize", "resize", [x, "", g.const("resize.scales", np.array([1, 1, scale], dtype=np.float32))], ["y"],
           mode="linear", coordinate_transformation_mode="half_pixel")
    g.output("y")
    return g.model("resize_rank3", False)


def resize_like(c: int = 4, hw: Sequence[int] = (5, 7), factor: int = 2, dynamic: bool = False,
                qdq: bool = False) -> onnx.ModelProto:
    """A decoder step: x[1, c, H, W] is resized (bilinear, half_pixel) to the size of the skip input
    skip[1, c, fH, fW] taken with Shape(skip) as the ``sizes`` input, then added to skip -> y.

    With ``dynamic`` the inputs have symbolic H/W, so the sizes are only known at run time."""
    g = _G(4)
    h, w = hw
    if dynamic:
        x = g.input("x", [1, c, "H", "W"])
        skip = g.input("skip", [1, c, "SH", "SW"])
    else:
        x = g.input("x", [1, c, h, w])
        skip = g.input("skip", [1, c, factor * h, factor * w])
    t = g.node("Relu", "relu", [g.conv("conv_in", x, c, c, 3)])
    shape = g.node("Shape", "skip_shape", [skip])
    r = g.node("Resize", "resize", [t, "", "", shape], mode="linear", coordinate_transformation_mode="half_pixel")
    g.node("Add", "add", [r, skip], ["y"])
    g.output("y")
    if dynamic:
        return g.model("resize_like_dynamic", False)
    return g.model("resize_like", qdq, data_prop=True)
