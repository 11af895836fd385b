"""Rewriters of the ``qdq`` family: int8 graph edges (NAF004 outputs, NAF005 input).

A QuantizeLinear on a float graph input and a DequantizeLinear producing a float graph output run in
SW on the Cortex-M55 (NPU_FACTS.md#operators, QuantizeLinear/DequantizeLinear row, OBS). Both are pure
interface conversions: the application can quantize its input and dequantize its outputs itself
(or stedgeai's ``--input-data-type`` / ``--output-data-type``), so these rewriters move them out of
the graph and record the scale/zero-point as an :class:`~fixer.rewriters.IoChange`.
"""

from __future__ import annotations

import numpy as np
from .. import ir

from ..graph import Editor, GraphView, node_label, qdq_params, rewire
from . import IoChange, Match, NearMiss, RewriteResult, rewriter

#: Ops that only move data: exact on int8 data with a per-tensor scale/zero-point.
MOVE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"})
_INT8 = {"int8": np.int8, "uint8": np.uint8}


def _q(node: ir.Node) -> str:
    return f"'{node_label(node)}'"


def _is_output(ed: Editor, t: ir.Tensor) -> bool:
    return any(o is t for o in ed.graph.outputs)


def _prune(ed: Editor, t: ir.Tensor) -> None:
    """Disconnect the data-movement nodes hanging off ``t`` whose results nothing reads any more, so
    later rewrites in the same engine round do not see them as readers."""
    for c in list(t.outputs):
        if c.op in MOVE_OPS and c.outputs:
            out = c.outputs[0]
            _prune(ed, out)
            if not out.outputs and not _is_output(ed, out):
                ed.remove(c)


def _per_tensor(view: GraphView, node: ir.Node) -> tuple[float, int, np.dtype]:
    """(scale, zero_point, integer dtype) of a per-tensor Q/DQ, or NearMiss."""
    try:
        scale, zp, _axis = qdq_params(view, node)
    except ValueError as exc:
        raise NearMiss(f"{_q(node)} has quantization parameters that are not constants ({exc}).") from None
    if scale.size != 1:
        raise NearMiss(
            f"{_q(node)} is quantized per axis ({scale.size} scales on axis {node.attrs.get('axis', 1)}); "
            "an int8 graph edge needs one scale and zero-point for the application to convert with.")
    return float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]), np.dtype(zp.dtype)


def _name_of_dtype(dt: np.dtype) -> str:
    return np.dtype(dt).name


def _offset(var: str, zp: int, sign: int = -1) -> str:
    """'q - 5' / 'q + 128' for sign -1; 'x + 5' / 'x - 128' for sign +1."""
    v = sign * zp
    return var if v == 0 else f"{var} {'+' if v > 0 else '-'} {abs(v)}"


# ------------------------------------------------------------------------------------------------
# NAF004: trailing DequantizeLinear
# ------------------------------------------------------------------------------------------------


def _reaches_output(view: GraphView, ed: Editor, t: ir.Tensor, depth: int = 0) -> bool:
    if depth > 16:
        return False
    if _is_output(ed, t):
        return True
    return any(c.op in MOVE_OPS and c.outputs and _reaches_output(view, ed, c.outputs[0], depth + 1)
               for c in t.outputs)


