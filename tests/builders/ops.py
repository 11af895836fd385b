"""Builders for the ``ops`` family (NAF006-NAF010, NAF012).

Deterministic (seeded), small, opset 17, IR 8, static shapes; ``qdq=True`` quantizes the float model
the ST way with onnxruntime (``tests.builders.qdq.st_quantize``).
"""

from __future__ import annotations

import numpy as np
import onnx

from .qdq import Net, finish, maybe_quantize

SEED = 4006


# ------------------------------------------------------------------------------------------------
# NAF006: Sub(constant, x)
# ------------------------------------------------------------------------------------------------


def sub_const(qdq: bool = False, order: str = "const_first", const: str = "channel", quant_sub: bool = False,
              activation: str = "int8", seed: int = SEED) -> onnx.ModelProto:
    """x [1,4,8,8] -> Conv 4->8 + Relu -> ``Sub`` -> Conv 8->4 -> y.

    ``order``: "const_first" (Sub(c, h), the SW pattern), "act_first" (Sub(h, c)), "two_acts"
    (Sub(h, Sigmoid(h))). ``const``: "channel" [1,8,1,1], "scalar" [], "full" [1,8,8,8] (like
    YOLOv8's anchor grid). ``quant_sub``: onnxruntime quantizes the Sub too (its default op list
    leaves Sub in float between a DequantizeLinear and the next QuantizeLinear, as in real YOLOv8
    exports; with it the constant becomes an int8 initializer behind a DequantizeLinear).
    ``activation``: "uint8" quantizes activations to uint8 (onnxruntime's old default).
    """
    g = Net(seed)
    h = g.conv("x", 4, 8, name="conv_a")
    h = g.node("Relu", [h], name="relu_a")
    shape = {"channel": (1, 8, 1, 1), "scalar": (), "full": (1, 8, 8, 8)}[const]
    c = g.const("sub_c", (g.rng.standard_normal(shape) * 2.0 + 1.0).astype(np.float32))
    if order == "const_first":
        s = g.node("Sub", [c, h], name="sub")
    elif order == "act_first":
        s = g.node("Sub", [h, c], name="sub")
    elif order == "two_acts":
        s = g.node("Sub", [h, g.node("Sigmoid", [h], name="sig")], name="sub")
    else:
        raise ValueError(order)
    g.conv(s, 8, 4, name="conv_b", out="y")
    m = g.model({"x": [1, 4, 8, 8]}, {"y": [1, 4, 8, 8]})
    return maybe_quantize(m, qdq, seed=seed, op_types=["Sub"] if quant_sub else None, activation=activation)


def sub_const_output(qdq: bool = True, seed: int = SEED) -> onnx.ModelProto:
    """x -> Conv -> Relu -> Sub(c, .) as the graph output ``y`` (the Sub's result leaves the model)."""
    g = Net(seed)
    h = g.conv("x", 4, 8, name="conv_a")
    h = g.node("Relu", [h], name="relu_a")
    c = g.const("sub_c", np.full((1, 8, 1, 1), 3.0, np.float32))
    g.node("Sub", [c, h], name="sub", outputs=["y"])
    m = g.model({"x": [1, 4, 8, 8]}, {"y": [1, 8, 8, 8]})
    return maybe_quantize(m, qdq, seed=seed, op_types=["Sub"])


# ------------------------------------------------------------------------------------------------
# NAF007: standalone BatchNormalization
# ------------------------------------------------------------------------------------------------


def _bn(g: Net, x: str, c: int, name: str = "bn", out: str | None = None) -> str:
    scale = g.const(f"{name}.scale", (g.rng.random(c) + 0.5).astype(np.float32))
    bias = g.const(f"{name}.bias", (g.rng.standard_normal(c) * 0.2).astype(np.float32))
    mean = g.const(f"{name}.mean", (g.rng.standard_normal(c) * 0.3).astype(np.float32))
    var = g.const(f"{name}.var", (g.rng.random(c) + 0.3).astype(np.float32))
    return g.node("BatchNormalization", [x, scale, bias, mean, var], name=name, outputs=[out] if out else None,
                  epsilon=1e-3)


