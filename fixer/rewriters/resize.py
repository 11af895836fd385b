"""The ``resize`` family: bilinear Resize rebuilt from ops the NPU runs in HW.

A bilinear (``mode='linear'``) Resize runs in SW on the Neural-ART NPU (NPU_FACTS.md#operators, #cases: MoveNet
Lightning int8 had one SW epoch per bilinear Resize). For integer factors its output is a fixed
linear function of the input with a period of one input pixel, i.e. a depthwise ``ConvTranspose``
(group = channels, stride = factor) with a separable triangular kernel, once the border behaviour is
reproduced. How each ``coordinate_transformation_mode`` maps output pixel ``o`` of an axis of
``n -> m`` pixels back to input coordinate ``x`` (onnxruntime's Resize, upsampling by ``s``):

- ``half_pixel`` / ``pytorch_half_pixel`` (m > 1) / ``half_pixel_symmetric`` (m = s*n):
  ``x = (o + 0.5) / s - 0.5``, clamped to ``[0, n - 1]``. Clamping equals interpolating with the
  first/last row replicated, so the input is padded by one replicated row/column on each side
  (Slice + Concat) and the transposed conv's own ``pads`` crop the result.
- ``asymmetric``: ``x = o / s``; only the far end reads past the input (replicated once).
- ``align_corners``: ``x = o * (n - 1) / (m - 1)``. With ``(n - 1) / (m - 1) = p / q`` in lowest
  terms this is a stride-``q`` transposed conv sampled every ``p`` outputs: a fixed-stride kernel
  when ``p = 1`` (``m = q * (n - 1) + 1``, TensorFlow's usual shapes), a transposed conv followed by
  a strided Slice for small ``p``, and impractical otherwise (``p`` grows like ``n``).
- An axis of length 1 is a plain copy (box kernel); when every resized axis is of length 1 (or not
  resized) bilinear equals nearest, and the node becomes the HW nearest/asymmetric/floor Resize.

Quantized (QDQ) models keep their activation quantization: the replicated rows are sliced from the
int8 tensor before its DequantizeLinear, the kernel is an int8 constant through a DequantizeLinear
whose scale is ``1 / (Dh * Dw * 2^e)`` (the weights are integer multiples of that, so they are exact),
and the Resize's own QuantizeLinear quantizes the new output.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import gcd

import numpy as np

from .. import ir
from ..graph import Editor, attr, node_label, qdq_params
from ..npu.constraints import channel_split_ok
from . import Match, NearMiss, RewriteResult, rewriter

INT8_MAX = 127
HALF_PIXEL_MODES = ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric")
SUPPORTED_MODES = HALF_PIXEL_MODES + ("asymmetric", "align_corners")


@dataclass(frozen=True)
class AxisPlan:
    """How one spatial axis ``n -> m`` is rebuilt.

    The transposed conv reads the input padded by ``pad_begin``/``pad_end`` replicated rows, uses
    ``stride`` and the kernel ``num / den`` (integer numerators), crops ``crop_begin`` rows at the start
    and ``crop_end`` at the end (its ``pads``), giving ``full`` rows; a strided Slice then keeps every
    ``step``-th row (``step`` > 1 only for align_corners with ``(n-1)/(m-1) = p/q``, p > 1)."""

    n: int
    m: int
    kind: str  # copy | box | linear
    stride: int
    num: tuple[int, ...]
    den: int
    pad_begin: int = 0
    pad_end: int = 0
    crop_begin: int = 0
    step: int = 1

    @property
    def full(self) -> int:
        return (self.m - 1) * self.step + 1

    @property
    def crop_end(self) -> int:
        padded = self.n + self.pad_begin + self.pad_end
        return self.stride * (padded - 1) + len(self.num) - self.crop_begin - self.full


class Inexact(Exception):
    """The axis cannot be rebuilt exactly with a fixed kernel; the message completes a sentence."""


def _triangle(stride: int, u0: Fraction) -> tuple[tuple[int, ...], int]:
    """Kernel k[u] = 1 - |u - u0| / stride for u = 0, 1, ... while positive, as integer numerators over
    one denominator (``u0`` is stride - 1, or stride - 1/2, so k[0] > 0)."""
    num = []
    u = 0
    while Fraction(stride) - abs(Fraction(u) - u0) > 0:
        num.append(int((Fraction(stride) - abs(Fraction(u) - u0)) * u0.denominator))
        u += 1
    assert num and num[0] > 0
    return tuple(num), stride * u0.denominator


def plan_axis(mode: str, n: int, m: int, scale: float, *, max_step: int, axis: str = "") -> AxisPlan:
    """The exact rebuild of one axis resized ``n -> m`` (``scale`` as onnxruntime uses it), or
    :class:`Inexact` with a sentence (without its subject) saying why there is none."""
    where = f"{axis} {n} -> {m}" if axis else f"{n} -> {m}"
    if m == n and (mode == "align_corners" or scale == 1.0):
        return AxisPlan(n, m, "copy", 1, (1,), 1)
    if m < n:
        raise Inexact(f"shrinks {where}; NAF003 rebuilds upsampling only")
    if n == 1:
        # every mode samples the single input pixel (clamped): m copies
        return AxisPlan(n, m, "box", m, (1,) * m, 1)
    if mode == "align_corners":
        g = gcd(n - 1, m - 1)
        p, q = (n - 1) // g, (m - 1) // g
        if p > max_step:
            near = ", ".join(str(k * (n - 1) + 1) for k in (2, 3, 4))
            raise Inexact(
                f"uses align_corners on {where}: output pixel o samples input position o*{p}/{q}, so the weights "
                f"repeat only every {q} outputs; that is a stride-{q} ConvTranspose with a {2 * q - 1}-tap kernel "
                f"and a step-{p} Slice (more than max_align_corners_step {max_step}), not a practical fixed kernel. "
                f"align_corners is a fixed-stride kernel when the output size is k*(in-1)+1 (here {near}, ...)")
        num, den = _triangle(q, Fraction(q - 1))
        return AxisPlan(n, m, "linear", q, num, den, 0, 0, q - 1, p)
    if scale != round(scale) or round(scale) < 1:
        raise Inexact(f"scales {where} by {scale:g}, not an integer factor; {mode} bilinear resizing is a fixed "
                      f"kernel only for integer factors")
    s = int(round(scale))
    if m != s * n:
        raise Inexact(f"resizes {where} with scale {s}, which is not sampled on a fixed grid")
    if mode in HALF_PIXEL_MODES:
        # x = (o + 0.5)/s - 0.5 reads one replicated row before and after the input; kernel centre
        # u0 = (s - 1) (+ 1/2 for even s), crop = u0 + s * pad_begin + s * beta with s * beta = (1 - s)/2
        u0 = Fraction(s - 1) + (Fraction(1, 2) if s % 2 == 0 else 0)
        num, den = _triangle(s, u0)
        crop = u0 + s + Fraction(1 - s, 2)
        assert crop.denominator == 1
        return AxisPlan(n, m, "linear", s, num, den, 1, 1, int(crop))
    if mode == "asymmetric":
        # x = o / s reads one replicated row after the input
        num, den = _triangle(s, Fraction(s - 1))
        return AxisPlan(n, m, "linear", s, num, den, 0, 1, s - 1)
    raise Inexact(f"uses coordinate_transformation_mode '{mode}'")




def _resize_geometry(match: Match) -> tuple[list[int], list[int], list[float], str]:
    """(input shape, output shape, per-axis scales as onnxruntime uses them, where sizes came from)."""
    node, view = match.node, match.view
    label = node_label(node)
    x = node.inputs[0]
    info = view.info(x)
    shape = info.shape
    if shape is None:
        raise NearMiss(f"'{label}' reads a tensor of unknown rank; NAF003 needs a static rank-4 NCHW input.")
    rank = len(shape)
    if rank != 4:
        raise NearMiss(f"'{label}' resizes a rank-{rank} tensor; NAF003 rebuilds only rank-4 NCHW bilinear "
                       f"Resize (as a 2-D depthwise ConvTranspose).")
    if not all(isinstance(d, int) and d > 0 for d in shape[1:]):
        raise NearMiss(f"'{label}' has input shape {list(shape)}: channels, height and width must be static "
                       f"(pin the input shape) for a fixed kernel.")
    opset = match.view.opset or 17  # no default-domain import: the newest nafix builds for
    ins = node.inputs
    axes = node.attrs.get("axes")
    axes = [int(a) % rank for a in axes] if axes is not None else list(range(rank))
    policy = attr(node, "keep_aspect_ratio_policy", "stretch")

    def stored(i):
        if len(ins) <= i or not ins[i].name:
            return None, False
        v = view.const_value(ins[i])
        if v is not None and v.size == 0:
            return None, False
        return v, True

    if opset < 11:
        scales_v, has_scales = stored(1)
        sizes_v, has_sizes = None, False
    else:
        scales_v, has_scales = stored(2)
        sizes_v, has_sizes = stored(3)
    src = "scales" if has_scales else "sizes"
    tensor = ins[1 if opset < 11 else (2 if has_scales else 3)] if (has_scales or has_sizes) else None
    value = scales_v if has_scales else sizes_v
    if tensor is None:
        raise NearMiss(f"'{label}' has neither scales nor sizes.")
    if value is None:
        # computed scales/sizes: usable only when the compiler folds them (static shapes) and the
        # output shape is known
        out = view.info(node.outputs[0]).shape
        if view.is_const(tensor) and out is not None and len(out) == 4 and all(isinstance(d, int) and d > 0 for d in out[1:]):
            full_out = [shape[0]] + [int(d) for d in out[1:]]
            scales = [1.0] + [float(o) / float(i) for o, i in zip(full_out[1:], shape[1:])]
            return list(shape), full_out, scales, f"{src} folded from static shapes"
        prod = view.producer(tensor)
        by = f", produced by {prod.op} '{prod.name}'" if prod is not None else ""
        raise NearMiss(f"'{label}' takes its {src} from the runtime tensor '{tensor.name}'{by}; NAF003 needs constant "
                       f"scales or sizes (pin the input shape and fold the shape computation, e.g. with onnxsim).")
    value = [float(v) for v in np.ravel(value)]
    if len(value) != len(axes):
        raise NearMiss(f"'{label}' has {len(value)} {src} for {len(axes)} axes.")
    if has_scales:
        scales = [1.0] * rank
        for a, v in zip(axes, value):
            scales[a] = v
        out_shape = [shape[0]] + [int(np.floor(shape[a] * scales[a])) for a in range(1, rank)]
    else:
        if policy != "stretch":
            raise NearMiss(f"'{label}' uses keep_aspect_ratio_policy '{policy}'; NAF003 supports 'stretch' only.")
        sizes = list(shape)
        for a, v in zip(axes, value):
            sizes[a] = int(v)
        out_shape = [shape[0]] + [int(d) for d in sizes[1:]]
        scales = [1.0] + [float(np.float32(o) / np.float32(i)) for o, i in zip(out_shape[1:], shape[1:])]
    return list(shape), out_shape, scales, src


@rewriter("bilinear_resize_to_conv_transpose", max_align_corners_step=4, rewrite_float=True)
def bilinear_resize_to_conv_transpose(match: Match, ed: Editor) -> RewriteResult:
    """Rebuilds a bilinear (linear) Resize of an NCHW tensor by integer factors as a depthwise
    ConvTranspose (group = channels, stride = factor) with a fixed separable triangular kernel, the
    border clamping reproduced by replicating the edge rows and columns with Slice + Concat (cropped by
    the ConvTranspose pads). stedgeai lowers a strided ConvTranspose with an inserted DepthToSpace: the
    rewrite applies only on a core that runs it as a hybrid epoch (3.x/4.x), never where it would be a
    SW epoch as well (2.x). align_corners is rebuilt when the output size is k*(in-1)+1, or with a
    strided Slice after the ConvTranspose when the sampling step (in-1)/(out-1) = p/q has p <=
    max_align_corners_step. A resize of single pixels (or an identity) becomes the nearest/asymmetric/
    floor Resize the NPU runs. In QDQ models the kernel is int8 with a scale that makes every weight
    exact, the edges are sliced on the int8 tensor, and the Resize's output quantization is kept."""
    node, view = match.node, match.view
    label = node_label(node)
    mode = attr(node, "mode", "nearest")
    if mode != "linear":
        raise NearMiss(f"'{label}' uses mode '{mode}'; NAF003 rebuilds bilinear (linear) Resize only.")
    opset = match.view.opset or 17  # no default-domain import: the newest nafix builds for
    ctm = attr(node, "coordinate_transformation_mode", "asymmetric" if opset < 11 else "half_pixel")
    if ctm not in SUPPORTED_MODES:
        raise NearMiss(f"'{label}' uses coordinate_transformation_mode '{ctm}'; NAF003 rebuilds "
                       f"{', '.join(SUPPORTED_MODES)}.")
    in_shape, out_shape, scales, src = _resize_geometry(match)
    if scales[0] != 1.0 or scales[1] != 1.0 or out_shape[1] != in_shape[1]:
        raise NearMiss(f"'{label}' resizes the batch or channel axis ({in_shape} -> {out_shape}); NAF003 rebuilds "
                       f"spatial (H, W) resizing only.")
    n_ch = int(in_shape[1])
    max_step = int(match.params.get("max_align_corners_step", 4))
    plans: list[AxisPlan] = []
    for ax, axis_name in ((2, "H"), (3, "W")):
        try:
            plans.append(plan_axis(ctm, int(in_shape[ax]), int(out_shape[ax]), scales[ax], max_step=max_step,
                                   axis=axis_name))
        except Inexact as exc:
            raise NearMiss(f"'{label}' {exc}.") from None
    ph, pw = plans
    what = f"{ctm}, {n_ch}x{ph.n}x{pw.n} -> {n_ch}x{ph.m}x{pw.m}" + (f", {src}" if "folded" in src else "")

    x, out = node.inputs[0], node.outputs[0]
    fdtype = np.dtype(x.dtype) if x.dtype is not None else np.dtype(np.float32)
    if fdtype.kind != "f":
        raise NearMiss(f"'{label}' resizes a {fdtype} tensor; NAF003 rebuilds float (or dequantized) tensors only.")

    # Quantized input: a DequantizeLinear with constant parameters feeds the Resize.
    dq = view.producer(x)
    quantized = dq is not None and dq.op == "DequantizeLinear"
    if quantized:
        try:
            qdq_params(view, dq)
        except ValueError:
            quantized = False
    if not quantized and not match.params.get("rewrite_float", True):
        raise NearMiss(f"'{label}' is a float Resize (its input does not come from a DequantizeLinear); quantize "
                       f"the model first.")

    if opset >= 11 and all(p.kind in ("copy", "box") for p in plans):
        return _as_nearest(node, ed, ph, pw, out_shape, fdtype, what)

    from ..npu.estimate import SW, lowering_hybrid_cores, lowering_note, lowering_unit

    if (ph.stride > 1 or pw.stride > 1) and lowering_unit(match.profile, "conv_transpose") == SW:
        inserts = match.profile.lowerings["conv_transpose"].inserts
        cores = lowering_hybrid_cores(match.profile, "conv_transpose")
        where = (f"; on a core that runs {' and '.join(inserts)} as hybrid epochs (--core {cores[0]} or later) the "
                 f"rewrite applies" if cores else "")
        raise NearMiss(f"'{label}': the depthwise ConvTranspose (stride {ph.stride}x{pw.stride}) replacing it would "
                       f"not leave SW: {lowering_note(match.profile, 'conv_transpose')} (NPU_FACTS.md#real-reports), so the SW "
                       f"Resize would become SW {' + '.join(inserts)} epochs plus HW epochs{where}.")
    limit = int(match.profile.limit("channel_chunk_max"))
    if not channel_split_ok(n_ch, limit):
        raise NearMiss(f"'{label}' has {n_ch} channels: the depthwise ConvTranspose replacing it would have {n_ch} "
                       f"output channels, which the NPU cannot split into equal chunks of <= {limit} (it would run "
                       f"in SW).")

    # The kernel: integer numerators over den = Dh * Dw.
    k_num = np.outer(np.array(ph.num, dtype=np.int64), np.array(pw.num, dtype=np.int64))
    den = ph.den * pw.den
    w_shape = [n_ch, 1, len(ph.num), len(pw.num)]
    if quantized:
        peak = int(k_num.max())
        if peak > INT8_MAX:
            raise NearMiss(
                f"'{label}' ({what}) needs bilinear weights that are multiples of 1/{den} up to {peak}/{den}, "
                f"which int8 weights cannot hold exactly (at most {INT8_MAX} levels); exact int8 kernels exist when "
                f"the H and W levels multiply to <= {INT8_MAX} (half_pixel factors up to 6 (odd ones up to 11), "
                f"asymmetric factors and align_corners strides up to 11).")
        e = 0
        while peak * 2 ** (e + 1) <= INT8_MAX:
            e += 1
        w_int = np.ascontiguousarray(np.broadcast_to((k_num * 2 ** e).astype(np.int8), w_shape))
        w_dq = ed.node("DequantizeLinear", [ed.const(w_int), ed.const(np.array(1.0 / (den * 2 ** e), np.float32)),
                                            ed.const(np.array(0, np.int8))], dtype=np.float32, shape=w_shape)
        weight = w_dq.outputs[0]
        kernel_text = f"int8 {w_shape[2]}x{w_shape[3]} kernel, scale 1/{den * 2 ** e}, exact"
    else:
        weight = ed.const(np.ascontiguousarray(np.broadcast_to((k_num / den).astype(fdtype), w_shape)))
        kernel_text = f"{w_shape[2]}x{w_shape[3]} kernel"

    # Edge replication (Slice + Concat), on the int8 tensor before its DequantizeLinear in QDQ models.
    ct_in = x
    if any(p.pad_begin or p.pad_end for p in plans):
        cur = dq.inputs[0] if quantized else x
        cur_dtype = cur.dtype if quantized else fdtype
        cur_shape = [in_shape[0], n_ch, ph.n, pw.n]
        for ax, p in ((2, ph), (3, pw)):
            if p.pad_begin or p.pad_end:
                cur, cur_shape = _replicate_edges(ed, cur, cur_shape, cur_dtype, ax, p.pad_begin, p.pad_end)
        if quantized:
            attrs = {"axis": dq.attrs["axis"]} if "axis" in dq.attrs else {}
            cur = ed.node("DequantizeLinear", [cur] + list(dq.inputs[1:]), attrs=attrs, dtype=np.float32,
                          shape=cur_shape).outputs[0]
        ct_in = cur

    ct_shape = [in_shape[0], n_ch, ph.full, pw.full]
    result = ed.node("ConvTranspose", [ct_in, weight], attrs={
        "group": n_ch,
        "kernel_shape": [len(ph.num), len(pw.num)],
        "strides": [ph.stride, pw.stride],
        "pads": [ph.crop_begin, pw.crop_begin, ph.crop_end, pw.crop_end],
    }, dtype=fdtype, shape=ct_shape).outputs[0]

    notes = []
    if ph.pad_begin or ph.pad_end or pw.pad_begin or pw.pad_end:
        notes.append("edge rows/columns replicated with Slice + Concat")
    if ph.step > 1 or pw.step > 1:
        result = _strided_slice(ed, result, out, [ph.step, pw.step], [ph.full, pw.full],
                                [in_shape[0], n_ch, ph.m, pw.m])
        notes.append(f"a strided Slice (step {ph.step}x{pw.step}) keeps the sampled rows/columns")
    ed.replace_uses(out, result)
    ed.remove(node)
    extra = f"; {', '.join(notes)}" if notes else ""
    return RewriteResult(detail=f"replaced bilinear Resize '{label}' ({what}) with a depthwise ConvTranspose "
                                f"(stride {ph.stride}x{pw.stride}, {kernel_text}){extra}")


