"""Channel rewriters: split or pad awkward channel counts, unfuse a Gemm with a computed bias.

Chunk widths (shared by the output and the input split) are chosen deterministically by
:func:`chunk_sizes`: the fewest chunks that fit ``chunk_max`` (the profile's ``channel_chunk_max``
unless the rule overrides it), every chunk but the last as wide as the balanced width rounded up to a
multiple of ``align`` (8 by default) when that still fits, the last one taking the rest. 257 channels
with chunks of at most 144 give 136 + 121, the 136-wide chunks of the published rewrite of the forum
denoiser (NPU_FACTS.md#cases); ``align: 1`` gives the balanced 129 + 128.

In QDQ models the rewriters keep the user's quantization: sliced weights keep their int8 values and
per-channel scales, every new activation tensor between quantized ops gets a QuantizeLinear /
DequantizeLinear pair with the parameters of the tensor it is a part of (a chunk of the output is
quantized with the output's own scale and zero-point), so the rewritten model computes the same
integers as the original.
"""

from __future__ import annotations


import numpy as np
from .. import ir

from ..graph import Editor, GraphView, QuantWeight, node_label, qdq_params, read_weight
from ..npu.constraints import channel_split_ok
from . import Match, NearMiss, RewriteResult, rewriter

# ------------------------------------------------------------------------------------------------
# chunking
# ------------------------------------------------------------------------------------------------


