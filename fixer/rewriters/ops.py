"""Rewriters of the ``ops`` family: single ops the NPU runs in SW, or that hang it, rebuilt from ops it
runs in HW (NAF006 Sub(constant, x), NAF007 standalone BatchNormalization, NAF008 stride-2 depthwise
Conv, NAF009 Relu after a Reshape, NAF010 DepthToSpace, NAF012 trailing Softmax).

In QDQ models every rewriter keeps the model's quantization parameters and adds only Q/DQ pairs
whose parameters make the new intermediate exact (or reuse an existing pair's parameters).
"""

from __future__ import annotations

import math

import numpy as np
from .. import ir

from ..graph import QDQ_OPS, Editor, GraphView, attr, node_label, qdq_params, read_weight
from . import IoChange, Match, NearMiss, RewriteResult, rewriter

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))


def _q(node: ir.Node) -> str:
    return f"'{node_label(node)}'"




def _static(t: ir.Tensor) -> list[int] | None:
    if t.shape is None or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in t.shape):
        return None
    return [int(d) for d in t.shape]


def _fdtype(t: ir.Tensor):
    return np.dtype(t.dtype).type if t.dtype is not None else np.float32


def _dq_of(view: GraphView, t: ir.Tensor):
    """The per-tensor DequantizeLinear producing activation ``t``: (node, scale, zp, int dtype) or None."""
    p = view.producer(t)
    if p is None or p.op != "DequantizeLinear" or view.is_const_like(p.inputs[0]):
        return None
    try:
        scale, zp, _ = qdq_params(view, p)
    except ValueError:
        return None
    if scale.size != 1:
        return None
    return p, float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]), np.dtype(zp.dtype)


def _q_readers(view: GraphView, t: ir.Tensor) -> list[ir.Node] | None:
    """The QuantizeLinear nodes reading ``t`` when they are its only readers (None otherwise)."""
    cons = list(t.outputs)
    if not cons or view.is_graph_output(t) or any(c.op != "QuantizeLinear" for c in cons):
        return None
    return cons


def _qdq_pair(ed: Editor, t: ir.Tensor, q_like: ir.Node, shape) -> ir.Tensor:
    """Q -> DQ of ``t`` with the (constant) parameters and attributes of the QuantizeLinear ``q_like``."""
    params = list(q_like.inputs[1:])
    zdt = params[1].dtype if len(params) > 1 and params[1].dtype is not None else np.int8
    q = ed.node("QuantizeLinear", [t] + params, attrs=dict(q_like.attrs), dtype=zdt, shape=shape)
    return ed.node("DequantizeLinear", [q.outputs[0]] + params, attrs=dict(q_like.attrs), dtype=np.float32,
                   shape=shape).outputs[0]


def _drop_dead(view: GraphView, ed: Editor, nodes: list[ir.Node]) -> None:
    """Disconnect ``nodes`` (given in graph order) whose outputs nothing reads any more, last first, so
    later rewrites in the same engine round do not see them as readers."""
    for n in reversed(nodes):
        if n.outputs and all(not o.outputs and not any(g is o for g in ed.graph.outputs) for o in n.outputs):
            ed.remove(n)


def _clone(ed: Editor, node: ir.Node, first: ir.Tensor, *, dtype=None, shape=None) -> ir.Tensor:
    """A copy of ``node`` reading ``first`` instead of its first input (other inputs shared)."""
    return ed.node(node.op, [first] + list(node.inputs[1:]), attrs=dict(node.attrs), dtype=dtype, shape=shape).outputs[0]


# ------------------------------------------------------------------------------------------------
# NAF006: Sub(constant, x) -> Add(Mul(x, -1), constant)
# ------------------------------------------------------------------------------------------------