def batchnorm(qdq: bool = False, after: str = "relu", rank: int = 4, seed: int = SEED + 1) -> onnx.ModelProto:
    """A standalone BatchNormalization.

    ``after``: "relu" (Conv -> Relu -> BN -> Conv), "add" (residual Add -> BN), "input" (the graph
    input -> BN -> Conv), "conv" (Conv -> BN directly: the compiler folds it, the rule must not fire),
    "conv_shared" (Conv -> BN with the Conv output also read elsewhere), "gemm" (rank 2: Gemm -> Relu
    -> BN -> output), "output" (Conv -> Relu -> BN is the graph output), "maxpool" (Conv -> MaxPool -> BN).
    """
    g = Net(seed)
    outs: dict = {}
    if after == "gemm":
        h = g.node("Flatten", ["x"], name="flatten", axis=1)
        w = g.weight("fc.weight", (16, 4 * 8 * 8), 0.1)
        b = g.weight("fc.bias", (16,), 0.1)
        h = g.node("Gemm", [h, w, b], name="fc", transB=1)
        h = g.node("Relu", [h], name="relu_fc")
        _bn(g, h, 16, out="y")
        m = g.model({"x": [1, 4, 8, 8]}, {"y": [1, 16]})
        return maybe_quantize(m, qdq, seed=seed)
    if after == "input":
        h = _bn(g, "x", 4)
        g.conv(h, 4, 8, name="conv_b", out="y")
        m = g.model({"x": [1, 4, 8, 8]}, {"y": [1, 8, 8, 8]})
        return maybe_quantize(m, qdq, seed=seed)
    h = g.conv("x", 4, 8, name="conv_a")
    if after == "relu":
        h = _bn(g, g.node("Relu", [h], name="relu_a"), 8)
    elif after == "add":
        r = g.node("Relu", [h], name="relu_a")
        h2 = g.conv(r, 8, 8, name="conv_r")
        h = _bn(g, g.node("Add", [r, h2], name="add_res"), 8)
    elif after == "conv":
        h = _bn(g, h, 8)
    elif after == "conv_shared":
        aux = g.node("Sigmoid", [h], name="sig_aux", outputs=["aux"])
        outs["aux"] = [1, 8, 8, 8]
        del aux
        h = _bn(g, h, 8)
    elif after == "maxpool":
        h = g.node("MaxPool", [g.node("Relu", [h], name="relu_a")], name="pool", kernel_shape=[2, 2], strides=[2, 2])
        h = _bn(g, h, 8)
        g.conv(h, 8, 8, name="conv_b", out="y")
        m = g.model({"x": [1, 4, 8, 8]}, {"y": [1, 8, 4, 4]})
        return maybe_quantize(m, qdq, seed=seed)
    elif after == "output":
        _bn(g, g.node("Relu", [h], name="relu_a"), 8, out="y")
        m = g.model({"x": [1, 4, 8, 8]}, {"y": [1, 8, 8, 8]})
        return maybe_quantize(m, qdq, seed=seed)
    else:
        raise ValueError(after)
    g.conv(h, 8, 8, name="conv_b", out="y")
    m = g.model({"x": [1, 4, 8, 8]}, {"y": [1, 8, 8, 8], **outs})
    return maybe_quantize(m, qdq, seed=seed)


# ------------------------------------------------------------------------------------------------
# NAF008: depthwise Conv with stride 2
# ------------------------------------------------------------------------------------------------


