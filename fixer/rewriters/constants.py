"""Quantizing what needs no calibration (NAF018) and moving a quantization before a reshape (NAF019).

NAF018: a float constant read by a quantized op (a Conv/Gemm/MatMul weight, a PRelu slope) has known
values, so its int8 parameters follow from the values themselves, as onnxruntime would choose them for
a weight: symmetric, per output channel where the op has one (scale = max |w| / 127 per channel, zero
point 0). No data is needed. The change is held to one LSB at the op's quantized output (the rewriter
first bounds the worst case and declines where the bound is larger); a constant that the int8 grid
holds exactly (one value per channel, as a PRelu slope of shape [C, 1, 1]) changes nothing at all.

NAF019: ``DequantizeLinear -> op -> Reshape -> QuantizeLinear`` leaves the op's output in float (the
compiler sees no quantization on it and runs the op and both conversions in SW). Quantizing the op's
output with the very parameters of that QuantizeLinear, then dequantizing it for the Reshape, is exact:
a reshape moves values without changing them, so ``Q(reshape(x)) == reshape(Q(x))`` element by element,
and ``Q(DQ(q)) == q`` for the same parameters.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..graph import qdq_params
from . import Match, NearMiss, RewriteResult, per_tensor_qparams, quoted, rewriter

#: The input slot of each op's constant parameter that the NPU needs quantized
#: (:func:`fixer.npu.constraints.params_quantized`).
PARAM_SLOTS = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1, "PRelu": 1}
#: Opset from which DequantizeLinear takes a per-axis scale.
PER_AXIS_OPSET = 13
#: Activations the compiler fuses into the op before it (the quantized output is then theirs) that never
#: widen a difference (1-Lipschitz), so the bound at the op's output holds after them too. (HardSwish's
#: slope reaches 1.5, a LeakyRelu's or PRelu's may exceed 1: not looked through.)
_FUSED = ("Relu", "Clip", "Sigmoid", "Tanh")


_q = quoted


def _param_axis(node: ir.Node, rank: int) -> int | None:
    """The output-channel axis of the node's constant parameter (None: per tensor)."""
    from ..quantize.checks import _weight_axis

    op = node.op
    if op == "ConvTranspose" and int(node.attrs.get("group", 1)) != 1:
        return None  # onnxruntime's per-channel axis is wrong for grouped ConvTranspose (see quantize.ort)
    if op == "PRelu" and rank >= 1:
        return 0  # slope [C, 1, 1] (or [C]): one scale per channel
    return _weight_axis(op, lambda k, d: node.attrs.get(k, d), rank)


def symmetric_int8(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, float32 scale): symmetric int8 with zero-point 0, scale = max |w| / 127 per
    ``axis`` (per tensor when None); an all-zero channel gets scale 1 (its values stay 0)."""
    w = np.asarray(w, np.float32)
    if axis is None or w.ndim == 0:
        amax = float(np.abs(w).max()) if w.size else 0.0
        scale = np.asarray(amax / 127.0 if amax > 0 else 1.0, np.float32)
        return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale
    red = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.abs(w).max(axis=red) if red else np.abs(w)
    scale = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    return np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8), scale


def dequantized(q: np.ndarray, scale: np.ndarray, axis: int | None) -> np.ndarray:
    """What DequantizeLinear computes from ``symmetric_int8``'s result (float32, as onnxruntime)."""
    if axis is None or np.ndim(scale) == 0:
        return (q.astype(np.float32) * np.float32(scale)).astype(np.float32)
    shape = [1] * q.ndim
    shape[axis] = -1
    return (q.astype(np.float32) * scale.reshape(shape)).astype(np.float32)


def _input_bound(view, t: ir.Tensor) -> float | None:
    """The largest |value| the int8 tensor behind ``t`` (a DequantizeLinear's output) can represent."""
    p = view.producer(t)
    if p is None or p.op != "DequantizeLinear":
        return None
    try:
        s, z, _ = qdq_params(view, p)
    except ValueError:
        return None
    if s.size != 1:
        return None
    info = np.iinfo(z.dtype) if z.dtype.kind in "iu" else np.iinfo(np.int8)
    zp = float(z.reshape(-1)[0])
    return float(max(abs(info.min - zp), abs(info.max - zp)) * float(s.reshape(-1)[0]))