def chunk_sizes(total: int, chunk_max: int, *, align: int = 8, unit: int = 1) -> list[int]:
    """Split ``total`` units (channels, or groups of ``unit`` channels each) into the fewest chunks of
    at most ``chunk_max`` channels. Every chunk but the last is ``ceil(total / n)`` units, rounded up
    so that its channel count is a multiple of ``align`` when that still fits; the last takes the
    rest. Returns unit counts (their sum is ``total``)."""
    if unit < 1 or unit > chunk_max:
        raise ValueError(f"a unit of {unit} channels does not fit chunks of {chunk_max}")
    umax = chunk_max // unit
    n = -(-total // umax)
    if n <= 1:
        return [total]
    width = -(-total // n)
    aligned = width
    while (aligned * unit) % max(align, 1) and aligned < umax:
        aligned += 1
    if (aligned * unit) % max(align, 1) == 0 and aligned <= umax:
        width = aligned
    sizes = [width] * (n - 1)
    sizes.append(total - width * (n - 1))
    assert sizes[-1] > 0 and all(s * unit <= chunk_max for s in sizes)
    return sizes


def padded_count(channels: int, chunk_max: int) -> int:
    """The smallest channel count >= ``channels`` that passes ``channel_split_ok``."""
    c = channels
    while not channel_split_ok(c, chunk_max):
        c += 1
    return c


def _chunk_max(match: Match) -> int:
    v = match.params.get("chunk_max")
    return int(v) if v else int(match.profile.limit("channel_chunk_max"))


def _const(ed: Editor, values, base: str | None = None) -> ir.Constant:
    """``ed.const`` that keeps 0-d arrays 0-d (quantization scales and zero-points must be scalars;
    ``Editor.const`` passes values through ``np.ascontiguousarray``, which makes them 1-D)."""
    v = np.asarray(values)
    if v.ndim:
        return ed.const(v, base)
    return ir.Constant(ed.name(base), v)


def _bounds(sizes: list[int], unit: int = 1) -> list[tuple[int, int]]:
    out, a = [], 0
    for s in sizes:
        out.append((a * unit, (a + s) * unit))
        a += s
    return out


def _plus(sizes) -> str:
    return " + ".join(str(s) for s in sizes)


# ------------------------------------------------------------------------------------------------
# small builders
# ------------------------------------------------------------------------------------------------


def _q(node: ir.Node) -> str:
    return f"'{node_label(node)}'"


def _shape_with(t: ir.Tensor, axis: int, size: int):
    if t.shape is None:
        return None
    s = list(t.shape)
    s[axis] = size
    return s


def _weight(match: Match, node: ir.Node, idx: int, what: str) -> QuantWeight:
    if idx >= len(node.inputs) or not node.inputs[idx].name:
        raise NearMiss(f"{_q(node)} has no {what}.")
    w = read_weight(match.view, node.inputs[idx])
    if w is None:
        raise NearMiss(f"{_q(node)} reads its {what} '{node.inputs[idx].name}' from a computation nafix cannot slice "
                       f"(it must be a constant, directly or through one DequantizeLinear).")
    return w


def _bias(match: Match, node: ir.Node, idx: int) -> QuantWeight | None:
    if idx >= len(node.inputs) or not node.inputs[idx].name:
        return None
    return _weight(match, node, idx, "bias")


def _dq_const(ed: Editor, w: QuantWeight, values: np.ndarray, scale: np.ndarray, zp: np.ndarray,
              axis: int | None, base: str) -> ir.Tensor:
    """A new DequantizeLinear of constant ``values`` (reusing the original parameter tensors when the
    parameters are unchanged)."""
    dq = w.dq
    same = scale.shape == np.asarray(w.scale).shape and np.array_equal(scale, w.scale) and np.array_equal(zp, w.zero_point)
    if same:
        s_t = dq.inputs[1]
        z_t = dq.inputs[2] if len(dq.inputs) > 2 and dq.inputs[2].name else None
    else:
        s_t = _const(ed, np.asarray(scale, dtype=np.asarray(w.scale).dtype), base + "_scale")
        z_t = _const(ed, np.asarray(zp, dtype=np.asarray(w.zero_point).dtype), base + "_zero_point")
    attrs = {"axis": int(axis)} if axis is not None and np.asarray(scale).size > 1 else {}
    ins = [ed.const(values, base + "_quantized"), s_t] + ([z_t] if z_t is not None else [])
    return ed.node("DequantizeLinear", ins, attrs=attrs, dtype=np.float32, shape=list(values.shape)).outputs[0]


def _slice_weight(ed: Editor, w: QuantWeight, axis: int, a: int, b: int, base: str, *,
                  pad_to: int | None = None) -> ir.Tensor:
    """``w`` restricted to ``[a, b)`` along ``axis`` (or zero-padded to ``pad_to`` along it), as a new
    constant or a new DequantizeLinear of a new constant, with per-channel parameters sliced alike."""
    v = np.asarray(w.values)
    if pad_to is not None:
        widths = [(0, 0)] * v.ndim
        widths[axis] = (0, pad_to - v.shape[axis])
        vals = np.pad(v, widths)
    else:
        vals = np.take(v, np.arange(a, b), axis=axis)
    if not w.quantized:
        return ed.const(vals.astype(v.dtype, copy=False), base)
    scale, zp = np.asarray(w.scale), np.asarray(w.zero_point)
    if scale.size > 1 and w.axis == axis:
        if pad_to is not None:
            n = pad_to - scale.shape[0]
            scale = np.concatenate([scale, np.repeat(scale[-1:], n)])  # any valid scale: the values are 0
            zp = np.concatenate([zp, np.zeros(n, dtype=zp.dtype)])
        else:
            scale, zp = scale[a:b], zp[a:b]
    return _dq_const(ed, w, vals, scale, zp, w.axis, base)


def _qdq(ed: Editor, t: ir.Tensor, params: tuple[ir.Tensor, ir.Tensor | None]) -> ir.Tensor:
    """``t`` through a new QuantizeLinear -> DequantizeLinear pair with the given parameter tensors."""
    s, z = params
    qdtype = np.dtype(z.dtype) if z is not None and z.dtype is not None else np.uint8
    ins = [s] + ([z] if z is not None else [])
    q = ed.node("QuantizeLinear", [t] + ins, dtype=qdtype, shape=t.shape)
    return ed.node("DequantizeLinear", [q.outputs[0]] + ins, dtype=np.float32, shape=t.shape).outputs[0]


def _output_qparams(view: GraphView, out: ir.Tensor):
    """(scale, zero_point) tensors of the QuantizeLinear(s) that read ``out`` when every reader is a
    per-tensor QuantizeLinear with the same parameters; None otherwise (a float output)."""
    cons = list(out.outputs)
    if not cons or view.is_graph_output(out) or any(c.op != "QuantizeLinear" for c in cons):
        return None
    first = None
    for c in cons:
        try:
            s, z, axis = qdq_params(view, c)
        except ValueError:
            return None
        if s.size != 1:
            return None
        if first is None:
            first = (s, z, c)
        elif not (np.array_equal(first[0], s) and np.array_equal(first[1], z) and first[1].dtype == z.dtype):
            return None
    c = first[2]
    return c.inputs[1], (c.inputs[2] if len(c.inputs) > 2 and c.inputs[2].name else None)


def _input_qparams(view: GraphView, t: ir.Tensor):
    """(scale, zero_point) tensors of the per-tensor DequantizeLinear producing ``t``, else None."""
    p = view.producer(t)
    if p is None or p.op != "DequantizeLinear":
        return None
    try:
        s, _, _ = qdq_params(view, p)
    except ValueError:
        return None
    if s.size != 1:
        return None
    return p.inputs[1], (p.inputs[2] if len(p.inputs) > 2 and p.inputs[2].name else None)


def _slice(ed: Editor, t: ir.Tensor, axis: int, a: int, b: int, qparams=None) -> ir.Tensor:
    starts = ed.const(np.array([a], np.int64), "starts")
    ends = ed.const(np.array([b], np.int64), "ends")
    axes = ed.const(np.array([axis], np.int64), "axes")
    shape = _shape_with(t, axis, b - a) if t.shape is not None else None
    y = ed.node("Slice", [t, starts, ends, axes], dtype=t.dtype or np.float32, shape=shape).outputs[0]
    return _qdq(ed, y, qparams) if qparams is not None else y


def _rank(t: ir.Tensor) -> int | None:
    return len(t.shape) if t.shape is not None else None


# ------------------------------------------------------------------------------------------------
# NAF001: output channels
# ------------------------------------------------------------------------------------------------


class _OutSpec:
    """Where the output channels of a Conv/ConvTranspose/Gemm/MatMul live."""

    def __init__(self, match: Match):
        node = match.node
        self.node = node
        op = node.op
        if op not in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
            raise NearMiss(f"{_q(node)} is a {op}; output-channel splitting handles Conv, ConvTranspose, Gemm and MatMul.")
        self.w = _weight(match, node, 1, "weights")
        wv = np.asarray(self.w.values)
        out = node.outputs[0]
        self.group = int(node.attrs.get("group", 1)) if op in ("Conv", "ConvTranspose") else 1
        self.bias = None
        self.bias_axis = None
        if op == "Conv":
            self.w_axis, self.out_axis = 0, 1
            self.channels = wv.shape[0]
            self.bias = _bias(match, node, 2)
            self.bias_axis = 0
        elif op == "ConvTranspose":
            if self.group != 1:
                raise NearMiss(f"{_q(node)} is a grouped ConvTranspose ({self.group} groups); only group 1 is split.")
            self.w_axis, self.out_axis = 1, 1
            self.channels = wv.shape[1]
            self.bias = _bias(match, node, 2)
            self.bias_axis = 0
        elif op == "Gemm":
            if wv.ndim != 2:
                raise NearMiss(f"{_q(node)} has {wv.ndim}-D weights; Gemm needs 2-D operands.")
            trans_b = int(node.attrs.get("transB", 0))
            self.w_axis, self.out_axis = (0 if trans_b else 1), 1
            self.channels = wv.shape[self.w_axis]
            self.bias = _bias(match, node, 2)
            if self.bias is not None:
                bv = np.asarray(self.bias.values)
                if bv.ndim >= 1 and bv.shape[-1] == self.channels and self.channels > 1:
                    self.bias_axis = bv.ndim - 1
        else:  # MatMul
            if wv.ndim < 2:
                raise NearMiss(f"{_q(node)} multiplies by a 1-D vector; it has no output-channel axis to split.")
            self.w_axis = wv.ndim - 1
            self.channels = wv.shape[-1]
            r = _rank(out)
            if r is None:
                a_rank = _rank(node.inputs[0])
                r = max(a_rank or 2, wv.ndim)
            self.out_axis = r - 1
        if self.group > 1:
            if self.channels % self.group:
                raise NearMiss(f"{_q(node)} has {self.channels} output channels in {self.group} groups (not divisible).")
            self.unit = self.channels // self.group  # output channels per group
            self.cin_per_group = wv.shape[1]
        else:
            self.unit = 1
            self.cin_per_group = None


@rewriter("split_output_channels", strategy="split", chunk_max=None, align=8)
def split_output_channels(match: Match, ed: Editor) -> RewriteResult:
    """Splits the output channels of a Conv, ConvTranspose (group 1), Gemm or MatMul with constant
    weights into chunks of at most `chunk_max` channels (the profile's channel_chunk_max by default),
    each computed by its own copy of the op with sliced weights, bias and per-channel quantization
    parameters, and joins them with a Concat on the channel axis (`strategy: split`); grouped and
    depthwise Conv are split on group boundaries, slicing the input as well. With `strategy: pad` it
    instead adds zero filters up to the smallest channel count that splits evenly and slices the
    surplus off after the op. In a QDQ model every chunk is quantized with the original output's scale
    and zero-point before the Concat, so the result is bit-exact. When the op's output is read only by
    an activation (Relu, Clip, LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish) whose output is
    quantized (Conv -> Relu -> QuantizeLinear), each chunk carries its own copy of the activation
    before its QuantizeLinear, so every chunk stays int8 end to end."""
    node, view = match.node, match.view
    spec = _OutSpec(match)
    chunk_max = _chunk_max(match)
    strategy = str(match.params.get("strategy", "split"))
    if strategy not in ("split", "pad"):
        raise NearMiss(f"rule parameter strategy is '{strategy}'; use 'split' or 'pad'.")
    C = spec.channels
    if channel_split_ok(C, chunk_max):
        raise NearMiss(f"{_q(node)} has {C} output channels, which already split evenly into chunks of at most {chunk_max}.")
    out = node.outputs[0]
    oq = _output_qparams(view, out)
    act = _fused_activation(view, out) if oq is None else None
    if act is not None:
        oq = _output_qparams(view, act.outputs[0])
        if oq is None:
            act = None
    inputs = list(node.inputs)
    base = node.name

    if strategy == "pad":
        if spec.group > 1:
            raise NearMiss(f"{_q(node)} is a grouped Conv ({spec.group} groups); padding would need extra input "
                           f"channels, use strategy 'split'.")
        Cp = padded_count(C, chunk_max)
        new_in = list(inputs)
        new_in[1] = _slice_weight(ed, spec.w, spec.w_axis, 0, 0, base + "_w", pad_to=Cp)
        if spec.bias is not None and spec.bias_axis is not None:
            new_in[2] = _slice_weight(ed, spec.bias, spec.bias_axis, 0, 0, base + "_b", pad_to=Cp)
        ed.remove(node)
        y = ed.node(node.op, new_in, attrs=dict(node.attrs), dtype=out.dtype or np.float32,
                    shape=_shape_with(out, spec.out_axis, Cp)).outputs[0]
        final = out
        if act is not None:
            y = _activation(ed, act, y)
            final = act.outputs[0]
            ed.remove(act)
        if oq is not None:
            y = _qdq(ed, y, oq)
        starts = ed.const(np.array([0], np.int64), "starts")
        ends = ed.const(np.array([C], np.int64), "ends")
        axes = ed.const(np.array([spec.out_axis], np.int64), "axes")
        ed.node("Slice", [y, starts, ends, axes], outputs=[final])
        q = "; the padded output is quantized with the original output parameters before the Slice" if oq is not None else ""
        k = _parts(Cp, chunk_max)
        return RewriteResult(detail=f"padded {_q(node)} from {C} to {Cp} output channels with zero filters "
                                    f"({k} chunks of {Cp // k}) and sliced the result back to {C}{q}")

    # strategy split
    try:
        units = chunk_sizes(C // spec.unit, chunk_max, align=int(match.params.get("align", 8) or 1), unit=spec.unit)
    except ValueError:
        raise NearMiss(f"{_q(node)} has {spec.unit} output channels per group, more than a chunk of {chunk_max}.") from None
    sizes = [u * spec.unit for u in units]
    in_q = _input_qparams(view, inputs[0]) if oq is not None else None
    ed.remove(node)
    parts = []
    for j, ((a, b), (ua, ub)) in enumerate(zip(_bounds(sizes), _bounds(units))):
        new_in = list(inputs)
        new_in[1] = _slice_weight(ed, spec.w, spec.w_axis, a, b, f"{base}_w{j}")
        if spec.bias is not None:
            if spec.bias_axis is not None:
                new_in[2] = _slice_weight(ed, spec.bias, spec.bias_axis, a, b, f"{base}_b{j}")
        attrs = dict(node.attrs)
        if spec.group > 1:
            cg = spec.cin_per_group
            new_in[0] = _slice(ed, inputs[0], 1, ua * cg, ub * cg, in_q)
            attrs["group"] = ub - ua
        y = ed.node(node.op, new_in, attrs=attrs, dtype=out.dtype or np.float32,
                    shape=_shape_with(out, spec.out_axis, b - a)).outputs[0]
        if act is not None:
            y = _activation(ed, act, y)
        parts.append(_qdq(ed, y, oq) if oq is not None else y)
    final = out
    if act is not None:
        final = act.outputs[0]
        ed.remove(act)
    ed.node("Concat", parts, outputs=[final], attrs={"axis": spec.out_axis})
    how = "groups" if spec.group > 1 else "channels"
    q = "; each chunk is quantized with the original output parameters before the Concat" if oq is not None else ""
    if act is not None:
        q = (f"; each chunk carries its own {act.op} '{act.name}' and is quantized with the original "
             f"output parameters before the Concat")
    return RewriteResult(detail=f"split {_q(node)} {C} output {how if how == 'channels' else 'channels (on group boundaries)'} "
                                f"into {_plus(sizes)} joined by a Concat on axis {spec.out_axis}{q}")


#: Per-element activations a chunk can carry (the compiler fuses them into the Conv's epoch).
CARRIED_ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish")


def _fused_activation(view: GraphView, out: ir.Tensor) -> ir.Node | None:
    """The activation that alone reads ``out`` (Conv -> Relu -> QuantizeLinear), when it acts on each
    element on its own with constant parameters, so each chunk can carry a copy of it."""
    cons = list(out.outputs)
    if len(cons) != 1 or view.is_graph_output(out):
        return None
    a = cons[0]
    if a.op not in CARRIED_ACTIVATIONS or len(a.outputs) != 1 or a.inputs[0] is not out:
        return None
    if any(t.name and not view.is_const(t) for t in a.inputs[1:]):
        return None
    return a


def _activation(ed: Editor, act: ir.Node, y: ir.Tensor) -> ir.Tensor:
    """A copy of ``act`` on chunk ``y`` (same attributes and constant parameters)."""
    return ed.node(act.op, [y] + list(act.inputs[1:]), attrs=dict(act.attrs), dtype=y.dtype,
                   shape=y.shape).outputs[0]


def _parts(channels: int, chunk_max: int) -> int:
    """Number of equal chunks of at most ``chunk_max`` that ``channels`` divides into."""
    if channels <= chunk_max:
        return 1
    k = -(-channels // chunk_max)
    while channels % k:
        k += 1
    return k


# ------------------------------------------------------------------------------------------------
# NAF002: input channels
# ------------------------------------------------------------------------------------------------


@rewriter("split_input_channels", chunk_max=None, align=8, quantized_ok=False)
def split_input_channels(match: Match, ed: Editor) -> RewriteResult:
    """Splits the input channels of a Conv (group 1), or the reduction dimension K of a Gemm or
    MatMul with constant weights, into chunks of at most `chunk_max` (the profile's channel_chunk_max by
    default): each chunk Slices the input and multiplies it by the matching slice of the weights, and
    the partial results are summed with a chain of Add nodes; the bias (and Gemm's beta * C) is added
    once, by the first partial op. In a QDQ model the partial sums need new quantization parameters:
    with `quantized_ok` (set by nafix --quantize) the weight slices keep their int8 values and scales
    and the partial sums are left in float for onnxruntime to calibrate; otherwise it is a near-miss."""
    node, view = match.node, match.view
    op = node.op
    w = _weight(match, node, 1, "weights")
    if w.quantized and not match.params.get("quantized_ok"):
        raise NearMiss(f"{_q(node)} is quantized; its partial sums would need new quantization parameters "
                       f"(select NAF002 with nafix --quantize, which calibrates them).")
    wv = np.asarray(w.values)
    x = node.inputs[0]
    out = node.outputs[0]
    attrs = dict(node.attrs)
    if op == "Conv":
        if int(attrs.get("group", 1)) != 1:
            raise NearMiss(f"{_q(node)} is a grouped Conv; only group-1 Conv input channels are split.")
        K, w_axis, x_axis = wv.shape[1], 1, 1
    elif op == "Gemm":
        if wv.ndim != 2:
            raise NearMiss(f"{_q(node)} has {wv.ndim}-D weights; Gemm needs 2-D operands.")
        trans_b = int(attrs.get("transB", 0))
        w_axis = 1 if trans_b else 0
        x_axis = 0 if int(attrs.get("transA", 0)) else 1
        K = wv.shape[w_axis]
    elif op == "MatMul":
        w_axis = 0 if wv.ndim == 1 else wv.ndim - 2
        r = _rank(x)
        if r is None:
            raise NearMiss(f"{_q(node)} reads an input of unknown rank.")
        x_axis = r - 1
        K = wv.shape[w_axis]
    else:
        raise NearMiss(f"{_q(node)} is a {op}; input-channel splitting handles Conv, Gemm and MatMul.")
    chunk_max = _chunk_max(match)
    if channel_split_ok(K, chunk_max):
        raise NearMiss(f"{_q(node)} has {K} input channels, which already split evenly into chunks of at most {chunk_max}.")
    sizes = chunk_sizes(K, chunk_max, align=int(match.params.get("align", 8) or 1))
    inputs = list(node.inputs)
    dtype = out.dtype or np.float32
    ed.remove(node)
    partials = []
    for j, (a, b) in enumerate(_bounds(sizes)):
        xs = _slice(ed, x, x_axis, a, b)
        ins = [xs, _slice_weight(ed, w, w_axis, a, b, f"{node.name}_w{j}")]
        pattrs = dict(attrs)
        if j == 0 and len(inputs) > 2 and inputs[2].name:
            ins.append(inputs[2])  # bias / C once
        elif op == "Gemm":
            pattrs.pop("beta", None)
        partials.append(ed.node(op, ins, attrs=pattrs, dtype=dtype, shape=out.shape).outputs[0])
    acc = partials[0]
    for k, p in enumerate(partials[1:]):
        last = k == len(partials) - 2
        acc = ed.node("Add", [acc, p], outputs=[out] if last else None, dtype=dtype, shape=out.shape).outputs[0]
    what = {"Conv": "input channels", "Gemm": "reduction channels (K)", "MatMul": "reduction channels (K)"}[op]
    return RewriteResult(detail=f"split {_q(node)} {K} {what} into {_plus(sizes)}, partial results summed with "
                                f"{len(sizes) - 1} Add")


# ------------------------------------------------------------------------------------------------
# NAF011: Gemm with a computed bias
# ------------------------------------------------------------------------------------------------


def _qrange(scale: float, zp: int, dtype) -> tuple[float, float]:
    info = np.iinfo(np.dtype(dtype))
    return scale * (info.min - zp), scale * (info.max - zp)


def _qparams_for(lo: float, hi: float, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Asymmetric parameters covering [lo, hi] (and 0), computed the way onnxruntime does."""
    info = np.iinfo(np.dtype(dtype))
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / float(info.max - info.min)
    if scale <= 0:
        scale = 1.0
    zp = int(np.clip(round(info.min - lo / scale), info.min, info.max))
    return np.array(scale, np.float32), np.array(zp, dtype=np.dtype(dtype))


@rewriter("unfuse_gemm_bias")
def unfuse_gemm_bias(match: Match, ed: Editor) -> RewriteResult:
    """Rebuilds a Gemm whose bias C is computed at run time as MatMul + Add: transA becomes a
    Transpose of A, transB a pre-transposed constant (or a Transpose node when B is not constant),
    alpha is folded into constant weights (a Mul otherwise) and beta into C (a Mul in float models, the
    scale of C's DequantizeLinear in QDQ models). In a QDQ model the new MatMul output gets its own
    QuantizeLinear/DequantizeLinear pair whose range is derived from the calibrated ranges of the Gemm
    output and of C (output range minus the range of beta * C), so every tensor stays int8; the Gemm's
    own output quantization is kept after the Add."""
    node, view = match.node, match.view
    if node.op != "Gemm":
        raise NearMiss(f"{_q(node)} is a {node.op}, not a Gemm.")
    if len(node.inputs) < 3 or not node.inputs[2].name:
        raise NearMiss(f"{_q(node)} has no bias C.")
    A, B, C = node.inputs[0], node.inputs[1], node.inputs[2]
    out = node.outputs[0]
    alpha = float(node.attrs.get("alpha", 1.0))
    beta = float(node.attrs.get("beta", 1.0))
    trans_a = int(node.attrs.get("transA", 0))
    trans_b = int(node.attrs.get("transB", 0))
    dtype = out.dtype or np.float32
    oq = _output_qparams(view, out)
    notes = []

    qdq = oq is not None
    if qdq:
        cdq = view.producer(C)
        c_params = _input_qparams(view, C)
        if c_params is None:
            raise NearMiss(f"{_q(node)} has a quantized output but its computed bias '{C.name}' does not come from a "
                           f"per-tensor DequantizeLinear, so nafix cannot derive a range for the MatMul output; "
                           f"re-quantize the model (nafix --quantize).")
        if alpha < 0 and beta < 0:
            raise NearMiss(f"{_q(node)} has negative alpha and beta in a QDQ model; nafix keeps DequantizeLinear scales "
                           f"positive and cannot express -(A*B + C) without a new quantized tensor.")
        if alpha == 0:
            raise NearMiss(f"{_q(node)} has alpha 0 (it only computes beta * C).")
    if beta == 0:
        raise NearMiss(f"{_q(node)} has beta 0: its bias is ignored; drop the bias input instead.")

    # A
    a_t = A
    if trans_a:
        a_q = _input_qparams(view, A) if qdq else None
        shape = list(reversed(A.shape)) if A.shape is not None else None
        a_t = ed.node("Transpose", [A], attrs={"perm": [1, 0]}, dtype=A.dtype or np.float32, shape=shape).outputs[0]
        if a_q is not None:
            a_t = _qdq(ed, a_t, a_q)
        notes.append("transA as a Transpose")

    # B (with |alpha| or alpha folded in when it is constant)
    w = read_weight(view, B)
    fold = abs(alpha) if qdq else alpha
    alpha_left = 1.0
    if w is not None:
        wv = np.asarray(w.values)
        if wv.ndim != 2:
            raise NearMiss(f"{_q(node)} has {wv.ndim}-D weights; Gemm needs 2-D operands.")
        vals = wv.T if trans_b else wv
        if w.quantized:
            scale = np.asarray(w.scale)
            axis = w.axis
            if scale.size > 1 and trans_b:
                axis = 1 - axis
            new_scale = (scale.astype(np.float64) * fold).astype(scale.dtype) if fold != 1 else scale
            b_t = _dq_const(ed, w, np.ascontiguousarray(vals), new_scale, np.asarray(w.zero_point), axis, node.name + "_w")
            if fold != 1:
                notes.append(f"alpha {alpha:g} folded into the weight scales")
            if qdq and alpha < 0:
                alpha_left = -1.0  # the sign is applied by the Sub below
        else:
            if qdq:
                raise NearMiss(f"{_q(node)} has a quantized output but float weights '{B.name}'; re-quantize the model.")
            b_t = ed.const(np.ascontiguousarray((vals.astype(np.float64) * alpha).astype(wv.dtype) if alpha != 1 else vals),
                           node.name + "_w")
            if alpha != 1:
                notes.append(f"alpha {alpha:g} folded into the weights")
        if trans_b:
            notes.append("transB pre-transposed")
    else:
        b_t = B
        if trans_b:
            b_q = _input_qparams(view, B) if qdq else None
            shape = list(reversed(B.shape)) if B.shape is not None else None
            b_t = ed.node("Transpose", [B], attrs={"perm": [1, 0]}, dtype=B.dtype or np.float32, shape=shape).outputs[0]
            if b_q is not None:
                b_t = _qdq(ed, b_t, b_q)
            notes.append("transB as a Transpose")
        if alpha != 1:
            if qdq:
                raise NearMiss(f"{_q(node)} has alpha {alpha:g} and non-constant weights in a QDQ model; the Mul by alpha "
                               f"would need its own quantization parameters.")
            alpha_left = alpha

    m_shape = list(out.shape) if out.shape is not None else None
    mm = ed.node("MatMul", [a_t, b_t], dtype=dtype, shape=m_shape).outputs[0]
    if alpha_left != 1.0 and not qdq:
        mm = ed.node("Mul", [mm, _const(ed, np.array(alpha_left, np.float32), "alpha")], dtype=dtype, shape=m_shape).outputs[0]
        notes.append(f"alpha {alpha:g} as a Mul")

    ed.remove(node)
    if not qdq:
        c_t = C
        if beta != 1:
            c_t = ed.node("Mul", [C, _const(ed, np.array(beta, np.float32), "beta")], dtype=dtype, shape=C.shape).outputs[0]
            notes.append(f"beta {beta:g} as a Mul on C")
        ed.node("Add", [mm, c_t], outputs=[out])
    else:
        cdq = view.producer(C)
        sc, zc, _ = qdq_params(view, cdq)
        c_dtype = np.asarray(zc).dtype
        c_int = cdq.inputs[0]
        c_t = C
        if abs(beta) != 1:
            s_new = _const(ed, np.asarray(float(sc.reshape(-1)[0]) * abs(beta), dtype=sc.dtype).reshape(sc.shape),
                           node.name + "_c_scale")
            z_t = cdq.inputs[2] if len(cdq.inputs) > 2 and cdq.inputs[2].name else None
            c_t = ed.node("DequantizeLinear", [c_int, s_new] + ([z_t] if z_t is not None else []), dtype=np.float32,
                          shape=C.shape).outputs[0]
            notes.append(f"beta {abs(beta):g} folded into the scale of C")
        # derived range of the MatMul output: s1 * T1 = Y - s2 * T2
        ys, yz, _ = qdq_params(view, out.outputs[0])
        ylo, yhi = _qrange(float(ys.reshape(-1)[0]), int(yz.reshape(-1)[0]), np.asarray(yz).dtype)
        clo, chi = _qrange(float(sc.reshape(-1)[0]) * abs(beta), int(np.asarray(zc).reshape(-1)[0]), c_dtype)
        s1 = -1.0 if alpha < 0 else 1.0
        s2 = -1.0 if beta < 0 else 1.0
        t2 = sorted((s2 * clo, s2 * chi))
        lo, hi = ylo - t2[1], yhi - t2[0]
        if s1 < 0:
            lo, hi = -hi, -lo
        m_scale, m_zp = _qparams_for(lo, hi, np.asarray(yz).dtype)
        mq = (_const(ed, m_scale, node.name + "_mm_scale"), _const(ed, m_zp, node.name + "_mm_zero_point"))
        mm = _qdq(ed, mm, mq)
        if s1 > 0 and s2 > 0:
            ed.node("Add", [mm, c_t], outputs=[out])
        elif s1 > 0:
            ed.node("Sub", [mm, c_t], outputs=[out])
        else:
            ed.node("Sub", [c_t, mm], outputs=[out])
        notes.append(f"MatMul output quantized with scale {float(m_scale):.6g} and zero-point {int(m_zp)} derived from "
                     f"the output and bias ranges")
    extra = f" ({'; '.join(notes)})" if notes else ""
    return RewriteResult(detail=f"unfused {_q(node)} into MatMul + Add of its computed bias '{C.name}'{extra}")
