"""More TFLite builtin operators for the importer (:mod:`fixer.importers.tflite`): the ones transformer
models use (LayerNorm as MEAN / SQUARED_DIFFERENCE / RSQRT, attention as BATCH_MATMUL, GELU MLPs) and the
other element-wise, comparison, selection and data-movement operators of LiteRT's builtin set.

Each handler maps the operator to ONNX operators that compute what the TFLite kernel computes on the
dequantized values (a quantized tensor stays ``QuantizeLinear -> int8 -> DequantizeLinear`` as for
every operator), and every one is checked against the interpreter op by op like the others
(:mod:`fixer.importers.tflite_check`). Where ONNX (opset 14) has no single operator, the handler emits
the composition and stamps every node with the TFLite operator (GELU: the ``Erf`` form PyTorch's ONNX
export writes, or the ``Tanh`` form; SQUARED_DIFFERENCE: ``Sub -> Mul``); RSQRT is one ``Pow(x, -0.5)``.
"""

from __future__ import annotations

import math

import numpy as np

import onnx

from . import tflite as _t
from .tflite import NCHW, _bias, _broadcast_operand, _no_hybrid, _reduce, _weights

_INT_MIN = -(2**31)  # a Slice end "through index 0" with a negative step


def _is_plain_const(imp, t: int) -> bool:
    v = imp.val(t)
    return v.const is not None and v.f is None and v.q is None


def _unary_nodes(build):
    """An element-wise operator built by ``build(imp, x_float_name) -> float name``, in the input's layout."""
    def handler(imp, ins, outs, opts):
        nchw = imp.layout_of(ins[:1])
        imp.emit(outs[0], build(imp, imp.fval(ins[0], nchw)), nchw)
    return handler


def _unary(op_type, **attrs):
    return _unary_nodes(lambda imp, x: imp.node(op_type, [x], **attrs)[0])


def _rsqrt(imp, x):
    """x ** -0.5: one node, as the TFLite operator is one layer (not Sqrt -> Reciprocal, two SW epochs
    in placement)."""
    return imp.node("Pow", [x, imp.init("rsqrt_exponent", np.float32(-0.5))])[0]


def _sqrt(imp, ins, outs, opts):
    """SQRT. LiteRT's int8 kernel truncates: y_q = floor(sqrt(x) / s_y) + z_y (measured on all 256 inputs:
    126 of them one LSB below round-to-nearest, none above), so the import floors before quantizing."""
    x, y = ins[0], outs[0]
    nchw = imp.layout_of(ins[:1])
    r = imp.node("Sqrt", [imp.fval(x, nchw)])[0]
    if imp.ttype(y) == "INT8" and imp.is_quant(y):
        (sy,), _, _ = imp.qparams(y)
        steps = imp.node("Floor", [imp.node("Mul", [r, imp.init("sqrt_inverse_scale", np.float32(1 / sy))])[0]])[0]
        r = imp.node("Mul", [steps, imp.init("sqrt_scale", np.float32(sy))])[0]
    imp.emit(y, r, nchw)


def _square(imp, x):
    return imp.node("Mul", [x, x])[0]


def _neg(imp, ins, outs, opts):
    """NEG. On int8 tensors TFLite negates the integers themselves, whatever the two tensors' scales
    (-(-128) wraps to -128): y_q = -x_q is y = (-x_q - z_y) s_y, an affine function of the dequantized
    input (plain Neg when y's parameters mirror x's, as the converter writes them), and the wrap a Where."""
    x, y = ins[0], outs[0]
    nchw = imp.layout_of(ins[:1])
    f = imp.fval(x, nchw)
    if not (imp.ttype(x) == imp.ttype(y) == "INT8" and imp.is_quant(x) and imp.is_quant(y)
            and imp.val(x).q is not None):
        imp.emit(y, imp.node("Neg", [f])[0], nchw)
        return
    (sx,), (zx,), _ = imp.qparams(x)
    (sy,), (zy,), _ = imp.qparams(y)
    if sx == sy and zy == -zx:
        neg = imp.node("Neg", [f])[0]
    else:
        neg = imp.node("Add", [imp.node("Mul", [f, imp.init("neg_scale", np.float32(-sy / sx))])[0],
                               imp.init("neg_offset", np.float32(-(int(zx) + int(zy)) * sy))])[0]
    wraps = imp.node("Equal", [imp.qval(x, nchw), imp.init("int8_min", np.int8(-128))])[0]
    out = imp.node("Where", [wraps, imp.init("neg_wrapped", np.float32((-128 - int(zy)) * sy)), neg])[0]
    imp.emit(y, out, nchw)


