"""Re-quantization rewrites: change quantization parameters where the NPU compiler needs another form."""

from __future__ import annotations

import numpy as np

from . import Match, NearMiss, RewriteResult, per_tensor_qparams, quoted, rewriter


_q = quoted


@rewriter("zero_point_output")
def zero_point_output(match: Match, ed) -> RewriteResult:
    """Re-quantizes the node's output with zero-point 0: the QuantizeLinear after it, and every
    DequantizeLinear reading that QuantizeLinear, get the smallest symmetric scale that covers the same
    calibrated range (arithmetic on the existing parameters, no new calibration). Values move to the
    new grid, so the result is verified with a tolerance; with a one-sided range (after a ReLU) the
    resolution halves."""
    from ..quantize import symmetric_output_params

    node, view = match.node, match.view
    out = node.outputs[0]
    readers = list(out.outputs)
    qs = [c for c in readers if c.op == "QuantizeLinear"]
    if len(qs) != 1 or len(readers) != 1 or view.is_graph_output(out):
        raise NearMiss(f"{_q(node)} output is not read by exactly one QuantizeLinear.")
    q = qs[0]
    scale, zp = per_tensor_qparams(view, node, q, " output is quantized per axis; only per-tensor outputs are re-quantized.")
    if int(zp.reshape(-1)[0]) == 0:
        raise NearMiss(f"{_q(node)} output already has zero-point 0.")
    if np.dtype(zp.dtype) != np.int8:
        raise NearMiss(f"{_q(node)} output is {np.dtype(zp.dtype).name}; convert uint8 to int8 first (nafix --quantize).")
    qout = q.outputs[0]
    dqs = list(qout.outputs)
    if view.is_graph_output(qout) or any(c.op != "DequantizeLinear" for c in dqs):
        raise NearMiss(f"{_q(node)}: its quantized output is read by other than DequantizeLinear nodes.")
    new_scale, new_zp = symmetric_output_params(scale.reshape(()), zp.reshape(()))
    s_c = ed.const(np.asarray(new_scale, np.float32).reshape(()), base=f"{node.name}_sym_scale")
    z_c = ed.const(np.asarray(new_zp, np.int8).reshape(()), base=f"{node.name}_sym_zero_point")
    for n in [q] + dqs:
        n.inputs[1] = s_c
        if len(n.inputs) > 2:
            n.inputs[2] = z_c
        else:
            n.inputs.append(z_c)
    old_s, old_z = float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0])
    return RewriteResult(
        detail=(f"re-quantized {_q(node)} output from (scale {old_s:.6g}, zero-point {old_z}) to (scale "
                f"{float(new_scale):.6g}, zero-point 0) covering the same range"),
        boundary=False,
    )