def _output_quantizer(view, node: ir.Node) -> ir.Node | None:
    """The QuantizeLinear of the node's output: directly, or after one activation the compiler fuses."""
    out = node.outputs[0]
    readers = list(out.outputs)
    if view.is_graph_output(out) or not readers:
        return None
    if len(readers) == 1 and readers[0].op in _FUSED and readers[0].outputs:
        nxt = list(readers[0].outputs[0].outputs)
        if len(nxt) == 1 and nxt[0].op == "QuantizeLinear":
            return nxt[0]
    qs = [c for c in readers if c.op == "QuantizeLinear"]
    return qs[0] if len(qs) == len(readers) else None


def _worst_case_lsb(node: ir.Node, err: np.ndarray, axis: int | None, xmax: float, out_scale: float) -> float:
    """A bound on how far the op's output moves, in LSB of its quantization, when its constant
    parameter moves by ``err`` (element-wise) and its input stays within ``[-xmax, xmax]``: a product
    sums at most every error of one output channel times the largest input."""
    e = np.abs(err.astype(np.float64))
    if node.op == "PRelu":
        per_out = float(e.max()) if e.size else 0.0  # y = slope * x on the negative side, element-wise
    elif axis is None or e.ndim == 0:
        per_out = float(e.sum())
    else:
        red = tuple(i for i in range(e.ndim) if i != axis)
        per_out = float(e.sum(axis=red).max()) if red else float(e.max())
    return per_out * xmax / out_scale


@rewriter("quantize_constant_params", max_lsb=0.5)
def quantize_constant_params(match: Match, ed) -> RewriteResult:
    """Quantizes the node's float constant parameter (a Conv/ConvTranspose/Gemm/MatMul weight, a PRelu
    slope) from its own values, as onnxruntime quantizes a weight: int8 symmetric, zero-point 0, one scale
    per output channel (max |w| / 127; per tensor where the op has no channel axis or the opset has no
    per-axis DequantizeLinear), read through a new DequantizeLinear. The bias stays as it is. No calibration
    is needed: the values are known. It declines when the worst-case change of the node's quantized
    output, bounded from the parameter's rounding error and the largest input the input's quantization
    can represent, exceeds `max_lsb` of the output's quantization step (values at most half a step away
    round to the same code or the next one: at most 1 LSB); nafix --quantize re-calibrates such a model."""
    node, view = match.node, match.view
    slot = PARAM_SLOTS.get(node.op)
    if slot is None or len(node.inputs) <= slot:
        raise NearMiss(f"{_q(node)} has no constant parameter to quantize.")
    t = node.inputs[slot]
    w = view.const_value(t)
    if w is None or np.dtype(w.dtype) != np.float32:
        raise NearMiss(f"{_q(node)} parameter '{t.name}' is not a stored float32 constant.")
    if not np.all(np.isfinite(w)):
        raise NearMiss(f"{_q(node)} parameter '{t.name}' holds NaN or infinite values.")
    acts = [x for x in node.inputs[:slot] if x.name]
    xmax = _input_bound(view, acts[0]) if acts else None
    if xmax is None:
        raise NearMiss(f"{_q(node)} input is not a per-tensor DequantizeLinear output: the change cannot be bounded.")
    oq = _output_quantizer(view, node)
    if oq is None:
        raise NearMiss(f"{_q(node)} output does not reach a QuantizeLinear (it would stay in float anyway).")
    os_, _ = per_tensor_qparams(view, node, oq, " output is quantized per axis; only per-tensor outputs are handled.")
    out_scale = float(os_.reshape(-1)[0])
    w32 = np.asarray(w, np.float32)
    axis = _param_axis(node, w32.ndim)
    if axis is not None and (view.opset < PER_AXIS_OPSET or w32.ndim == 0 or w32.shape[axis] <= 1):
        axis = None
    q, scale = symmetric_int8(w32, axis)
    back = dequantized(q, scale, axis)
    err = back - w32
    exact = bool(np.array_equal(back, w32))
    lsb = 0.0 if exact else _worst_case_lsb(node, err, axis, xmax, out_scale)
    limit = float(match.params.get("max_lsb", 0.5))
    if lsb > limit:
        raise NearMiss(f"quantizing {_q(node)} parameter '{t.name}' per {'channel' if axis is not None else 'tensor'} "
                       f"could move its quantized output by up to {lsb:.2g} LSB in the worst case (allowed {limit:g}); "
                       f"nafix --quantize re-calibrates the model instead.")
    base = f"{t.name}_int8"
    q_c = ed.const(q, base=base)
    s_c = ed.const(scale, base=f"{t.name}_scale")
    z_c = ed.const(np.zeros(scale.shape, np.int8), base=f"{t.name}_zero_point")
    attrs = {"axis": int(axis)} if axis is not None else {}
    dq = ed.node("DequantizeLinear", [q_c, s_c, z_c], attrs=attrs, dtype=np.float32, shape=list(w32.shape),
                 base=f"{t.name}_DequantizeLinear")
    node.inputs[slot] = dq.outputs[0]
    kind = f"per channel (axis {axis}, {scale.size} scales)" if axis is not None else "per tensor"
    what = "slope" if node.op == "PRelu" else "weight"
    if exact:
        how = "every value kept exactly"
    else:
        how = (f"max abs {what} error {float(np.abs(err).max()):.3g}, worst case {lsb:.2g} LSB at the output")
    return RewriteResult(
        detail=f"quantized the float {what} '{t.name}' to int8 symmetric {kind} from its own values ({how})",
        contract="exact" if exact else None,
    )