def _gelu_build(imp, x, approximate: bool):
    half = imp.init("gelu_half", np.float32(0.5))
    one = imp.init("gelu_one", np.float32(1.0))
    if approximate:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        x3 = imp.node("Mul", [imp.node("Mul", [x, x])[0], x])[0]
        inner = imp.node("Add", [x, imp.node("Mul", [x3, imp.init("gelu_c", np.float32(0.044715))])[0]])[0]
        t = imp.node("Tanh", [imp.node("Mul", [inner, imp.init("gelu_k", np.float32(math.sqrt(2 / math.pi)))])[0]])[0]
    else:  # 0.5 x (1 + erf(x / sqrt(2)))
        t = imp.node("Erf", [imp.node("Mul", [x, imp.init("gelu_rsqrt2", np.float32(1 / math.sqrt(2)))])[0]])[0]
    return imp.node("Mul", [imp.node("Mul", [x, imp.node("Add", [t, one])[0]])[0], half])[0]


def _gelu(imp, ins, outs, opts):
    approximate = bool(opts.Approximate()) if opts is not None else False
    nchw = imp.layout_of(ins[:1])
    imp.emit(outs[0], _gelu_build(imp, imp.fval(ins[0], nchw), approximate), nchw)


def _relu_0_to_1(imp, x):
    return imp.node("Clip", [x, imp.init("clip_min", np.float32(0.0)), imp.init("clip_max", np.float32(1.0))])[0]


# -- binary and n-ary ---------------------------------------------------------------------------------

def _binary_nodes(build, fold):
    """A broadcasting binary operator: ``build(imp, a, b) -> name``; ``fold(a, b)`` for constants."""
    def handler(imp, ins, outs, opts):
        y = outs[0]
        if all(_is_plain_const(imp, t) for t in ins[:2]) and not imp.is_quant(y):
            imp.emit_const(y, np.asarray(fold(imp.val(ins[0]).const, imp.val(ins[1]).const)))
            return
        nchw = imp.layout_of(ins[:2]) and imp.rank(y) == 4
        a = _broadcast_operand(imp, ins[0], nchw, imp.rank(y))
        b = _broadcast_operand(imp, ins[1], nchw, imp.rank(y))
        imp.emit(y, build(imp, a, b), nchw, imp.fused_name(opts))
    return handler


def _binary(op_type, fold):
    return _binary_nodes(lambda imp, a, b: imp.node(op_type, [a, b])[0], fold)


def _squared_difference(imp, a, b):
    d = imp.node("Sub", [a, b])[0]
    return imp.node("Mul", [d, d])[0]


def _not_equal(imp, a, b):
    return imp.node("Not", [imp.node("Equal", [a, b])[0]])[0]


def _floor_div(imp, a, b):
    return imp.node("Floor", [imp.node("Div", [a, b])[0]])[0]


def _floor_mod(imp, a, b):  # a - floor(a / b) * b (the sign of b, as TFLite's FLOOR_MOD)
    return imp.node("Sub", [a, imp.node("Mul", [_floor_div(imp, a, b), b])[0]])[0]


def _float_only(name, handler):
    """Operators TFLite computes on float (or integer) tensors only: a quantized one is refused."""
    def wrapped(imp, ins, outs, opts):
        for t in list(ins) + list(outs):
            if t >= 0 and imp.is_quant(t) and not _is_plain_const(imp, t):
                imp.fail(f"{name} '{imp.tname(outs[0])}' on quantized tensors is not supported (TFLite has no "
                         "int8 kernel for it).")
        handler(imp, ins, outs, opts)
    return wrapped