@rewriter("sub_constant_first")
def sub_constant_first(match: Match, ed: Editor) -> RewriteResult:
    """Rewrites Sub(constant, x) as Add(Mul(x, -1), constant): bit-exact in float (c + (-x) is how IEEE
    defines c - x). In a QDQ model the negation gets its own QuantizeLinear/DequantizeLinear with x's
    scale and zero-point -1 - zp (255 - zp for uint8): the negated tensor's int8 values are exactly
    -1 - q, so nothing is rounded, and -1 is an int8 constant 1 * -1 with scale 1. The Add keeps the
    Sub's output quantization."""
    view, sub = match.view, match.node
    c, x = sub.inputs[0], sub.inputs[1]
    y = sub.outputs[0]
    if not view.is_const_like(c) or view.is_const_like(x):
        raise NearMiss(f"{_q(sub)} does not subtract an activation from a constant.")
    if x.dtype is not None and np.dtype(x.dtype).kind != "f":
        raise NearMiss(f"{_q(sub)} works on {np.dtype(x.dtype).name} tensors; only float (or QDQ) Sub is rewritten.")
    dq = _dq_of(view, x)
    qs = _q_readers(view, y)
    fdt = _fdtype(x)
    if dq is not None and qs is None:
        raise NearMiss(
            f"{_q(sub)} reads a quantized tensor but its output '{y.name}' is not quantized (it feeds "
            f"{'a graph output' if view.is_graph_output(y) else 'float op(s)'}); Mul + Add would still run in float, in SW.")
    shape_x = x.shape
    if dq is not None:
        dq_node, s, zx, qdt = dq
        if qdt not in _INT8:
            raise NearMiss(f"{_q(sub)} reads a {qdt.name}-quantized tensor; only 8-bit QDQ is rewritten.")
        zneg = (-1 - zx) if qdt == np.int8 else (255 - zx)
        w = ed.node("DequantizeLinear", [ed.const(np.array(-1, np.int8)), ed.const(np.array(1.0, np.float32)),
                                         ed.const(np.array(0, np.int8))], dtype=np.float32, shape=[]).outputs[0]
        neg = ed.node("Mul", [x, w], dtype=fdt, shape=shape_x).outputs[0]
        sc = ed.const(np.array(s, np.float32))
        zc = ed.const(np.array(zneg, qdt.type))
        nq = ed.node("QuantizeLinear", [neg, sc, zc], dtype=qdt.type, shape=shape_x).outputs[0]
        neg = ed.node("DequantizeLinear", [nq, sc, zc], dtype=fdt, shape=shape_x).outputs[0]
        how = f"the negation quantized exactly with scale {s:.6g}, zero-point {zneg}"
    else:
        neg = ed.node("Mul", [x, ed.const(np.array(-1, fdt))], dtype=fdt, shape=shape_x).outputs[0]
        how = "in float"
    add = ed.node("Add", [neg, c], dtype=_fdtype(y), shape=y.shape).outputs[0]
    ed.replace_uses(y, add)
    ed.remove(sub)
    return RewriteResult(detail=f"rewrote {_q(sub)} = '{c.name}' - '{x.name}' as Add(Mul('{x.name}', -1), '{c.name}') ({how})")


# ------------------------------------------------------------------------------------------------
# NAF007: standalone BatchNormalization
# ------------------------------------------------------------------------------------------------