#: Ops that only change a tensor's shape: Q(op(x)) == op(Q(x)) element by element for per-tensor Q.
RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _reshape_then_quantize(view, t: ir.Tensor) -> tuple[list[ir.Node], list[ir.Node]] | None:
    """(the reshape chain, the QuantizeLinear nodes at its end) when every path from ``t`` goes
    through reshape-only ops (each read by one node) to QuantizeLinear nodes only; else None."""
    chain: list[ir.Node] = []
    cur = t
    while True:
        if view.is_graph_output(cur):
            return None
        readers = list(cur.outputs)
        if not readers:
            return None
        if all(r.op == "QuantizeLinear" for r in readers):
            return (chain, readers) if chain else None
        if len(readers) != 1 or readers[0].op not in RESHAPES or not readers[0].outputs:
            return None
        chain.append(readers[0])
        cur = readers[0].outputs[0]


@rewriter("quantize_before_reshape")
def quantize_before_reshape(match: Match, ed) -> RewriteResult:
    """Quantizes the node's float output right where it is made, with the scale and zero-point of the
    QuantizeLinear that follows the Reshape/Flatten/Squeeze/Unsqueeze after it: a QuantizeLinear ->
    DequantizeLinear pair with those very parameters goes between the node and the reshape. Exact: a
    reshape moves values without changing them, and a value quantized twice with the same parameters
    keeps its code, so every int8 value after the reshape is the one the model computed before."""
    node, view = match.node, match.view
    out = node.outputs[0]
    found = _reshape_then_quantize(view, out)
    if found is None:
        raise NearMiss(f"{_q(node)} output does not reach a QuantizeLinear through reshape-only ops alone.")
    chain, qs = found
    params = []
    for q in qs:
        params.append(per_tensor_qparams(view, node, q, f": '{q.name}' quantizes per axis; the reshape may move the axis."))
    s0, z0 = params[0]
    if any(not np.array_equal(s, s0) or not np.array_equal(z, z0) or z.dtype != z0.dtype for s, z in params[1:]):
        raise NearMiss(f"{_q(node)}: the QuantizeLinear nodes after the reshape use different parameters.")
    if z0.dtype != np.int8:
        raise NearMiss(f"{_q(node)}: '{qs[0].name}' quantizes to {z0.dtype.name}, not int8.")
    q0 = qs[0]
    s_t = q0.inputs[1]
    z_t = q0.inputs[2] if len(q0.inputs) > 2 and q0.inputs[2].name else ed.const(z0, base=f"{out.name}_zero_point")
    q_out = ed.var(dtype=np.int8, shape=out.shape, base=f"{out.name}_QuantizeLinear_Output")
    dq_out = ed.var(dtype=np.float32, shape=out.shape, base=f"{out.name}_DequantizeLinear_Output")
    first = chain[0]
    ed.node("QuantizeLinear", [out, s_t, z_t], [q_out], base=f"{out.name}_QuantizeLinear")
    ed.node("DequantizeLinear", [q_out, s_t, z_t], [dq_out], base=f"{out.name}_DequantizeLinear")
    first.inputs[0] = dq_out
    steps = " -> ".join(n.op for n in chain)
    return RewriteResult(
        detail=(f"quantized the output of {_q(node)} before its {steps} with the parameters of '{q0.name}' "
                f"(scale {float(s0.reshape(-1)[0]):.6g}, zero-point {int(z0.reshape(-1)[0])}): exact"),
    )