def _add_n(imp, ins, outs, opts):
    nchw = imp.layout_of(ins) and imp.rank(outs[0]) == 4
    y = imp.node("Sum", [_broadcast_operand(imp, t, nchw, imp.rank(outs[0])) for t in ins])[0]
    imp.emit(outs[0], y, nchw)


def _select(v2: bool):
    def handler(imp, ins, outs, opts):
        cond, a, b, y = ins[0], ins[1], ins[2], outs[0]
        if not v2 and imp.rank(cond) == 1 and imp.rank(a) > 1:
            # SELECT (v1) with a vector condition picks whole rows along the first axis.
            c = imp.node("Reshape", [imp.fval(cond, False), imp.ints([imp.shape(cond)[0]] + [1] * (imp.rank(a) - 1))])[0]
            imp.emit(y, imp.node("Where", [c, imp.fval(a, False), imp.fval(b, False)])[0], False)
            return
        nchw = imp.layout_of(ins[:3]) and imp.rank(y) == 4
        ops = [_broadcast_operand(imp, t, nchw, imp.rank(y)) for t in (cond, a, b)]
        imp.emit(y, imp.node("Where", ops)[0], nchw)
    return handler


# -- matrix product -------------------------------------------------------------------------------------

def _swapped_last(imp, t: int) -> str:
    """The float value of ``t`` with its last two axes swapped; a quantized tensor is transposed as
    integers (``int8 -> Transpose -> DequantizeLinear``), a constant at import time."""
    r = imp.rank(t)
    perm = list(range(r - 2)) + [r - 1, r - 2]
    v = imp.val(t)
    qp = imp.qparams(t)
    if _is_plain_const(imp, t):
        arr = np.ascontiguousarray(np.swapaxes(v.const, -1, -2))
        if qp is not None and imp.ttype(t) in ("INT8", "UINT8"):
            axis = perm.index(qp[2]) if qp[0].size > 1 else None
            return imp.dq(imp.init(imp.tname(t) + "_quantized_t", arr), t, nchw=False, perm_axis=axis)
        return imp.init(imp.tname(t) + "_t", arr.astype(np.float32) if arr.dtype.kind == "f" else arr)
    if v.q is not None:
        qt = imp.node("Transpose", [imp.qval(t, False)], perm=perm)[0]
        return imp.dq(qt, t, nchw=False)
    return imp.node("Transpose", [imp.fval(t, False)], perm=perm)[0]


def _batch_matmul(imp, ins, outs, opts):
    a, b, y = ins[0], ins[1], outs[0]
    _no_hybrid(imp, a, b, y, "BATCH_MATMUL")
    adj_x = bool(opts.AdjX()) if opts is not None else False
    adj_y = bool(opts.AdjY()) if opts is not None else False
    fa = _swapped_last(imp, a) if adj_x else imp.fval(a, False)
    fb = _swapped_last(imp, b) if adj_y else imp.fval(b, False)
    imp.emit(y, imp.node("MatMul", [fa, fb])[0], False)


# -- normalisations ------------------------------------------------------------------------------------

def _log_softmax(imp, ins, outs, opts):
    x = ins[0]
    nchw = imp.layout_of([x]) and imp.rank(x) == 4
    imp.emit(outs[0], imp.node("LogSoftmax", [imp.fval(x, nchw)], axis=1 if nchw else -1)[0], nchw)


def _l2_normalization(imp, ins, outs, opts):
    """x / max(sqrt(sum(x^2 over the last axis)), 1e-6), as TFLite's kernel."""
    x = ins[0]
    nchw = imp.layout_of([x]) and imp.rank(x) == 4
    f = imp.fval(x, nchw)
    ss = imp.node("ReduceSumSquare", [f], axes=[1 if nchw else -1], keepdims=1)[0]
    n = imp.node("Max", [imp.node("Sqrt", [ss])[0], imp.init("l2norm_epsilon", np.float32(1e-6))])[0]
    imp.emit(outs[0], imp.node("Div", [f, n])[0], nchw, imp.fused_name(opts))


# -- data movement ----------------------------------------------------------------------------------------

