"""Dilated convolutions (NAF015): the same Conv with the zeros of the dilation written into its kernel.

A Conv with dilation ``d`` along an axis reads every ``d``-th input position under a kernel of ``k``
taps; a Conv with dilation 1 and the kernel ``(k - 1) * d + 1`` wide, its taps at ``0, d, 2d, ...``
and zeros between them, reads the same positions with the same weights: same padding, same
strides, same output. In a QDQ model the inserted taps hold the weight's zero-point, so they
dequantize to exactly 0 and the integer result is unchanged.
"""

from __future__ import annotations

import numpy as np

from ..graph import Editor, QuantWeight, node_label, read_weight
from . import Match, NearMiss, RewriteResult, rewriter


def _q(node) -> str:
    return f"'{node_label(node)}'"


def dilate_kernel(values: np.ndarray, dilations: list[int], fill) -> np.ndarray:
    """``values`` [O, I/g, k1, ..., kn] with ``fill`` inserted between taps: [O, I/g, (k1-1)*d1+1, ...].
    ``fill`` is a scalar or one value per output channel (a per-channel zero-point)."""
    spatial = values.shape[2:]
    new_shape = values.shape[:2] + tuple((k - 1) * d + 1 for k, d in zip(spatial, dilations))
    fill = np.asarray(fill, dtype=values.dtype)
    if fill.ndim == 0:
        out = np.full(new_shape, fill, dtype=values.dtype)
    else:
        out = np.empty(new_shape, dtype=values.dtype)
        out[...] = fill.reshape((-1,) + (1,) * (len(new_shape) - 1))
    index = (slice(None), slice(None)) + tuple(slice(None, None, d) for d in dilations)
    out[index] = values
    return out


def _kernel_limits(match: Match, kernel: tuple[int, ...], strides: list[int]) -> tuple[int, int]:
    """(max rows, max columns) a kernel may have after the rewrite: the profile's native limits times
    the rule's ``max_native_multiple`` (kernels past the native size are decomposed into HW passes)."""
    mult = int(match.params.get("max_native_multiple", 2))
    prof = match.profile
    sw_ = int(strides[-1]) if strides else 1
    wmax = prof.limit("conv_kernel_w_native_stride1" if sw_ == 1 else "conv_kernel_w_native_stride2")
    return int(prof.limit("conv_kernel_h_native")) * mult, int(wmax) * mult


@rewriter("undilate_conv", max_native_multiple=2)
def undilate_conv(match: Match, ed: Editor) -> RewriteResult:
    """Rewrites a dilated Conv (1-D or 2-D, regular, grouped or depthwise, float or QDQ) into a
    Conv with dilation 1 whose constant kernel has the dilation's zeros inserted between its taps
    (kernel (k - 1) * d + 1 per axis; in a QDQ model the inserted taps hold the weight's zero-point,
    so they dequantize to exactly 0 and the result is bit-exact). Applies when the new kernel stays
    within `max_native_multiple` times the profile's native kernel size (conv_kernel_h_native rows,
    conv_kernel_w_native_stride1 columns at stride 1, conv_kernel_w_native_stride2 at stride >= 2),
    beyond which the compiler would decompose it into too many HW passes."""
    node, view = match.node, match.view
    if node.op != "Conv":
        raise NearMiss(f"{_q(node)} is a {node.op}; only Conv dilations are written into the kernel.")
    w = read_weight(view, node.inputs[1]) if len(node.inputs) > 1 else None
    if w is None:
        raise NearMiss(f"{_q(node)} reads computed weights; nafix writes the dilation only into a constant "
                       f"kernel (directly or through one DequantizeLinear).")
    vals = np.asarray(w.values)
    nsp = vals.ndim - 2
    if nsp not in (1, 2):
        raise NearMiss(f"{_q(node)} is a {nsp}-D convolution; the NPU runs 1-D and 2-D ones.")
    dil = [int(d) for d in node.attrs.get("dilations", [1] * nsp)]
    if all(d == 1 for d in dil):
        raise NearMiss(f"{_q(node)} is not dilated.")
    if w.quantized and w.axis is not None and np.asarray(w.scale).size > 1 and w.axis != 0:
        raise NearMiss(f"{_q(node)} quantizes its weights along axis {w.axis}; nafix handles per-output-channel "
                       f"(axis 0) or per-tensor weights.")
    strides = [int(s) for s in node.attrs.get("strides", [1] * nsp)]
    old_k = tuple(int(k) for k in vals.shape[2:])
    new_k = tuple((k - 1) * d + 1 for k, d in zip(old_k, dil))
    hmax, wmax = _kernel_limits(match, new_k, strides)
    kh, kw = (1, new_k[0]) if nsp == 1 else new_k
    if kh > hmax or kw > wmax:
        ks = "x".join(map(str, new_k))
        raise NearMiss(f"{_q(node)} with dilations {dil} would need a {ks} kernel, beyond the {hmax}x{wmax} "
                       f"nafix allows ({match.params.get('max_native_multiple', 2)}x the profile's native "
                       f"kernel size); the compiler's SpaceToDepth -> Conv -> DepthToSpace lowering stays.")
    if w.quantized:
        zp = np.asarray(w.zero_point)
        fill = zp.reshape(-1) if zp.size > 1 else zp.reshape(()).astype(vals.dtype)
        new_vals = dilate_kernel(vals, dil, fill)
        dq = w.dq
        attrs = dict(dq.attrs)
        new_w = ed.node("DequantizeLinear", [ed.const(new_vals, node.name + "_kernel_quantized")] + list(dq.inputs[1:]),
                        attrs=attrs, dtype=np.float32, shape=list(new_vals.shape)).outputs[0]
    else:
        new_vals = dilate_kernel(vals, dil, 0)
        new_w = ed.const(new_vals, node.name + "_kernel")
    attrs = dict(node.attrs)
    attrs["dilations"] = [1] * nsp
    attrs["kernel_shape"] = list(new_k)
    out = node.outputs[0]
    inputs = list(node.inputs)
    inputs[1] = new_w
    ed.remove(node)
    ed.node("Conv", inputs, outputs=[out], attrs=attrs)
    kind = "depthwise " if int(node.attrs.get("group", 1)) > 1 and vals.shape[1] == 1 else ""
    zero = "the weight zero-point (dequantizes to 0)" if w.quantized else "zeros"
    return RewriteResult(detail=f"rewrote {kind}Conv {_q(node)} with dilations {dil} as a dilation-1 Conv with a "
                                f"{'x'.join(map(str, new_k))} kernel ({'x'.join(map(str, old_k))} taps, {zero} between them)")