def _bn_affine(view: GraphView, bn: ir.Node) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (k, b) with BN(x) = k * x + b, computed in float64."""
    vals = []
    for t in bn.inputs[1:5]:
        w = read_weight(view, t)
        if w is None:
            raise NearMiss(f"{_q(bn)} has a non-constant parameter '{t.name}'.")
        vals.append(w.dequantized().astype(np.float64).reshape(-1))
    scale, bias, mean, var = vals
    eps = float(bn.attrs.get("epsilon", 1e-5))
    k = scale / np.sqrt(var + eps)
    return k, bias - mean * k


def _fold_target(view: GraphView, bn: ir.Node) -> ir.Node | None:
    """The float Conv/Gemm directly before ``bn`` whose only reader is ``bn``, with float constant weights."""
    x = bn.inputs[0]
    p = view.producer(x)
    if p is None or p.op not in ("Conv", "Gemm") or len(x.outputs) != 1 or view.is_graph_output(x):
        return None
    w = read_weight(view, p.inputs[1])
    if w is None or w.quantized:
        return None
    if len(p.inputs) > 2 and p.inputs[2].name:
        b = read_weight(view, p.inputs[2])
        if b is None or b.quantized:
            return None
    if p.op == "Gemm" and (x.shape is None or len(x.shape) != 2):
        return None
    return p


@rewriter("fold_batchnorm", form="auto")
def fold_batchnorm(match: Match, ed: Editor) -> RewriteResult:
    """Removes a standalone BatchNormalization y = k * x + b (k = scale / sqrt(var + eps), b = bias - mean *
    k, per channel). Directly after a float Conv/Gemm that only feeds it, it is folded into that layer's
    weights and bias. Otherwise it becomes a 1x1 depthwise Conv with weights k and bias b (a 2-D input
    is viewed as [N, C, 1]); in a QDQ model its weights are int8 per channel (64..127, scale k / w) and
    its bias int32 at the input scale times the weight scale, between the BatchNormalization's own
    DequantizeLinear and QuantizeLinear, so no new activation needs calibration and the int8 outputs
    stay within one LSB (the weight per channel is chosen so the bias rounds as little as possible).
    With ``form: mul_add`` a float model gets Mul(k) + Add(b) instead."""
    view, bn = match.view, match.node
    form = str(match.params.get("form", "auto"))
    x, y = bn.inputs[0], bn.outputs[0]
    if int(bn.attrs.get("training_mode", 0)) or len([o for o in bn.outputs if o.name]) > 1:
        raise NearMiss(f"{_q(bn)} is in training mode (it computes running statistics).")
    shape = _static(x)
    if shape is None or len(shape) < 2:
        raise NearMiss(f"{_q(bn)} has an input of unknown or dynamic shape; the per-channel constants need the rank.")
    k, b = _bn_affine(view, bn)
    C = shape[1]
    if k.size != C:
        raise NearMiss(f"{_q(bn)} has {k.size} channel parameters for {C} channels.")
    rank = len(shape)
    fdt = _fdtype(y)

    target = _fold_target(view, bn) if form in ("auto", "fold") else None
    if target is not None:
        return _fold_into(view, ed, bn, target, k, b)

    dq = _dq_of(view, x)
    qs = _q_readers(view, y)
    if dq is not None and qs is None:
        raise NearMiss(
            f"{_q(bn)} reads a quantized tensor but its output '{y.name}' is not quantized (it feeds "
            f"{'a graph output' if view.is_graph_output(y) else 'float op(s)'}); rewritten, it would still run in "
            "float in SW. Quantize its output (nafix --quantize) or apply it in the application.")
    if dq is None and qs is not None:
        raise NearMiss(f"{_q(bn)} has a quantized output but a float input '{x.name}'.")
    if form == "mul_add" or rank > 4:
        if dq is not None:
            raise NearMiss(f"{_q(bn)} is quantized; Mul + Add would need calibrated parameters for the product "
                           "(use form depthwise, or nafix --quantize).")
        cshape = [C] + [1] * (rank - 2)
        kc = ed.const(k.astype(fdt).reshape(cshape))
        bc = ed.const(b.astype(fdt).reshape(cshape))
        m = ed.node("Mul", [x, kc], dtype=fdt, shape=shape).outputs[0]
        a = ed.node("Add", [m, bc], dtype=fdt, shape=y.shape).outputs[0]
        ed.replace_uses(y, a)
        ed.remove(bn)
        return RewriteResult(detail=f"rewrote standalone BatchNormalization {_q(bn)} ({C} channels) as Mul + Add with per-channel constants")
    return _bn_as_depthwise(view, ed, bn, k, b, dq, shape)


def _fold_into(view: GraphView, ed: Editor, bn: ir.Node, p: ir.Node, k: np.ndarray, b: np.ndarray) -> RewriteResult:
    w = read_weight(view, p.inputs[1]).values.astype(np.float64)
    bias0 = np.zeros(k.size)
    if len(p.inputs) > 2 and p.inputs[2].name:
        bias0 = read_weight(view, p.inputs[2]).values.astype(np.float64).reshape(-1)
    wdt = read_weight(view, p.inputs[1]).values.dtype
    attrs = dict(p.attrs)
    if p.op == "Conv":
        nw = w * k.reshape([-1] + [1] * (w.ndim - 1))
        nb = bias0 * k + b
    else:  # Gemm: Y = alpha * A' B' + beta * C, channel = column of Y
        alpha, beta = float(p.attrs.get("alpha", 1.0)), float(p.attrs.get("beta", 1.0))
        nw = w * (k.reshape(-1, 1) if int(p.attrs.get("transB", 0)) else k.reshape(1, -1))
        c0 = np.broadcast_to(bias0 * beta, (k.size,)) if bias0.size in (1, k.size) else None
        if c0 is None:
            raise NearMiss(f"{_q(bn)} follows Gemm {_q(p)} whose bias is not per output column.")
        nb = c0 * k + b
        attrs["beta"] = 1.0
        del alpha
    new = ed.node(p.op, [p.inputs[0], ed.const(nw.astype(wdt)), ed.const(nb.astype(wdt))], attrs=attrs,
                  dtype=bn.outputs[0].dtype, shape=bn.outputs[0].shape)
    ed.replace_uses(bn.outputs[0], new.outputs[0])
    ed.remove(bn)
    ed.remove(p)
    return RewriteResult(detail=f"folded BatchNormalization {_q(bn)} into {p.op} {_q(p)} (weights and bias rescaled)")


def _int8_affine(k: np.ndarray, b: np.ndarray, sx: float):
    """Per-channel int8 weight w, float32 scale s_w (w * s_w = k) and int32 bias at scale sx * s_w for
    y = k * x + b. The bias is rounded to a multiple of sx * s_w; among weights 64..127 each channel
    takes the one whose bias rounding error is smallest (usually a tiny fraction of an output LSB,
    where always using 127 leaves up to 1/254 LSB), so requantized outputs rarely if ever move."""
    absk = np.abs(k)
    best = None
    for w in range(127, 63, -1):
        sw32 = np.where(absk > 0, absk / w, 1.0).astype(np.float32)
        sw = sw32.astype(np.float64)
        sb = (np.float32(sx) * sw32).astype(np.float64)
        bq = np.round(b / sb)
        err = np.abs(bq * sb - b)
        if best is None:
            best = [np.full(k.shape, w, np.float64), sw, bq, sb, err]
            continue
        better = err < best[4] - 1e-15
        for i, v in enumerate((np.full(k.shape, w, np.float64), sw, bq, sb, err)):
            best[i] = np.where(better, v, best[i])
    wabs, sw, bq, sb, _ = best
    wq = (np.sign(k) * wabs).astype(np.int8)
    wq[absk == 0] = 0
    return wq, sw.astype(np.float32), bq, sb


def _bn_as_depthwise(view, ed, bn, k, b, dq, shape) -> RewriteResult:
    C, rank = shape[1], len(shape)
    fdt = _fdtype(bn.outputs[0])
    spatial = max(rank - 2, 1)
    wshape = [C, 1] + [1] * spatial
    if dq is not None:
        if view.opset < 13:
            raise NearMiss(f"{_q(bn)}: a quantized depthwise replacement needs per-channel DequantizeLinear "
                           f"(opset 13+); the model uses opset {view.opset}.")
        wq, sw, bq, sb = _int8_affine(k, b, dq[1])
        if np.any(np.abs(bq) > 2**31 - 1):
            raise NearMiss(f"{_q(bn)}'s shift does not fit an int32 bias at the input scale {dq[1]:.3g}.")
        wt = ed.node("DequantizeLinear", [ed.const(wq.reshape(wshape)), ed.const(sw), ed.const(np.zeros(C, np.int8))],
                     attrs={"axis": 0}, dtype=np.float32, shape=wshape).outputs[0]
        bt = ed.node("DequantizeLinear", [ed.const(bq.astype(np.int32)), ed.const(sb.astype(np.float32)),
                                          ed.const(np.zeros(C, np.int32))], attrs={"axis": 0}, dtype=np.float32,
                     shape=[C]).outputs[0]
        how = "int8 per-channel weights and int32 bias, keeping its input and output quantization"
    else:
        wt = ed.const(k.astype(fdt).reshape(wshape))
        bt = ed.const(b.astype(fdt))
        how = "per-channel weights k = scale / sqrt(var + eps) and bias b = bias - mean * k"
    x = bn.inputs[0]
    inp = x
    cshape = shape if rank > 2 else shape + [1]
    if rank == 2:
        inp = ed.node("Reshape", [x, ed.const(np.array(cshape, np.int64))], dtype=fdt, shape=cshape).outputs[0]
    nsp = len(cshape) - 2
    conv = ed.node("Conv", [inp, wt, bt], attrs={"group": C, "kernel_shape": [1] * nsp, "strides": [1] * nsp,
                                                 "pads": [0] * (2 * nsp)}, dtype=fdt, shape=cshape).outputs[0]
    out = conv
    if rank == 2:
        out = ed.node("Reshape", [conv, ed.const(np.array(shape, np.int64))], dtype=fdt, shape=shape).outputs[0]
    ed.replace_uses(bn.outputs[0], out)
    ed.remove(bn)
    return RewriteResult(
        detail=f"rewrote standalone BatchNormalization {_q(bn)} ({C} channels) as a 1x1 depthwise Conv with {how}",
        contract="lsb" if dq is not None else None)


# ------------------------------------------------------------------------------------------------
# NAF008: depthwise Conv with stride 2
# ------------------------------------------------------------------------------------------------

#: Ops that act on every spatial position independently: they commute with spatial subsampling.
POINTWISE = frozenset({"Relu", "Clip", "LeakyRelu", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "Elu",
                       "QuantizeLinear", "DequantizeLinear", "Identity", "BatchNormalization", "PRelu"})


def _spatially_pointwise(view: GraphView, node: ir.Node) -> bool:
    """``node`` is in POINTWISE and its parameters do not vary over space (per-tensor or per-channel)."""
    if node.op not in POINTWISE or not node.outputs or len([o for o in node.outputs if o.name]) != 1:
        return False
    if node.op in QDQ_OPS:
        s = view.const_value(node.inputs[1])
        return s is not None and (s.size == 1 or int(node.attrs.get("axis", 1)) in (1, -3))
    if node.op == "PRelu":
        w = node.inputs[1]
        return w.shape is not None and all(d == 1 for d in list(w.shape)[1:]) and len(w.shape) <= 3
    return all(view.is_const_like(t) for t in node.inputs[1:] if t.name)


def _pointwise_chain(view: GraphView, y: ir.Tensor, limit: int = 8) -> tuple[list[ir.Node], ir.Tensor]:
    """The longest chain of single-reader, spatially pointwise ops starting at ``y``, and its end tensor."""
    chain: list[ir.Node] = []
    t = y
    for _ in range(limit):
        if view.is_graph_output(t) or len(t.outputs) != 1:
            break
        c = t.outputs[0]
        if c.inputs[0] is not t or not _spatially_pointwise(view, c):
            break
        chain.append(c)
        t = c.outputs[0]
    return chain, t


def _explicit_pads(conv: ir.Node, hw: list[int], kernel: list[int], strides: list[int], dil: list[int]) -> list[int]:
    ap = attr(conv, "auto_pad", "NOTSET")
    if ap in ("NOTSET", None, ""):
        return [int(p) for p in conv.attrs.get("pads", [0] * (2 * len(hw)))]
    if ap == "VALID":
        return [0] * (2 * len(hw))
    begins, ends = [], []
    for size, k, s, d in zip(hw, kernel, strides, dil):
        keff = (k - 1) * d + 1
        total = max((math.ceil(size / s) - 1) * s + keff - size, 0)
        small = total // 2
        if ap == "SAME_UPPER":
            begins.append(small)
            ends.append(total - small)
        else:
            begins.append(total - small)
            ends.append(small)
    return begins + ends


def _kernel(view: GraphView, conv: ir.Node) -> list[int] | None:
    ks = conv.attrs.get("kernel_shape")
    if ks is not None:
        return [int(k) for k in ks]
    w = conv.inputs[1]
    return [int(d) for d in w.shape[2:]] if w.shape is not None and len(w.shape) >= 3 else None


def _stride_target(view: GraphView, y: ir.Tensor) -> tuple[list[ir.Node], ir.Node] | None:
    """(pointwise chain, 1x1 Conv) when ``y`` reaches, through single-reader pointwise ops only, a
    stride-1, unpadded, non-depthwise 1x1 Conv that is its only reader."""
    chain, t = _pointwise_chain(view, y)
    if view.is_graph_output(t) or len(t.outputs) != 1:
        return None
    c = t.outputs[0]
    if c.op != "Conv" or c.inputs[0] is not t:
        return None
    k = _kernel(view, c)
    strides = [int(v) for v in c.attrs.get("strides", [1, 1])]
    pads = [int(v) for v in c.attrs.get("pads", [0, 0, 0, 0])]
    w = c.inputs[1]
    depthwise = int(c.attrs.get("group", 1)) > 1 and w.shape is not None and len(w.shape) > 1 and w.shape[1] == 1
    if (k == [1, 1] and all(v == 1 for v in strides) and not any(pads) and not depthwise
            and attr(c, "auto_pad", "NOTSET") in ("NOTSET", "VALID", "")):
        return chain, c
    return None


@rewriter("depthwise_stride2", subsample="maxpool")
def depthwise_stride2(match: Match, ed: Editor) -> RewriteResult:
    """Runs the depthwise Conv at stride 1 (same padding) and moves the stride elsewhere, exactly: when
    its output reaches a 1x1 Conv through per-position ops only (activations, BatchNormalization,
    Q/DQ), that 1x1 Conv takes the stride (a 1x1 Conv commutes with subsampling) and the ops in
    between run on the full-resolution tensor; otherwise a subsampling op is inserted after the
    Conv and the float activations/BatchNormalization that follow it (``subsample``: a 1x1 MaxPool
    with the stride, or a strided Slice), with that tensor's own QuantizeLinear/DequantizeLinear
    parameters before it in a QDQ model."""
    view, conv = match.view, match.node
    sub_kind = str(match.params.get("subsample", "maxpool"))
    x, y = conv.inputs[0], conv.outputs[0]
    xs = _static(x)
    w = conv.inputs[1]
    if xs is None or len(xs) != 4:
        raise NearMiss(f"{_q(conv)} has an input of unknown shape or rank other than 4.")
    group = int(conv.attrs.get("group", 1))
    if w.shape is None or len(w.shape) != 4 or int(w.shape[1]) != 1 or group != xs[1]:
        raise NearMiss(f"{_q(conv)} is not a depthwise Conv (group {group}, input channels {xs[1]}).")
    strides = [int(s) for s in conv.attrs.get("strides", [1, 1])]
    if all(s == 1 for s in strides):
        raise NearMiss(f"{_q(conv)} already has stride 1.")
    kernel = _kernel(view, conv)
    dil = [int(d) for d in conv.attrs.get("dilations", [1, 1])]
    pads = _explicit_pads(conv, xs[2:], kernel, strides, dil)
    out1 = [xs[2 + i] + pads[i] + pads[i + 2] - ((kernel[i] - 1) * dil[i] + 1) + 1 for i in range(2)]
    outs = [(o - 1) // s + 1 for o, s in zip(out1, strides)]
    ys = _static(y)
    if ys is not None and ys[2:] != outs:
        raise NearMiss(f"{_q(conv)}: computed output size {outs} does not match the model's {ys[2:]}.")
    cout = int(w.shape[0])
    full = [xs[0], cout] + out1
    target = _stride_target(view, y)

    attrs = {k: v for k, v in conv.attrs.items() if k not in ("auto_pad", "pads", "strides")}
    attrs.update(strides=[1, 1], pads=pads)
    fdt = _fdtype(y)
    y1 = ed.node("Conv", list(conv.inputs), attrs=attrs, dtype=fdt, shape=full).outputs[0]
    if target is not None:
        chain, pw = target
        cur = y1
        for n in chain:
            odt = n.outputs[0].dtype if n.outputs[0].dtype is not None else fdt
            cur = _clone(ed, n, cur, dtype=odt, shape=full)
        pattrs = dict(pw.attrs)
        pattrs["strides"] = strides
        pout = pw.outputs[0]
        new = ed.node("Conv", [cur] + list(pw.inputs[1:]), attrs=pattrs, dtype=_fdtype(pout), shape=pout.shape)
        ed.replace_uses(pout, new.outputs[0])
        ed.remove(pw)
        _drop_dead(view, ed, chain)
        ed.remove(conv)
        via = f" through {', '.join(n.op for n in chain)}" if chain else ""
        return RewriteResult(detail=(f"depthwise Conv {_q(conv)} now runs at stride 1; its stride {strides} moved to "
                                     f"the following 1x1 Conv {_q(pw)}{via}"))
    # Subsampling op at the end of the per-position ops after the Conv (activations, BatchNormalization,
    # Q/DQ): they stay next to the Conv the compiler fuses them into, and see the full-resolution data.
    chain, last = _pointwise_chain(view, y)
    if chain and chain[-1].op == "QuantizeLinear":
        chain.pop()
        last = chain[-1].outputs[0] if chain else y
    cur = y1
    for n in chain:
        odt = n.outputs[0].dtype if n.outputs[0].dtype is not None else fdt
        cur = _clone(ed, n, cur, dtype=odt, shape=full)
    p_last = chain[-1] if chain else conv
    post_q = None  # parameters to re-quantize the subsampled tensor with
    src = cur
    if p_last.op == "DequantizeLinear":
        post_q = p_last
    else:
        qs = _q_readers(view, last)
        if qs is not None and _dq_of(view, x) is not None:
            src = _qdq_pair(ed, cur, qs[0], full)
    if sub_kind == "slice":
        big = np.iinfo(np.int64).max
        sub = ed.node("Slice", [src, ed.const(np.array([0, 0], np.int64)), ed.const(np.array([big, big], np.int64)),
                                ed.const(np.array([2, 3], np.int64)), ed.const(np.array(strides, np.int64))],
                      dtype=fdt, shape=[xs[0], cout] + outs)
        what = f"a Slice with steps {strides}"
    else:
        sub = ed.node("MaxPool", [src], attrs={"kernel_shape": [1, 1], "strides": strides}, dtype=fdt,
                      shape=[xs[0], cout] + outs)
        what = f"a 1x1 MaxPool with strides {strides}"
    out = sub.outputs[0]
    if post_q is not None:
        out = _qdq_pair(ed, out, post_q, [xs[0], cout] + outs)
    ed.replace_uses(last, out)
    _drop_dead(view, ed, [conv] + chain)
    after = f" after {', '.join(n.op for n in chain)}" if chain else ""
    return RewriteResult(detail=f"depthwise Conv {_q(conv)} now runs at stride 1, followed{after} by {what} (exact subsampling)")


# ------------------------------------------------------------------------------------------------
# NAF009: Relu after a Reshape that follows a Conv
# ------------------------------------------------------------------------------------------------

_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


@rewriter("relu_before_reshape")
def relu_before_reshape(match: Match, ed: Editor) -> RewriteResult:
    """Moves the activation in front of the Reshape/Flatten/Squeeze/Unsqueeze between a Conv and it:
    Conv -> Reshape -> Relu becomes Conv -> Relu -> Reshape (exact: an element-wise op commutes with a
    reshape). In a QDQ model the Q/DQ pairs travel with it: the Relu's output quantization is
    applied on the 4-D tensor and the Reshape moves int8-exact data. Other readers of the
    un-activated reshaped tensor keep the original Reshape."""
    view, act = match.view, match.node
    a_in, a_out = act.inputs[0], act.outputs[0]
    between: list[ir.Node] = []
    t = a_in
    p = view.producer(t)
    while p is not None and p.op in QDQ_OPS:
        s = view.const_value(p.inputs[1])
        if s is None or s.size != 1:
            raise NearMiss(f"{_q(act)}: '{p.name}' is quantized per axis; moving it across the reshape would change its axis.")
        between.insert(0, p)
        t = p.inputs[0]
        p = view.producer(t)
    if p is None or p.op not in _RESHAPES:
        raise NearMiss(f"{_q(act)} does not follow a Reshape/Flatten/Squeeze/Unsqueeze.")
    mv = p
    x4 = mv.inputs[0]
    shape4 = x4.shape
    qs = _q_readers(view, a_out)
    if qs is not None:
        s0 = view.const_value(qs[0].inputs[1])
        if s0 is None or s0.size != 1:
            raise NearMiss(f"{_q(act)}'s output is quantized per axis; it cannot move across the reshape.")
    cur = x4
    for n in between:
        cur = _clone(ed, n, cur, dtype=n.outputs[0].dtype, shape=shape4)
    cur = _clone(ed, act, cur, dtype=a_out.dtype, shape=shape4)
    if qs is not None:
        cur = _qdq_pair(ed, cur, qs[0], shape4)
    new = _clone(ed, mv, cur, dtype=a_out.dtype, shape=a_out.shape)
    ed.replace_uses(a_out, new)
    ed.remove(act)
    _drop_dead(view, ed, [mv] + between)
    return RewriteResult(detail=f"moved {act.op} {_q(act)} before {mv.op} {_q(mv)}, onto the Conv's {len(shape4) if shape4 else '?'}-D output")


# ------------------------------------------------------------------------------------------------
# NAF010: DepthToSpace -> ConvTranspose with one-hot weights
# ------------------------------------------------------------------------------------------------


def d2s_weights(c: int, b: int, mode: str, grouped: bool) -> tuple[np.ndarray, int]:
    """One-hot ConvTranspose weights reproducing DepthToSpace(blocksize b, mode) for c output channels:
    (weights [c*b*b, c or 1, b, b], group)."""
    if mode == "CRD" and grouped:
        w = np.zeros((c * b * b, 1, b, b), np.float32)
        for ch in range(c):
            for i in range(b):
                for j in range(b):
                    w[ch * b * b + i * b + j, 0, i, j] = 1
        return w, c
    w = np.zeros((c * b * b, c, b, b), np.float32)
    for ch in range(c):
        for i in range(b):
            for j in range(b):
                k = ch * b * b + i * b + j if mode == "CRD" else (i * b + j) * c + ch
                w[k, ch, i, j] = 1
    return w, 1


@rewriter("depth_to_space", grouped=True)
def depth_to_space(match: Match, ed: Editor) -> RewriteResult:
    """Rewrites DepthToSpace(blocksize b) as a ConvTranspose with kernel b x b, stride b and one-hot
    weights (each output pixel copies exactly one input channel), which the NPU runs in HW with every
    tensor rank 4 (the textbook Reshape/Transpose equivalent needs rank 6). Exact in float; in a QDQ
    model the weights are int8 ones with scale 1 and the DepthToSpace's own input and output
    quantization is kept. CRD mode uses one group per output channel (b*b weights per group); DCR
    interleaves channels, so its ConvTranspose is dense (C_in x C_out one-hot weights). Not applied
    when the target profile knows that stedgeai lowers a strided ConvTranspose back to a DepthToSpace
    (the built-in STM32N6 profile, every core): kept for profiles without that lowering."""
    view, d2s = match.view, match.node
    x, y = d2s.inputs[0], d2s.outputs[0]
    b = int(d2s.attrs.get("blocksize", 0))
    from ..npu.estimate import lowering_note

    if b > 1 and "conv_transpose" in match.profile.lowerings:
        raise NearMiss(f"{_q(d2s)}: a stride-{b} ConvTranspose is no way out: "
                       f"{lowering_note(match.profile, 'conv_transpose')} (NPU_FACTS.md#real-reports), the DepthToSpace this "
                       f"rewrite removes plus a HW epoch.")
    xs = _static(x)
    if xs is None or len(xs) != 4:
        raise NearMiss(f"{_q(d2s)} has an input of unknown shape or rank other than 4.")
    mode = str(attr(d2s, "mode", "DCR")).upper()
    if b < 1 or xs[1] % (b * b):
        raise NearMiss(f"{_q(d2s)}: {xs[1]} channels are not a multiple of blocksize^2 = {b * b}.")
    c = xs[1] // (b * b)
    w, group = d2s_weights(c, b, mode, bool(match.params.get("grouped", True)))
    dq = _dq_of(view, x)
    qs = _q_readers(view, y)
    fdt = _fdtype(y)
    if dq is not None and qs is not None:
        wt = ed.node("DequantizeLinear", [ed.const(w.astype(np.int8)), ed.const(np.array(1.0, np.float32)),
                                          ed.const(np.array(0, np.int8))], dtype=np.float32, shape=list(w.shape)).outputs[0]
        how = "int8 one-hot weights with scale 1"
    else:
        wt = ed.const(w.astype(fdt))
        how = "one-hot weights"
    out_shape = [xs[0], c, xs[2] * b, xs[3] * b]
    ct = ed.node("ConvTranspose", [x, wt], attrs={"kernel_shape": [b, b], "strides": [b, b], "group": group,
                                                  "pads": [0, 0, 0, 0]}, dtype=fdt, shape=out_shape).outputs[0]
    ed.replace_uses(y, ct)
    ed.remove(d2s)
    kind = f"{group} groups" if group > 1 else "dense"
    return RewriteResult(detail=(f"rewrote DepthToSpace {_q(d2s)} ({mode}, blocksize {b}) as a ConvTranspose "
                                 f"{xs[1]}->{c} channels, kernel {b}x{b} stride {b}, {kind}, {how}"))


# ------------------------------------------------------------------------------------------------
# NAF012: Softmax at a graph output (opt-in)
# ------------------------------------------------------------------------------------------------


@rewriter("drop_trailing_softmax")
def drop_trailing_softmax(match: Match, ed: Editor) -> RewriteResult:
    """Removes a Softmax (and the QuantizeLinear/DequantizeLinear after it) whose result is a graph
    output: the output, under the same name, now carries the logits the Softmax read. Softmax is
    monotonic along its axis, so the argmax and the ranking are unchanged; the application applies
    softmax itself if it needs probabilities. In a QDQ model the output becomes the logits'
    DequantizeLinear output (or the int8 logits when the output was already int8)."""
    view, sm = match.view, match.node
    x, y = sm.inputs[0], sm.outputs[0]
    chain: list[ir.Node] = []
    t = y
    while not view.is_graph_output(t):
        cons = list(t.outputs)
        if len(cons) != 1 or cons[0].op not in QDQ_OPS:
            what = f"{len(cons)} readers" if len(cons) != 1 else f"{cons[0].op} '{cons[0].name}'"
            raise NearMiss(f"{_q(sm)}'s probabilities are used inside the model ({what}), not only as a graph output.")
        chain.append(cons[0])
        t = cons[0].outputs[0]
    if t.outputs:
        raise NearMiss(f"{_q(sm)}'s output '{t.name}' is a graph output but also feeds "
                       f"{', '.join(repr(c.name) for c in t.outputs[:2])} inside the model.")
    if view.is_graph_input(x):
        raise NearMiss(f"{_q(sm)} reads the graph input directly; removing it would leave an empty model.")
    new = x
    io: list[IoChange] = []
    out_dt = np.dtype(t.dtype) if t.dtype is not None else np.dtype(np.float32)
    if out_dt.kind in "iu":
        dq = _dq_of(view, x)
        if dq is None or dq[3] != out_dt:
            raise NearMiss(f"{_q(sm)}: the graph output '{t.name}' is {out_dt.name} but the logits are not a {out_dt.name} tensor behind a DequantizeLinear.")
        new = dq[0].inputs[0]
        io.append(IoChange(kind="output", name=t.name, dtype=out_dt.name, scale=dq[1], zero_point=dq[2], was=out_dt.name))
    if any(o is new for o in ed.graph.outputs) or view.is_graph_input(new):
        new = ed.node("Identity", [new], dtype=new.dtype, shape=new.shape).outputs[0]
    name = t.name
    ed.replace_uses(t, new)
    axis = sm.attrs.get("axis", -1)
    ed.remove(sm)
    for n in chain:
        ed.remove(n)
    extra = f" and its {'/'.join(n.op for n in chain)}" if chain else ""
    int8 = f" as int8 (scale {io[0].scale:.6g}, zero-point {io[0].zero_point})" if io else ""
    return RewriteResult(
        detail=(f"removed Softmax {_q(sm)}{extra}: graph output '{name}' now carries the logits{int8}; argmax and "
                f"ranking along axis {axis} are preserved (apply softmax in the application for probabilities)"),
        io_changes=io)