def _const_ints(imp, t: int, what: str, y: int) -> np.ndarray:
    arr = imp.const_array(t)
    if arr is None:
        imp.fail(f"{what} '{imp.tname(y)}' has a non-constant {imp.tname(t)}.")
    return np.asarray(arr).reshape(-1).astype(np.int64)


def _unpack(imp, ins, outs, opts):
    x = ins[0]
    r = imp.rank(x)
    axis = (opts.Axis() if opts is not None else 0) % r
    if _is_plain_const(imp, x):
        for k, o in enumerate(outs):
            imp.emit_const(o, np.take(imp.val(x).const, k, axis=axis))
        return
    names = imp.node("Split", [imp.fval(x, False), imp.ints([1] * len(outs), "split")],
                     [imp.uniq(f"unpack_{len(imp.nodes)}_{k}") for k in range(len(outs))], axis=axis)
    for o, n in zip(outs, names):
        imp.emit(o, imp.node("Squeeze", [n, imp.ints([axis], "axes")])[0], False)


def _broadcast_to(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    shape = _const_ints(imp, ins[1], "BROADCAST_TO", y)
    if imp.foldable(x, y):
        imp.emit_const(y, np.broadcast_to(imp.val(x).const, tuple(shape)).copy())
        return
    imp.emit(y, imp.node("Expand", [imp.fval(x, False), imp.ints(shape)])[0], False)


def _reverse_v2(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    r = imp.rank(x)
    axes = sorted({int(a) % r for a in _const_ints(imp, ins[1], "REVERSE_V2", y)})
    if imp.foldable(x, y):
        imp.emit_const(y, np.flip(imp.val(x).const, axis=tuple(axes)).copy())
        return
    nchw = imp.layout_of([x]) and r == 4
    onnx_axes = [NCHW.index(a) for a in axes] if nchw else axes
    n = len(axes)
    s = imp.node("Slice", [imp.fval(x, nchw), imp.ints([-1] * n, "starts"), imp.ints([_INT_MIN] * n, "ends"),
                           imp.ints(onnx_axes, "axes"), imp.ints([-1] * n, "steps")])[0]
    imp.emit(y, s, nchw)


def _gather_nd(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    idx = imp.const_array(ins[1])
    if idx is None:
        imp.fail(f"GATHER_ND '{imp.tname(y)}' has non-constant indices.")
    if imp.foldable(x, y):
        arr = imp.val(x).const
        idx = np.asarray(idx)
        imp.emit_const(y, arr[tuple(np.moveaxis(idx, -1, 0))])
        return
    imp.emit(y, imp.node("GatherND", [imp.fval(x, False), imp.init("indices", np.asarray(idx, np.int64))])[0], False)


def _note_indices(imp, idx: int, size: int) -> None:
    """``idx`` indexes an axis of ``size``: when it is a graph input, the check feeds it values in range."""
    name = imp.input_tensor_names.get(idx)
    if name is not None:
        imp.index_bounds[name] = min(size, imp.index_bounds.get(name, size))


def _gather(imp, ins, outs, opts):
    """GATHER; with indices that are not constant (token ids, positions given as an input) a Gather of
    the integer tensor of indices."""
    x, idx, y = ins[0], ins[1], outs[0]
    if imp.const_array(idx) is not None:
        _t._gather(imp, ins, outs, opts)
        return
    if opts is not None and opts.BatchDims():
        imp.fail(f"GATHER '{imp.tname(y)}' with batch_dims {opts.BatchDims()} is not supported.")
    axis = (opts.Axis() if opts is not None else 0) % imp.rank(x)
    _note_indices(imp, idx, imp.shape(x)[axis])
    imp.emit(y, imp.node("Gather", [imp.fval(x, False), imp.fval(idx, False)], axis=axis)[0], False)


def _embedding_lookup(imp, ins, outs, opts):
    """EMBEDDING_LOOKUP(ids, table): the rows of the table (an int8 table with per-row scales and a float
    output is TFLite's dequantizing lookup, which the DequantizeLinear of the table is too)."""
    ids, table, y = ins[0], ins[1], outs[0]
    const = imp.const_array(ids)
    idx = imp.init("indices", np.asarray(const, np.int64)) if const is not None else imp.fval(ids, False)
    if const is None:
        _note_indices(imp, ids, imp.shape(table)[0])
    imp.emit(y, imp.node("Gather", [imp.fval(table, False), idx], axis=0)[0], False)


def _topk(imp, ins, outs, opts):
    """TOPK_V2 along the last axis: values (sorted, largest first) and int32 indices."""
    x = ins[0]
    k = int(_const_ints(imp, ins[1], "TOPK_V2", outs[0])[0])
    values, indices = imp.node("TopK", [imp.fval(x, False), imp.ints([k], "k")],
                               [imp.uniq(f"topk_{len(imp.nodes)}_values"), imp.uniq(f"topk_{len(imp.nodes)}_indices")],
                               axis=-1, largest=1, sorted=1)
    imp.emit(outs[0], values, False)
    if len(outs) > 1:
        to = imp.onnx_type(outs[1])
        imp.emit(outs[1], imp.node("Cast", [indices], to=to)[0] if to != onnx.TensorProto.INT64 else indices, False)


def _mirror_pad(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    pads = imp.const_array(ins[1])
    if pads is None:
        imp.fail(f"MIRROR_PAD '{imp.tname(y)}' has non-constant paddings.")
    pads = np.asarray(pads, np.int64).reshape(-1, 2)
    symmetric = opts is not None and opts.Mode() == imp.tfl.MirrorPadMode.SYMMETRIC
    r = imp.rank(x)
    nchw = imp.layout_of([x]) and r == 4
    order = list(NCHW) if nchw else list(range(r))
    f = imp.fval(x, nchw)
    if not symmetric:  # REFLECT: the edge value is not repeated, ONNX Pad's "reflect"
        p = pads[order]
        imp.emit(y, imp.node("Pad", [f, imp.ints(np.concatenate([p[:, 0], p[:, 1]]), "pads")], mode="reflect")[0],
                 nchw)
        return
    # SYMMETRIC repeats the edge: per axis, the reversed first / last slices concatenated around it.
    shape = list(imp.shape(x))
    for onnx_axis, tfl_axis in enumerate(order):
        before, after = (int(v) for v in pads[tfl_axis])
        if not before and not after:
            continue
        n = shape[tfl_axis]
        parts = []
        if before:
            parts.append(imp.node("Slice", [f, imp.ints([before - 1], "starts"), imp.ints([_INT_MIN], "ends"),
                                            imp.ints([onnx_axis], "axes"), imp.ints([-1], "steps")])[0])
        parts.append(f)
        if after:
            parts.append(imp.node("Slice", [f, imp.ints([n - 1], "starts"), imp.ints([n - 1 - after], "ends"),
                                            imp.ints([onnx_axis], "axes"), imp.ints([-1], "steps")])[0])
        f = imp.node("Concat", parts, axis=onnx_axis)[0]
        shape[tfl_axis] = n + before + after
    imp.emit(y, f, nchw)


def _space_to_batch(imp, ins, outs, opts):
    """NHWC SPACE_TO_BATCH_ND (the dilated-convolution form of older converters): Pad, then the blocks
    of H and W moved into the batch by Reshape -> Transpose -> Reshape."""
    x, y = ins[0], outs[0]
    if imp.rank(x) != 4:
        imp.fail(f"SPACE_TO_BATCH_ND '{imp.tname(y)}' on a rank-{imp.rank(x)} tensor (only 4-D is supported).")
    bh, bw = (int(v) for v in _const_ints(imp, ins[1], "SPACE_TO_BATCH_ND", y))
    (pt, pb), (pl, pr) = _const_ints(imp, ins[2], "SPACE_TO_BATCH_ND", y).reshape(2, 2).tolist()
    n, h, w, c = imp.shape(x)
    f = imp.fval(x, False)
    if pt or pb or pl or pr:
        f = imp.node("Pad", [f, imp.ints([0, pt, pl, 0, 0, pb, pr, 0], "pads")])[0]
    hp, wp = (h + pt + pb) // bh, (w + pl + pr) // bw
    f = imp.node("Reshape", [f, imp.ints([n, hp, bh, wp, bw, c])])[0]
    f = imp.node("Transpose", [f], perm=[2, 4, 0, 1, 3, 5])[0]
    imp.emit(y, imp.node("Reshape", [f, imp.ints([bh * bw * n, hp, wp, c])])[0], False)


def _batch_to_space(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    if imp.rank(x) != 4:
        imp.fail(f"BATCH_TO_SPACE_ND '{imp.tname(y)}' on a rank-{imp.rank(x)} tensor (only 4-D is supported).")
    bh, bw = (int(v) for v in _const_ints(imp, ins[1], "BATCH_TO_SPACE_ND", y))
    (ct, cb), (cl, cr) = _const_ints(imp, ins[2], "BATCH_TO_SPACE_ND", y).reshape(2, 2).tolist()
    b, h, w, c = imp.shape(x)
    n = b // (bh * bw)
    f = imp.node("Reshape", [imp.fval(x, False), imp.ints([bh, bw, n, h, w, c])])[0]
    f = imp.node("Transpose", [f], perm=[2, 3, 0, 4, 1, 5])[0]
    f = imp.node("Reshape", [f, imp.ints([n, h * bh, w * bw, c])])[0]
    if ct or cb or cl or cr:
        f = imp.node("Slice", [f, imp.ints([ct, cl], "starts"), imp.ints([h * bh - cb, w * bw - cr], "ends"),
                               imp.ints([1, 2], "axes")])[0]
    imp.emit(y, f, False)


# -- patterns read as one operator ---------------------------------------------------------------------

def plan_fusions(imp, ops) -> dict:
    """Operator patterns the import reads as one operator, as ``{operator index: handler}`` (a handler
    that does nothing for the operators folded into another's).

    SPACE_TO_BATCH_ND -> CONV_2D / DEPTHWISE_CONV_2D (VALID, stride 1, no dilation) -> BATCH_TO_SPACE_ND
    with the same block is how older TFLite converters write a dilated convolution: it is one dilated
    ``Conv`` on the SPACE_TO_BATCH_ND input, padded by the paddings less the crops (the same values: the
    convolution reads every block-th row and column of the padded input, which the batch holds)."""
    consumers: dict[int, list[int]] = {}
    for i, (op, _) in enumerate(ops):
        for j in range(op.InputsLength()):
            consumers.setdefault(int(op.Inputs(j)), []).append(i)
    out_of = {i: [int(op.Outputs(j)) for j in range(op.OutputsLength())] for i, (op, _) in enumerate(ops)}
    plan: dict = {}
    for i, (op, name) in enumerate(ops):
        if name != "SPACE_TO_BATCH_ND":
            continue
        fusion = _dilated_conv_pattern(imp, ops, i, consumers, out_of)
        if fusion is not None:
            j, k, handler = fusion
            plan[i], plan[j], plan[k] = _skip, handler, _skip
    return plan


def _skip(imp, ins, outs, opts):
    """An operator folded into another's node (see :func:`plan_fusions`)."""


def _only_consumer(t: int, consumers, graph_outputs) -> int | None:
    users = consumers.get(t, [])
    return users[0] if len(users) == 1 and t not in graph_outputs else None


def _dilated_conv_pattern(imp, ops, i, consumers, out_of):
    stb = ops[i][0]
    if stb.InputsLength() != 3 or len(out_of[i]) != 1:
        return None
    stb_in, block_t, pads_t = (int(stb.Inputs(k)) for k in range(3))
    j = _only_consumer(out_of[i][0], consumers, imp.graph_outputs)
    if j is None or ops[j][1] not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        return None
    conv, conv_name = ops[j]
    if conv.InputsLength() < 2 or int(conv.Inputs(0)) != out_of[i][0] or len(out_of[j]) != 1:
        return None
    k = _only_consumer(out_of[j][0], consumers, imp.graph_outputs)
    if k is None or ops[k][1] != "BATCH_TO_SPACE_ND":
        return None
    bts = ops[k][0]
    if bts.InputsLength() != 3 or int(bts.Inputs(0)) != out_of[j][0] or len(out_of[k]) != 1:
        return None
    opts = imp.options(conv, conv_name)
    if opts is None or opts.Padding() != imp.tfl.Padding.VALID or (opts.StrideH(), opts.StrideW()) != (1, 1) \
            or (opts.DilationHFactor() or 1, opts.DilationWFactor() or 1) != (1, 1):
        return None
    vals = [imp.buffer(t) for t in (block_t, pads_t, int(bts.Inputs(1)), int(bts.Inputs(2)))]
    if any(v is None for v in vals) or imp.rank(stb_in) != 4:
        return None
    block, pads, block2, crops = (np.asarray(v, np.int64).reshape(-1) for v in vals)
    if block.size != 2 or not np.array_equal(block, block2) or pads.size != 4 or crops.size != 4:
        return None
    pads = [int(pads[0] - crops[0]), int(pads[2] - crops[2]), int(pads[1] - crops[1]), int(pads[3] - crops[3])]
    if min(pads) < 0 or not (imp.alias_ok(stb_in, out_of[i][0]) and imp.alias_ok(out_of[j][0], out_of[k][0])):
        return None
    dil = [int(block[0]), int(block[1])]
    depthwise = conv_name == "DEPTHWISE_CONV_2D"
    bts_out = out_of[k][0]

    def handler(imp, ins, outs, opts):
        x, w = stb_in, ins[1]
        _no_hybrid(imp, x, w, bts_out, conv_name)
        if depthwise:
            kh, kw = imp.shape(w)[1:3]
            weights, group = _weights(imp, w, (3, 0, 1, 2)), imp.shape(x)[3]
        else:
            kh, kw = imp.shape(w)[1:3]
            weights, group = _weights(imp, w, (0, 3, 1, 2)), imp.shape(x)[3] // imp.shape(w)[3]
        imp.cur["nafix.tflite.fused"] = f"SPACE_TO_BATCH_ND #{i}, {conv_name} #{j}, BATCH_TO_SPACE_ND #{k}"
        y = imp.node("Conv", [imp.fval(x, True), weights] + _bias(imp, ins, 2), kernel_shape=[kh, kw],
                     strides=[1, 1], pads=pads, dilations=dil, group=group)[0]
        imp.emit(bts_out, y, True, imp.fused_name(opts))
    return j, k, handler


def _cast(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    if imp.is_quant(x) or imp.is_quant(y):
        imp.fail(f"CAST '{imp.tname(y)}' of a quantized tensor is not supported.")
    to = imp.onnx_type(y)
    if _is_plain_const(imp, x):
        from onnx import helper
        imp.emit_const(y, imp.val(x).const.astype(helper.tensor_dtype_to_np_dtype(to)))
        return
    nchw = imp.layout_of([x])
    imp.emit(y, imp.node("Cast", [imp.fval(x, nchw)], to=to)[0], nchw)


def _cumsum(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    r = imp.rank(x)
    axis = int(_const_ints(imp, ins[1], "CUMSUM", y)[0]) % r
    attrs = {"exclusive": int(bool(opts.Exclusive())), "reverse": int(bool(opts.Reverse()))} if opts is not None else {}
    nchw = imp.layout_of([x]) and r == 4
    imp.emit(y, imp.node("CumSum", [imp.fval(x, nchw), imp.ints([NCHW.index(axis) if nchw else axis], "axis")],
                         **attrs)[0], nchw)


# -- shape-only values (folded: their value does not depend on the input's values) -------------------------

def _zeros_like(imp, ins, outs, opts):
    y = outs[0]
    if imp.is_quant(y):
        imp.fail(f"ZEROS_LIKE '{imp.tname(y)}' with a quantized output is not supported.")
    from onnx import helper
    imp.emit_const(y, np.zeros(imp.shape(y), helper.tensor_dtype_to_np_dtype(imp.onnx_type(y))))


def _fill(imp, ins, outs, opts):
    y = outs[0]
    dims, value = imp.const_array(ins[0]), imp.const_array(ins[1])
    if dims is None or value is None or imp.is_quant(y):
        imp.fail(f"FILL '{imp.tname(y)}' needs constant dims and value and an unquantized output.")
    imp.emit_const(y, np.full(np.asarray(dims).reshape(-1), np.asarray(value).reshape(-1)[0]))


def _range(imp, ins, outs, opts):
    y = outs[0]
    vals = [imp.const_array(t) for t in ins[:3]]
    if any(v is None for v in vals):
        imp.fail(f"RANGE '{imp.tname(y)}' has non-constant bounds.")
    start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in vals)
    imp.emit_const(y, np.arange(start, limit, delta, dtype=np.asarray(vals[0]).dtype))


_FOLD = {"Pow": np.power, "SquaredDifference": lambda a, b: (a - b) ** 2}

HANDLERS = {
    # element-wise, one input
    "RSQRT": _unary_nodes(_rsqrt), "SQRT": _sqrt, "SQUARE": _unary_nodes(_square),
    "EXP": _unary("Exp"), "LOG": _unary("Log"), "ABS": _unary("Abs"), "NEG": _neg,
    "SIN": _float_only("SIN", _unary("Sin")), "COS": _float_only("COS", _unary("Cos")),
    "FLOOR": _float_only("FLOOR", _unary("Floor")), "CEIL": _float_only("CEIL", _unary("Ceil")),
    "ROUND": _float_only("ROUND", _unary("Round")), "SIGN": _float_only("SIGN", _unary("Sign")),
    "ELU": _unary("Elu", alpha=1.0), "RELU_0_TO_1": _unary_nodes(_relu_0_to_1), "GELU": _gelu,
    "LOGICAL_NOT": _unary("Not"),
    # element-wise, two or more inputs
    "SQUARED_DIFFERENCE": _binary_nodes(_squared_difference, _FOLD["SquaredDifference"]),
    "POW": _float_only("POW", _binary("Pow", np.power)),
    "FLOOR_DIV": _float_only("FLOOR_DIV", _binary_nodes(_floor_div, lambda a, b: np.floor_divide(a, b))),
    "FLOOR_MOD": _float_only("FLOOR_MOD", _binary_nodes(_floor_mod, lambda a, b: np.mod(a, b))),
    "EQUAL": _binary("Equal", np.equal), "NOT_EQUAL": _binary_nodes(_not_equal, np.not_equal),
    "LESS": _binary("Less", np.less), "LESS_EQUAL": _binary("LessOrEqual", np.less_equal),
    "GREATER": _binary("Greater", np.greater), "GREATER_EQUAL": _binary("GreaterOrEqual", np.greater_equal),
    "LOGICAL_AND": _binary("And", np.logical_and), "LOGICAL_OR": _binary("Or", np.logical_or),
    "ADD_N": _add_n, "SELECT": _select(False), "SELECT_V2": _select(True),
    # reductions, normalisations, products
    "REDUCE_MIN": _reduce("ReduceMin"), "REDUCE_PROD": _reduce("ReduceProd"),
    "LOG_SOFTMAX": _log_softmax, "L2_NORMALIZATION": _l2_normalization, "BATCH_MATMUL": _batch_matmul,
    "CUMSUM": _cumsum,
    # data movement
    "GATHER": _gather, "EMBEDDING_LOOKUP": _embedding_lookup, "TOPK_V2": _topk,
    "UNPACK": _unpack, "BROADCAST_TO": _broadcast_to, "REVERSE_V2": _reverse_v2, "GATHER_ND": _gather_nd,
    "MIRROR_PAD": _mirror_pad, "SPACE_TO_BATCH_ND": _space_to_batch, "BATCH_TO_SPACE_ND": _batch_to_space,
    "CAST": _cast, "ZEROS_LIKE": _zeros_like, "FILL": _fill, "RANGE": _range,
}

OPTIONS = {
    "GELU": "GeluOptions", "BATCH_MATMUL": "BatchMatMulOptions", "MIRROR_PAD": "MirrorPadOptions",
    "UNPACK": "UnpackOptions", "CAST": "CastOptions", "CUMSUM": "CumsumOptions", "L2_NORMALIZATION": "L2NormOptions",
    "REDUCE_PROD": "ReducerOptions", "REDUCE_MIN": "ReducerOptions",
}

_t.register_operators(HANDLERS, OPTIONS, plan_fusions)