def depthwise(qdq: bool = False, then: str = "pw", size: int = 16, k: int = 3, strides=(2, 2), multiplier: int = 1,
              auto_pad: str | None = None, seed: int = SEED + 2) -> onnx.ModelProto:
    """x [1,8,size,size] -> Conv 8->8 + Relu -> depthwise kxk (group 8) stride ``strides`` -> ... -> y.

    ``then``: "pw" (Relu -> 1x1 Conv, MobileNet-style: the stride moves to the 1x1 Conv), "bn_pw"
    (BatchNormalization -> Relu -> 1x1 Conv, a float PyTorch export), "bn_k3" (BatchNormalization ->
    Relu -> 3x3 Conv: subsampling after the Relu, the BN stays next to its Conv), "pw_direct"
    (no activation between), "pw_clip" (Clip 0..6 between, kept by onnxruntime), "pw_k3" (a 3x3 Conv
    follows: a subsampling op is inserted), "residual" (the depthwise output is also read by a second
    branch: subsampling op), "output" (the depthwise output is the graph output), "stride1" (a
    stride-1 depthwise: must not fire).
    """
    g = Net(seed)
    h = g.conv("x", 8, 8, name="conv_a")
    h = g.node("Relu", [h], name="relu_a")
    st = [1, 1] if then == "stride1" else list(strides)
    attrs = {"auto_pad": auto_pad} if auto_pad else {}
    pads = None if auto_pad else [k // 2] * 4
    d = g.conv(h, 8, 8 * multiplier, k=k, stride=st, group=8, name="dw", pads=pads,
               out="y" if then == "output" else None, **attrs)
    outs = {"y": None}
    if then in ("pw", "stride1"):
        g.conv(g.node("Relu", [d], name="relu_dw"), 8 * multiplier, 16, k=1, name="pw", pads=[0, 0, 0, 0], out="y")
    elif then == "pw_direct":
        g.conv(d, 8 * multiplier, 16, k=1, name="pw", pads=[0, 0, 0, 0], out="y")
    elif then == "pw_clip":
        c = g.node("Clip", [d, g.const("c_lo", np.array(0, np.float32)), g.const("c_hi", np.array(6, np.float32))], name="clip_dw")
        g.conv(c, 8 * multiplier, 16, k=1, name="pw", pads=[0, 0, 0, 0], out="y")
    elif then == "bn_pw":
        b = _bn(g, d, 8 * multiplier, name="bn_dw")
        g.conv(g.node("Relu", [b], name="relu_dw"), 8 * multiplier, 16, k=1, name="pw", pads=[0, 0, 0, 0], out="y")
    elif then == "bn_k3":
        b = _bn(g, d, 8 * multiplier, name="bn_dw")
        g.conv(g.node("Relu", [b], name="relu_dw"), 8 * multiplier, 16, k=3, name="conv_k3", out="y")
    elif then == "pw_k3":
        g.conv(g.node("Relu", [d], name="relu_dw"), 8 * multiplier, 16, k=3, name="conv_k3", out="y")
    elif then == "residual":
        r = g.node("Relu", [d], name="relu_dw")
        a = g.conv(r, 8 * multiplier, 8 * multiplier, k=1, name="pw", pads=[0, 0, 0, 0])
        g.node("Add", [a, r], name="add_res", outputs=["y"])
    elif then == "output":
        pass
    else:
        raise ValueError(then)
    m = g.model({"x": [1, 8, size, size]}, outs)
    return maybe_quantize(m, qdq, seed=seed)


# ------------------------------------------------------------------------------------------------
# NAF009: Conv -> Reshape/Flatten -> Relu
# ------------------------------------------------------------------------------------------------


def reshape_relu(qdq: bool = False, movement: str = "reshape", keep_relu: bool = True, shared: bool = False,
                 seed: int = SEED + 3) -> onnx.ModelProto:
    """x [1,4,8,8] -> Conv 4->8 -> ``movement`` -> Relu -> ... -> y.

    ``movement``: "reshape" ([1,8,64] -> Relu -> MatMul [64,10] -> y [1,8,10]), "flatten" ([1,512] ->
    Relu -> Gemm -> y [1,10]), "none" (Conv -> Relu -> Reshape: the safe order, must not fire).
    ``keep_relu``: quantize with QDQKeepRemovableActivations (otherwise onnxruntime folds the Relu
    away and there is nothing to move). ``shared``: the Reshape output is also a graph output
    (``flat``), so the un-activated view must stay.
    """
    g = Net(seed)
    h = g.conv("x", 4, 8, name="conv_a")
    outs: dict = {}
    if movement == "reshape":
        r = g.node("Reshape", [h, g.const("shape", np.array([1, 8, 64], np.int64))], name="reshape")
        a = g.node("Relu", [r], name="relu")
        g.node("MatMul", [a, g.weight("mm.weight", (64, 10), 0.2)], name="mm", outputs=["y"])
        outs["y"] = [1, 8, 10]
    elif movement == "flatten":
        r = g.node("Flatten", [h], name="flatten", axis=1)
        a = g.node("Relu", [r], name="relu")
        g.node("Gemm", [a, g.weight("fc.weight", (10, 512), 0.05), g.weight("fc.bias", (10,), 0.1)], name="fc",
               outputs=["y"], transB=1)
        outs["y"] = [1, 10]
    elif movement == "none":
        a = g.node("Relu", [h], name="relu")
        r = g.node("Flatten", [a], name="flatten", axis=1)
        g.node("Gemm", [r, g.weight("fc.weight", (10, 512), 0.05), g.weight("fc.bias", (10,), 0.1)], name="fc",
               outputs=["y"], transB=1)
        outs["y"] = [1, 10]
    else:
        raise ValueError(movement)
    if shared:
        g.node("Identity", [r], name="flat_out", outputs=["flat"])
        outs["flat"] = None
    m = g.model({"x": [1, 4, 8, 8]}, outs)
    return maybe_quantize(m, qdq, seed=seed, keep_activations=keep_relu)


# ------------------------------------------------------------------------------------------------
# NAF010: DepthToSpace
# ------------------------------------------------------------------------------------------------


def depth_to_space(qdq: bool = False, mode: str = "DCR", blocksize: int = 2, c_out: int = 3, size: int = 5,
                   quant_d2s: bool = True, seed: int = SEED + 4) -> onnx.ModelProto:
    """x [1,8,size,size] -> Conv 8->c_out*b*b -> DepthToSpace(b, mode) -> Conv c_out->4 -> y (a
    super-resolution / YuNet-style upsampling head). ``quant_d2s``: onnxruntime quantizes the
    DepthToSpace (not in its default list) so the QDQ model has DQ -> DepthToSpace -> Q."""
    g = Net(seed)
    b = blocksize
    h = g.conv("x", 8, c_out * b * b, name="conv_a")
    d = g.node("DepthToSpace", [h], name="d2s", blocksize=b, mode=mode)
    g.conv(d, c_out, 4, name="conv_b", out="y")
    m = g.model({"x": [1, 8, size, size]}, {"y": [1, 4, size * b, size * b]})
    return maybe_quantize(m, qdq, seed=seed, op_types=["DepthToSpace"] if quant_d2s else None)


def depth_to_space_output(qdq: bool = False, mode: str = "CRD", seed: int = SEED + 5) -> onnx.ModelProto:
    """x [1,16,4,6] -> DepthToSpace(2) -> graph output y [1,4,8,12] (no Conv around it)."""
    g = Net(seed)
    g.node("DepthToSpace", ["x"], name="d2s", outputs=["y"], blocksize=2, mode=mode)
    m = g.model({"x": [1, 16, 4, 6]}, {"y": [1, 4, 8, 12]})
    return maybe_quantize(m, qdq, seed=seed, op_types=["DepthToSpace"])


# ------------------------------------------------------------------------------------------------
# NAF012: Softmax at the output
# ------------------------------------------------------------------------------------------------


def softmax_head(qdq: bool = True, where: str = "output", seed: int = SEED + 6) -> onnx.ModelProto:
    """x [1,3,16,16] -> Conv + Relu -> GlobalAveragePool -> Flatten -> Gemm 8->10 -> Softmax -> probs.

    ``where``: "output" (Softmax is the last op), "internal" (Softmax -> Mul by a constant -> output:
    the probabilities are used inside, must not fire), "also_used" (probs is a graph output and also
    feeds a ReduceMax giving ``conf``), "logits_too" (the logits are a second graph output).
    """
    g = Net(seed)
    h = g.conv("x", 3, 8, name="conv_a", stride=2)
    h = g.node("Relu", [h], name="relu_a")
    h = g.node("GlobalAveragePool", [h], name="gap")
    h = g.node("Flatten", [h], name="flatten", axis=1)
    lg = g.node("Gemm", [h, g.weight("fc.weight", (10, 8), 0.5), g.weight("fc.bias", (10,), 0.1)], name="fc",
                transB=1, outputs=["logits"] if where == "logits_too" else None)
    outs: dict = {"probs": [1, 10]}
    if where in ("output", "logits_too"):
        g.node("Softmax", [lg], name="softmax", outputs=["probs"], axis=-1)
        if where == "logits_too":
            outs["logits"] = [1, 10]
    elif where == "internal":
        p = g.node("Softmax", [lg], name="softmax", axis=-1)
        g.node("Mul", [p, g.const("temp", np.array(2.0, np.float32))], name="mul", outputs=["probs"])
    elif where == "also_used":
        g.node("Softmax", [lg], name="softmax", outputs=["probs"], axis=-1)
        g.node("ReduceMax", ["probs"], name="conf_max", outputs=["conf"], keepdims=0)
        outs["conf"] = None
    else:
        raise ValueError(where)
    m = g.model({"x": [1, 3, 16, 16]}, outs)
    return maybe_quantize(m, qdq, seed=seed)


def batchnorm_after_dq_output() -> onnx.ModelProto:
    """MobileFaceNet-style tail: int8 tensor -> DequantizeLinear -> BatchNormalization -> float graph
    output (the BN's output is not quantized: rewriting it cannot move it to the NPU)."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    tail (float[1,8] x) => (float[1,8] y) {
        s = Constant <value = float {0.05}> ()
        z = Constant <value = int8 {3}> ()
        q = QuantizeLinear (x, s, z)
        d = DequantizeLinear (q, s, z)
        gs = Constant <value = float[8] {1.0, 0.5, 2.0, 1.5, 0.8, 1.2, 0.9, 1.1}> ()
        gb = Constant <value = float[8] {0.1, -0.2, 0.3, 0.0, 0.5, -0.1, 0.2, 0.4}> ()
        gm = Constant <value = float[8] {0.0, 0.1, -0.1, 0.2, 0.0, 0.3, -0.2, 0.1}> ()
        gv = Constant <value = float[8] {1.0, 0.9, 1.1, 1.2, 0.8, 1.0, 1.3, 0.7}> ()
        y = BatchNormalization (d, gs, gb, gm, gv)
    }
    """
    return finish(onnx.parser.parse_model(text))