@rewriter("int8_graph_output")
def int8_graph_output(match: Match, ed: Editor) -> RewriteResult:
    """Drops a DequantizeLinear that produces a graph output: the graph output becomes the int8 tensor
    it dequantized, under the same output name (data movement between the DequantizeLinear and the
    output - Reshape, Flatten, Squeeze, Unsqueeze, Transpose - is re-applied to the int8 data, which
    is exact). Other readers of the float tensor keep a DequantizeLinear. The scale and zero-point are
    recorded so the application dequantizes: float = (q - zero_point) * scale."""
    view, dq = match.view, match.node
    q, y = dq.inputs[0], dq.outputs[0]
    scale, zp, qdt = _per_tensor(view, dq)
    if qdt != np.int8:
        raise NearMiss(
            f"{_q(dq)} dequantizes a {qdt.name} tensor; the NPU takes int8 activations only, so re-quantize "
            "the model to int8 before making its outputs int8.")
    if view.is_const_like(q):
        raise NearMiss(f"{_q(dq)} dequantizes a constant, not an activation.")
    if view.is_graph_input(q):
        raise NearMiss(f"{_q(dq)} dequantizes the graph input '{q.name}' straight into an output; there is no NPU work to keep.")
    if not _reaches_output(view, ed, y):
        raise NearMiss(f"{_q(dq)} does not reach a graph output through data movement only.")

    # -- build: the int8 twin of every float tensor on the way to a graph output ---------------------
    if q.dtype is None:
        q.dtype = np.int8
    if q.shape is None and y.shape is not None:
        q.shape = y.shape
    replaced: list[tuple[ir.Tensor, ir.Tensor]] = []  # (float graph output, its int8 twin)
    moved: list[str] = []

    def twin(t_float: ir.Tensor, t_int8: ir.Tensor) -> None:
        if _is_output(ed, t_float):
            replaced.append((t_float, t_int8))
        for c in list(t_float.outputs):
            if c.op in MOVE_OPS and c.outputs and _reaches_output(view, ed, c.outputs[0]):
                out = c.outputs[0]
                n = ed.node(c.op, [t_int8] + list(c.inputs[1:]), attrs=dict(c.attrs), dtype=np.int8, shape=out.shape)
                moved.append(f"{c.op} '{c.name}'")
                twin(out, n.outputs[0])

    twin(y, q)
    changes = []
    for old, new in replaced:
        name = old.name
        if old.outputs:
            # Float readers of the old output keep their value through a copy of its producer.
            prod = old.inputs[0]
            keep = ed.node(prod.op, list(prod.inputs), attrs=dict(prod.attrs), dtype=old.dtype, shape=old.shape)
            rewire(old, keep.outputs[0])
        if _is_output(ed, new) or view.is_graph_input(new):
            new = ed.node("Identity", [new], dtype=np.int8, shape=old.shape).outputs[0]
        ed.replace_uses(old, new)
        changes.append(IoChange(kind="output", name=name, dtype="int8", scale=scale, zero_point=zp,
                                was=_name_of_dtype(old.dtype) if old.dtype is not None else "float32"))
    _prune(ed, y)
    if not y.outputs and not _is_output(ed, y):
        ed.remove(dq)
    names = ", ".join(f"'{c.name}'" for c in changes)
    via = f", re-applying {', '.join(moved)} on the int8 data" if moved else ""
    detail = (f"dropped DequantizeLinear {_q(dq)}: graph output {names} is now int8 (scale {scale:.6g}, "
              f"zero-point {zp}){via}; dequantize in the application as "
              f"{'q' if zp == 0 else '(' + _offset('q', zp) + ')'} * {scale:.6g}")
    return RewriteResult(detail=detail, io_changes=changes)


# ------------------------------------------------------------------------------------------------
# NAF005: leading QuantizeLinear
# ------------------------------------------------------------------------------------------------


