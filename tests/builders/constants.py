"""Builders for the ``constants`` family (NAF018 float constants of quantized ops, NAF019 a quantization
placed after a reshape). Seeded, small, opset 17; the QDQ models are onnxruntime's (``st_quantize``) with
the float part a converter leaves (float PRelu slopes, a float weight, a pool whose output is quantized
only after a Reshape)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .qdq import SEED, Net, finish, st_quantize


def prelu_slope(qdq: bool = True, slope: str = "channel", seed: int = SEED + 18) -> onnx.ModelProto:
    """image [1,3,12,12] -> Conv 3->8 -> PRelu -> Conv 8->6 -> out. onnxruntime leaves PRelu in float, so
    the QDQ model reads ``QDQ conv -> float PRelu slope -> QDQ``. ``slope``: "channel" ([8,1,1], one
    value per channel: the int8 grid holds it), "scalar" ([1]) or "spatial" ([8,12,12]: many values per
    channel, rounded)."""
    g = Net(seed)
    h = g.conv("image", 3, 8, name="conv_a")
    shape = {"channel": (8, 1, 1), "scalar": (1,), "spatial": (8, 12, 12)}[slope]
    s = g.const("slope", (0.05 + 0.3 * g.rng.random(shape)).astype(np.float32))
    h = g.node("PRelu", [h, s], name="prelu")
    g.conv(h, 8, 6, name="conv_b", out="out")
    m = g.model({"image": [1, 3, 12, 12]}, {"out": None})
    return st_quantize(m, seed=seed) if qdq else m


def float_weight(on_grid: bool = True, noise: float = 0.0, seed: int = SEED + 19) -> onnx.ModelProto:
    """image -> Conv 3->8 -> Relu -> Conv 8->6 -> out, quantized by onnxruntime, then ``conv_b``'s int8
    weight replaced by a float constant (as converters that fold a weight's DequantizeLinear leave it).
    ``on_grid``: the float values are the dequantized int8 ones (the int8 grid holds them exactly);
    otherwise each moves by ``noise`` x its channel's step (0.5: the largest rounding error there is)."""
    g = Net(seed)
    h = g.conv("image", 3, 8, name="conv_a")
    h = g.node("Relu", [h], name="relu_a")
    g.conv(h, 8, 6, name="conv_b", out="out")
    q = st_quantize(g.model({"image": [1, 3, 12, 12]}, {"out": None}), seed=seed)
    inits = {t.name: t for t in q.graph.initializer}
    conv = next(n for n in q.graph.node if n.name == "conv_b")
    dq = next(n for n in q.graph.node if n.output[0] == conv.input[1])
    w = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float32)
    s = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32).reshape(-1, 1, 1, 1)
    values = (w * s).astype(np.float32)
    if not on_grid:
        rng = np.random.default_rng(seed)
        values = (values + (rng.random(values.shape) - 0.5) * 2 * noise * s).astype(np.float32)
    q.graph.initializer.append(numpy_helper.from_array(values, "conv_b.weight_float"))
    conv.input[1] = "conv_b.weight_float"
    q.graph.node.remove(dq)
    return finish(q)


def pool_reshape(op: str = "ReduceMean", movement: str = "Reshape", quantized_pool: bool = False,
                 output_too: bool = False, float_head: bool = False, qdq: bool = True, seed: int = SEED + 20) -> onnx.ModelProto:
    """image [1,3,8,8] -> Conv 3->16 -> Relu -> pool (ReduceMean over H, W keepdims, or GlobalAveragePool)
    -> ``movement`` (Reshape to [1,16] or Flatten) -> Gemm 16->5 -> out, quantized by onnxruntime with the
    pool and the reshape left out: ``DQ -> pool -> Reshape -> Q``, MobileNetV2's tail.
    ``quantized_pool``: the pool quantized too (its output already has a QuantizeLinear).
    ``output_too``: the reshaped tensor is also a graph output ``feat``. ``float_head``: the Gemm is left
    in float too (the reshaped tensor reaches no QuantizeLinear)."""
    g = Net(seed)
    h = g.conv("image", 3, 16, name="conv_a")
    h = g.node("Relu", [h], name="relu_a")
    if op == "ReduceMean":
        p = g.node("ReduceMean", [h], name="pool", axes=[2, 3], keepdims=1)
    else:
        p = g.node(op, [h], name="pool")
    if movement == "Reshape":
        r = g.node("Reshape", [p, g.const("shape", np.array([1, 16], np.int64))], name="reshape",
                   outputs=["feat"] if output_too else None)
    else:
        r = g.node("Flatten", [p], name="reshape", axis=1, outputs=["feat"] if output_too else None)
    w = g.weight("fc.weight", (5, 16), 0.3)
    b = g.weight("fc.bias", (5,), 0.05)
    g.node("Gemm", [r, w, b], name="fc", outputs=["out"], transB=1)
    outs = {"out": None, **({"feat": None} if output_too else {})}
    m = g.model({"image": [1, 3, 8, 8]}, outs)
    if not qdq:
        return m
    exclude = ["reshape"] + ([] if quantized_pool else ["pool"]) + (["fc"] if float_head else [])
    return st_quantize(m, seed=seed, exclude=exclude, op_types=["ReduceMean", "GlobalAveragePool"])


def float_gemm_weight(op: str = "Gemm", trans_b: int = 0, seed: int = SEED + 21) -> onnx.ModelProto:
    """x [1,16] -> Gemm 16->8 -> Relu -> ``op`` (Gemm with ``trans_b``, or MatMul) 8->4 -> out, quantized by
    onnxruntime (per-channel weights), then the second layer's int8 weight replaced by its dequantized
    float values: the int8 grid holds them exactly along the output-channel axis onnxruntime chose
    (axis 0 of a transposed Gemm weight [N, K], axis 1 of [K, N]), and along no other."""
    g = Net(seed)
    w1 = g.weight("fc1.weight", (8, 16), 0.3)
    h = g.node("Gemm", ["x", w1, g.weight("fc1.bias", (8,), 0.05)], name="fc1", transB=1)
    h = g.node("Relu", [h], name="relu1")
    if op == "Gemm":
        shape = (4, 8) if trans_b else (8, 4)
        g.node("Gemm", [h, g.weight("fc2.weight", shape, 0.3), g.weight("fc2.bias", (4,), 0.05)], name="fc2",
               outputs=["out"], transB=trans_b)
    else:
        g.node("MatMul", [h, g.weight("fc2.weight", (8, 4), 0.3)], name="fc2", outputs=["out"])
    q = st_quantize(g.model({"x": [1, 16]}, {"out": None}), seed=seed)
    inits = {t.name: t for t in q.graph.initializer}
    node = next(n for n in q.graph.node if n.name == "fc2")
    dq = next(n for n in q.graph.node if n.output[0] == node.input[1])
    w = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float32)
    s = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    shape = [1, 1]
    shape[axis] = -1
    values = (w * s.reshape(shape)).astype(np.float32) if s.size > 1 else (w * s).astype(np.float32)
    q.graph.initializer.append(numpy_helper.from_array(values, "fc2.weight_float"))
    node.input[1] = "fc2.weight_float"
    q.graph.node.remove(dq)
    return finish(q)