def _as_nearest(node: ir.Node, ed: Editor, ph: AxisPlan, pw: AxisPlan, out_shape, fdtype, what: str) -> RewriteResult:
    """Every resized axis has one pixel (or is not resized): bilinear equals nearest."""
    x, out = node.inputs[0], node.outputs[0]
    roi = node.inputs[1] if len(node.inputs) > 1 else ir.Variable.empty()
    sh, sw = ph.m // ph.n, pw.m // pw.n
    scales = ed.const(np.array([1.0, 1.0, sh, sw], dtype=np.float32))
    new = ed.node("Resize", [x, roi, scales], attrs={
        "mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
        dtype=out.dtype or fdtype, shape=list(out_shape))
    ed.replace_uses(out, new.outputs[0])
    ed.remove(node)
    kind = "an identity" if ph.kind == pw.kind == "copy" else "a copy of single pixels"
    return RewriteResult(detail=f"bilinear Resize '{node_label(node)}' ({what}) is {kind}: replaced it with a "
                                f"nearest/asymmetric/floor Resize with scales {sh}x{sw}, which runs on the NPU")


def _replicate_edges(ed: Editor, t: ir.Tensor, shape: list, dtype, axis: int, before: int, after: int):
    """Concat(first row x before, t, last row x after) along ``axis``."""
    def row(i: int) -> ir.Tensor:
        shp = list(shape)
        shp[axis] = 1
        return ed.node("Slice", [t, ed.const(np.array([i], np.int64)), ed.const(np.array([i + 1], np.int64)),
                                 ed.const(np.array([axis], np.int64))], dtype=dtype, shape=shp).outputs[0]

    parts = [row(0)] * before if before else []
    parts.append(t)
    if after:
        parts += [row(int(shape[axis]) - 1)] * after
    new_shape = list(shape)
    new_shape[axis] = int(shape[axis]) + before + after
    return ed.node("Concat", parts, attrs={"axis": axis}, dtype=dtype, shape=new_shape).outputs[0], new_shape


def _strided_slice(ed: Editor, t: ir.Tensor, resize_out: ir.Tensor, steps: list, ends: list, shape: list) -> ir.Tensor:
    """Keep every ``steps``-th row/column of ``t`` (H, W). When the Resize's only reader is a
    QuantizeLinear, the Slice moves int8 data: ``t`` is quantized with that reader's parameters and
    dequantized again after the Slice (Q(DQ(q)) = q, so nothing changes numerically)."""
    readers = list(resize_out.outputs)
    q = readers[0] if len(readers) == 1 and readers[0].op == "QuantizeLinear" else None
    src = t
    if q is not None:
        src = ed.node("QuantizeLinear", [t] + list(q.inputs[1:]), attrs=dict(q.attrs), dtype=q.outputs[0].dtype,
                      shape=list(t.shape) if t.shape is not None else None).outputs[0]
    sl = ed.node("Slice", [src, ed.const(np.array([0, 0], np.int64)), ed.const(np.array(ends, np.int64)),
                           ed.const(np.array([2, 3], np.int64)), ed.const(np.array(steps, np.int64))],
                 dtype=src.dtype, shape=shape).outputs[0]
    if q is None:
        return sl
    attrs = {"axis": q.attrs["axis"]} if "axis" in q.attrs else {}
    return ed.node("DequantizeLinear", [sl] + list(q.inputs[1:]), attrs=attrs, dtype=np.float32, shape=shape).outputs[0]