@rewriter("int8_graph_input", input_type="int8")
def int8_graph_input(match: Match, ed: Editor) -> RewriteResult:
    """Removes the QuantizeLinear on a float graph input: the input (same name, same shape) becomes the
    int8 tensor the QuantizeLinear produced, quantized by the application with the recorded scale and
    zero-point (round half to even, saturate). A float Transpose/Reshape prologue before the
    QuantizeLinear is moved after it, onto the int8 data (exact: data movement commutes with a
    per-tensor quantization). With input type uint8 (camera frames) the input is uint8 with
    zero-point + 128, and every DequantizeLinear that read the int8 tensor reads the uint8 input
    with its zero-point + 128 instead: (u - (zp + 128)) * s = (q - zp) * s, so every op after it sees
    bit-identical values and the int8 domain inside the model is unchanged."""
    view, qn = match.view, match.node
    x, qout = qn.inputs[0], qn.outputs[0]
    scale, zp, qdt = _per_tensor(view, qn)
    want_name = str(match.options.get("input_type") or match.params.get("input_type") or "int8")
    if want_name not in _INT8:
        raise NearMiss(f"input type '{want_name}' is not supported for {_q(qn)} (use int8 or uint8).")
    want = np.dtype(_INT8[want_name])
    if qdt not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise NearMiss(f"{_q(qn)} quantizes to {qdt.name}; only 8-bit graph inputs are supported.")

    # -- the float prologue: graph input -> (Transpose/Reshape/...)* -> x -----------------------------
    prologue: list[ir.Node] = []
    t = x
    while not view.is_graph_input(t):
        p = view.producer(t)
        if p is None or p.op not in MOVE_OPS:
            what = f"{p.op} '{p.name}'" if p is not None else f"'{t.name}'"
            raise NearMiss(f"{_q(qn)} quantizes '{x.name}', which comes from {what}, not from a graph input through data movement only.")
        readers = len(t.outputs) + (1 if view.is_graph_output(t) else 0)
        if readers != 1:
            raise NearMiss(f"{_q(qn)}: the prologue tensor '{t.name}' is also read by other nodes or is a graph output; they need the float data.")
        prologue.insert(0, p)
        t = p.inputs[0]
    g = t
    if g.dtype is not None and np.dtype(g.dtype).kind != "f":
        raise NearMiss(f"{_q(qn)}: graph input '{g.name}' is already {np.dtype(g.dtype).name}.")
    readers = len(g.outputs) + (1 if view.is_graph_output(g) else 0)
    if readers != 1:
        others = [f"'{c.name}'" for c in g.outputs if c is not (prologue[0] if prologue else qn)]
        raise NearMiss(
            f"{_q(qn)}: graph input '{g.name}' also feeds {', '.join(others) or 'a graph output'} in float; "
            "an int8 input would change what they read.")
    if view.is_graph_output(qout):
        raise NearMiss(f"{_q(qn)} produces a graph output directly; there is no NPU work to feed.")
    shift = 0
    if want != qdt:
        shift = 128 if want == np.uint8 else -128
        if prologue:
            raise NearMiss(
                f"{_q(qn)}: a {want.name} input with a float prologue ({', '.join(p.op for p in prologue)}) would put "
                f"{want.name} activations inside the model (stedgeai rejects unsigned activations); use input type "
                f"{qdt.name}, or remove the prologue.")
        bad = [c for c in qout.outputs if c.op != "DequantizeLinear"]
        if bad:
            raise NearMiss(f"{_q(qn)} feeds {bad[0].op} '{bad[0].name}' directly; a {want.name} input needs a "
                           "DequantizeLinear reader to absorb the zero-point shift.")
        dq_params = [(c, *_per_tensor(view, c)) for c in qout.outputs]

    # -- build ------------------------------------------------------------------------------------
    new_in = ir.Variable(g.name, dtype=want.type, shape=list(g.shape) if g.shape is not None else None)
    g.name = ed.name(g.name + "_float")
    idx = next(i for i, t in enumerate(ed.graph.inputs) if t is g)
    ed.graph.inputs[idx] = new_in
    cur = new_in
    moved = []
    for p in prologue:
        out = p.outputs[0]
        cur = ed.node(p.op, [cur] + list(p.inputs[1:]), attrs=dict(p.attrs), dtype=want.type, shape=out.shape).outputs[0]
        moved.append(f"{p.op} '{p.name}'")
    if shift == 0:
        ed.replace_uses(qout, cur)
    else:
        for c, s, z, _dt in dq_params:
            zc = ed.const(np.array(z + shift, dtype=want.type), base=c.name)
            sc = ed.const(np.array(s, dtype=np.float32), base=c.name)
            out = c.outputs[0]
            new = ed.node("DequantizeLinear", [cur, sc, zc], dtype=out.dtype or np.float32, shape=out.shape)
            ed.replace_uses(out, new.outputs[0])
            ed.remove(c)
    ed.remove(qn)
    for p in prologue:
        ed.remove(p)
    zp_new = zp + shift
    io = IoChange(kind="input", name=new_in.name, dtype=want.name, scale=scale, zero_point=zp_new,
                  was=_name_of_dtype(g.dtype) if g.dtype is not None else "float32")
    via = f", moving {', '.join(moved)} onto the {want.name} data" if moved else ""
    shifted = (f"; the DequantizeLinear after it reads it with zero-point {zp_new} = {zp} {'+' if shift > 0 else '-'} 128, "
               f"so the {qdt.name} values inside are unchanged") if shift else ""
    detail = (f"removed QuantizeLinear {_q(qn)}: graph input '{new_in.name}' is now {want.name} (scale {scale:.6g}, "
              f"zero-point {zp_new}){via}{shifted}; quantize in the application as "
              f"clip({_offset(f'round_half_even(x / {scale:.6g})', zp_new, +1)}, {np.iinfo(want).min}, {np.iinfo(want).max})")
    return RewriteResult(detail=detail, io_changes=[io])
