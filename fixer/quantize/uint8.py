"""Exact uint8 -> int8 conversion of a QDQ model (:func:`convert_uint8_to_int8`) and the symmetric
parameters covering an already calibrated range (:func:`symmetric_output_params`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import onnx
from onnx import TensorProto

from .. import ir
from ..errors import UsageError
from ..graph import Editor, attr, const_value, gc_paused, qparams, rewire, unique_node_names
from .checks import WEIGHT_OPS, _weight_axis
from .modelproto import _clamp_ir, _export, _keep_initializer_order
from .ort import MIN_PER_CHANNEL_OPSET

#: Ops that move int8 values without arithmetic: a uint8 -> int8 shift passes through them exactly.
EXACT_SHIFT_OPS = frozenset({
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Slice", "Split", "Concat",
    "Gather", "MaxPool", "DepthToSpace", "SpaceToDepth", "Tile", "Expand", "Pad", "Resize",
})


@dataclass
class Uint8Conversion:
    """The converted model and what changed. Unpacks as ``model, changes = convert_uint8_to_int8(m)``.

    ``io_changes``: graph edges whose type changed (only with ``io="int8"``), as
    :class:`fixer.rewriters.IoChange`; ``weight_errors``: per re-quantized weight, the max abs
    difference between the old and new dequantized values; ``exact``: True when only activations
    (and exactly shifted constants) changed, so every output is bit-identical.
    """

    model: onnx.ModelProto
    changes: list[str]
    io_changes: list = field(default_factory=list)
    weight_errors: dict[str, float] = field(default_factory=dict)
    shifted_tensors: int = 0
    warnings: list[str] = field(default_factory=list)
    new_constants: list[str] = field(default_factory=list)  # names of the constants made, in order

    @property
    def max_weight_error(self) -> float:
        return max(self.weight_errors.values(), default=0.0)

    @property
    def exact(self) -> bool:
        return not self.weight_errors

    def __iter__(self):
        return iter((self.model, self.changes))

    def as_dict(self) -> dict:
        return {"changes": list(self.changes), "shifted_tensors": self.shifted_tensors,
                "requantized_weights": len(self.weight_errors), "max_weight_error": self.max_weight_error,
                "exact": self.exact, "io_changes": [dataclasses.asdict(c) for c in self.io_changes],
                "warnings": list(self.warnings)}


def convert_uint8_to_int8(model: onnx.ModelProto, *, io: str = "keep", requantize_weights: bool = True,
                          model_name: str = "the model") -> Uint8Conversion:
    """Make every interior activation int8 exactly, and (by default) every weight int8 symmetric per channel.

    Activations: each uint8 QuantizeLinear/DequantizeLinear pair gets zero-point ``zp - 128`` with the
    same scale, and the tensors between them (through data movement, MaxPool, ...) become int8: the
    int8 value is the uint8 value minus 128, so every dequantized value is unchanged and outputs are
    bit-identical. ``io="keep"`` (default) keeps uint8 graph edges (stedgeai converts them with
    ``--input-data-type`` / ``--output-data-type``): a uint8 input read directly by
    DequantizeLinear stays as it is, one read through data movement gets an exact
    DequantizeLinear -> QuantizeLinear(int8) right after it, a uint8 output written by anything but
    a QuantizeLinear gets the reverse conversion. ``io="int8"`` makes those edges int8 too (the
    caller feeds ``x - 128``; recorded in ``io_changes``).

    Weights: uint8 (or asymmetric int8) weights of Conv/ConvTranspose/Gemm/MatMul and PRelu slopes
    are re-quantized to symmetric int8 per output channel (scale = max|w| / 127 per channel, the
    arithmetic of onnxruntime's symmetric weight quantization on the already dequantized weight),
    and the int32 bias of the same node to ``input_scale * weight_scale``. This changes numerics
    slightly: ``weight_errors`` gives the max abs weight error per tensor. With
    ``requantize_weights=False`` uint8 weights are shifted exactly like activations instead (an
    asymmetric int8 weight the NPU still rejects, but a bit-exact model). Other uint8 constants
    (e.g. an Add operand) are always shifted exactly.
    """
    if io not in ("keep", "int8"):
        raise UsageError(f"the uint8 interface mode must be keep or int8, not '{io}'.")
    with gc_paused():
        graph = ir.import_onnx(model)
    unique_node_names(graph.nodes)
    ed = Editor(graph, rule_id="uint8_to_int8", anchor=None, provenance={})
    conv = convert_uint8_graph(graph, ed, _tensor_types(model), io=io, requantize_weights=requantize_weights,
                               model_name=model_name)
    if conv.changes:
        graph.cleanup()
    out = _export(graph, model)
    _keep_initializer_order(out, [t.name for t in model.graph.initializer] + conv.new_constants)
    if conv.changes:
        _clamp_ir(out)
    conv.model = out
    return conv


def convert_uint8_graph(graph: ir.Graph, ed: Editor, types: dict[str, int], *, io: str = "keep",
                        requantize_weights: bool = True, model_name: str = "the model") -> Uint8Conversion:
    """:func:`convert_uint8_to_int8` on nafix's graph, edited in place (``model`` of the result is
    None): new tensors and nodes are named by ``ed``; ``types``: element types by tensor name
    (:func:`_tensor_types`). A :class:`UsageError` is raised before anything is changed. Dead nodes
    are left for the caller's cleanup."""
    from ..rewriters import IoChange

    gr = _Index(graph, ed)
    changes: list[str] = []
    warnings: list[str] = []
    io_changes: list = []
    weight_errors: dict[str, float] = {}

    # --- 1. find the uint8 activation region ---------------------------------------------------
    region: set[str] = set()  # tensors whose uint8 values become int8 (value - 128)
    dq_in: set[str] = set()  # DequantizeLinear nodes reading the region
    q_out: set[str] = set()  # QuantizeLinear nodes writing the region
    stack: list[ir.Tensor] = []
    for n in graph.nodes:
        if n.op == "QuantizeLinear" and not gr.is_const(n.inputs[0]):
            _, z = gr.qparams(n)
            if z is not None and z.dtype == np.uint8:
                stack.append(n.outputs[0])
    u8_inputs = [t for t in graph.inputs if type(t) is not ir.Constant and types.get(t.name) == TensorProto.UINT8]
    input_bridges: list[ir.Tensor] = []
    for t in u8_inputs:
        if not _reaches_dequantize(t):
            continue  # a uint8 input that is not quantized data (e.g. indices); leave it
        direct = all(c.op == "DequantizeLinear" for c in t.outputs)
        if io == "keep" and direct:
            continue
        if io == "keep":
            input_bridges.append(t)  # bridged below once the region is known
        stack.append(t)
    while stack:
        t = stack.pop()
        if t.name in region:
            continue
        region.add(t.name)
        for c in t.outputs:
            if c.op == "DequantizeLinear":
                if c.inputs[0] is t:
                    dq_in.add(c.name)
                continue
            if c.op in EXACT_SHIFT_OPS and c.inputs[0] is t or (c.op == "Concat"):
                if c.op == "Resize" and attr(c, "mode", "nearest") != "nearest":
                    raise UsageError(f"{model_name}: '{c.name}' (Resize, {attr(c, 'mode').encode()!r}) interpolates uint8 "
                                     "values; nafix can shift uint8 to int8 exactly only through data movement.")
                stack.extend(o for o in c.outputs if o.name)
                continue
            raise UsageError(f"{model_name}: '{c.name}' ({c.op}) computes on the uint8 tensor '{t.name}'; nafix "
                             "converts uint8 activations exactly only in QDQ models where uint8 tensors pass "
                             "between QuantizeLinear and DequantizeLinear through data movement.")
    for n in graph.nodes:
        if n.op == "QuantizeLinear" and n.outputs[0].name in region:
            q_out.add(n.name)
    u8_weights = _uint8_or_asym_weights(graph, gr)
    shift_consts = _uint8_plain_constants(graph, gr, exclude={w.name for w, _ in u8_weights} if requantize_weights else set())
    if not region and not u8_weights and not shift_consts:
        return Uint8Conversion(None, [], warnings=["the model has no uint8 tensor"])
    outputs = [t for t in graph.outputs if t.name in region]
    producers = {t.name: t.inputs[0] if t.inputs else None for t in outputs}
    # everything that can refuse the model is decided before the first change
    in_params = {t.name: _first_dq_params(t, gr, model_name) for t in (input_bridges if io == "keep" else
                                                                         [t for t in u8_inputs if t.name in region])}
    out_params = {t.name: _last_q_params(t, gr, model_name) for t in outputs
                  if io == "int8" or producers[t.name] is None or producers[t.name].name not in q_out}
    for n in graph.nodes:
        if n.name in dq_in or n.name in q_out:
            gr.check_uint8_zp(n, model_name)
    for c in shift_consts:
        for dq in c.outputs:
            if dq.op == "DequantizeLinear" and dq.inputs[0] is c:
                gr.check_uint8_zp(dq, model_name)

    # --- 2. keep-mode interface: bridges at uint8 inputs and outputs ----------------------------
    bridges: set[str] = set()  # nodes nafix adds at kept uint8 edges (already int8 on the inside)
    if io == "keep":
        for t in input_bridges:
            name = t.name
            s, z, axis = in_params[name]
            new = ir.Variable(ed.name(name + "_int8"))
            rewire(t, new)
            dq_out = ir.Variable(ed.name(name + "_dequantized"))
            s_c = gr.add_init(name + "_scale", s)
            z_c = gr.add_init(name + "_zero_point", z)
            z8_c = gr.add_init(name + "_zero_point_int8", (z.astype(np.int16) - 128).astype(np.int8))
            attrs = {"axis": axis} if axis is not None else {}
            dq = ed.node("DequantizeLinear", [t, s_c, z_c], [dq_out], attrs, base=name + "_DequantizeLinear", at=0)
            q = ed.node("QuantizeLinear", [dq_out, s_c, z8_c], [new], attrs, base=name + "_QuantizeLinear", at=1)
            bridges.update((q.name, dq.name))
            region.discard(name)
            region.add(new.name)
            types[new.name] = TensorProto.INT8
            changes.append(f"uint8 input '{name}' kept; an exact DequantizeLinear -> QuantizeLinear(int8) "
                           f"bridge feeds its data-movement consumers")
        for t in outputs:
            out = t.name
            p = producers[out]
            if p is not None and p.name in q_out:
                q_out.discard(p.name)  # a QuantizeLinear writing the output directly keeps uint8
                region.discard(out)
                continue
            s, z, axis = out_params[out]
            inner = ir.Variable(ed.name(out + "_int8"))
            rewire(t, inner)
            for k, o in enumerate(p.outputs):
                if o is t:
                    p.outputs[k] = inner
            region.discard(out)
            region.add(inner.name)
            s_c = gr.add_init(out + "_scale", s)
            z_c = gr.add_init(out + "_zero_point", z)
            z8_c = gr.add_init(out + "_zero_point_int8", (z.astype(np.int16) - 128).astype(np.int8))
            deq = ir.Variable(ed.name(out + "_dequantized"))
            attrs = {"axis": axis} if axis is not None else {}
            bdq = ed.node("DequantizeLinear", [inner, s_c, z8_c], [deq], attrs, base=out + "_DequantizeLinear")
            bq = ed.node("QuantizeLinear", [deq, s_c, z_c], [t], attrs, base=out + "_QuantizeLinear")
            bridges.update((bdq.name, bq.name))
            changes.append(f"uint8 output '{out}' kept; an exact DequantizeLinear -> QuantizeLinear(uint8) bridge writes it")
        dq_in = {n.name for n in graph.nodes
                 if n.op == "DequantizeLinear" and n.inputs[0].name in region and n.name not in bridges}
        q_out = {n.name for n in graph.nodes
                 if n.op == "QuantizeLinear" and n.outputs[0].name in region and n.name not in bridges}

    if io == "int8":  # recorded before the zero-points below are shifted
        for t in u8_inputs:
            if t.name in region:
                s, z, _ = in_params[t.name]
                io_changes.append(IoChange("input", t.name, "int8", _scalar_or_list(s),
                                           _scalar_or_list(z.astype(np.int16) - 128), was="uint8"))
        for t in outputs:
            s, z, _ = out_params[t.name]
            io_changes.append(IoChange("output", t.name, "int8", _scalar_or_list(s),
                                       _scalar_or_list(z.astype(np.int16) - 128), was="uint8"))

    # --- 3. shift zero-points of the region's Q/DQ ----------------------------------------------
    zp_cache: dict[tuple[str, int], ir.Constant] = {}

    def shifted_zp(node: ir.Node) -> ir.Constant:
        s, z = gr.qparams(node)
        key = (node.inputs[2].name if len(node.inputs) > 2 else "", int(np.size(s)))
        if key not in zp_cache:
            zp_cache[key] = gr.add_init((key[0] or node.name) + "_int8", (z.astype(np.int16) - 128).astype(np.int8))
        return zp_cache[key]

    for n in graph.nodes:
        if n.name in dq_in or n.name in q_out:
            _set_input(n, 2, shifted_zp(n))
    for n in graph.nodes:  # Pad's constant value in the region shifts too
        if n.op == "Pad" and n.inputs[0].name in region and len(n.inputs) > 2 and n.inputs[2].name:
            v = gr.value(n.inputs[2])
            if v is not None and v.dtype == np.uint8:
                n.inputs[2] = gr.add_init(n.inputs[2].name + "_int8", (v.astype(np.int16) - 128).astype(np.int8))
    int8 = ir.np_dtype(TensorProto.INT8)
    for t in graph.tensors().values():
        if t.name in region and type(t) is ir.Variable and t.dtype is not None:
            t.dtype = int8
    n_q, n_dq = len(q_out), len(dq_in)
    if region:
        changes.append(f"{len(region)} uint8 activation tensor(s) made int8 exactly (zero-point - 128, same scale) "
                       f"across {n_q} QuantizeLinear and {n_dq} DequantizeLinear")

    # --- 4. constants: exact shift or symmetric per-channel re-quantization ---------------------
    u8_weight_names = {w.name for w, _ in u8_weights}
    plain = [c for c in shift_consts if c.name not in u8_weight_names]
    for c in shift_consts:
        v = gr.value(c)
        new_v = gr.add_init(c.name + "_int8", (v.astype(np.int16) - 128).astype(np.int8))
        for dq in [d for d in c.outputs if d.op == "DequantizeLinear" and d.inputs[0] is c]:
            z_c = shifted_zp(dq)
            dq.inputs[0] = new_v
            _set_input(dq, 2, z_c)
    if plain:
        changes.append(f"{len(plain)} uint8 constant(s) read by DequantizeLinear shifted to int8 exactly")
    opset = graph.opset or 0
    if requantize_weights:
        per_channel_ok = opset >= MIN_PER_CHANNEL_OPSET
        if not per_channel_ok and u8_weights:
            warnings.append(f"opset {opset} has no per-axis DequantizeLinear: weights re-quantized per tensor")
        for w, dq in u8_weights:
            err = _requantize_weight(gr, w, dq, per_channel_ok, warnings, model_name)
            if err is not None:
                weight_errors[w.name] = err
        if weight_errors:
            worst = max(weight_errors, key=weight_errors.get)
            changes.append(f"{len(weight_errors)} weight tensor(s) re-quantized to int8 symmetric per channel "
                           f"(max abs weight error {weight_errors[worst]:.3g}, in '{worst}')")
    else:
        n_u8 = sum(1 for w, _ in u8_weights if gr.value(w).dtype == np.uint8)
        if u8_weights:
            changes.append(f"{n_u8} uint8 weight tensor(s) shifted to int8 exactly; {len(u8_weights)} weight(s) stay "
                           "asymmetric, which the NPU rejects (re-run with weight re-quantization)")
    return Uint8Conversion(None, changes, io_changes, weight_errors, len(region), warnings, gr.created)


class _Index:
    """Constant values (decoded once) and new constants for one conversion."""

    def __init__(self, graph: ir.Graph, ed: Editor):
        self.graph = graph
        self.ed = ed
        self._values: dict[int, np.ndarray | None] = {}
        self.created: list[str] = []

    def value(self, t: ir.Tensor) -> np.ndarray | None:
        key = id(t)
        if key not in self._values:
            self._values[key] = const_value(t)
        return self._values[key]

    def is_const(self, t: ir.Tensor) -> bool:
        return self.value(t) is not None

    def add_init(self, base: str, value: np.ndarray) -> ir.Constant:
        c = ir.Constant(self.ed.name(base), np.asarray(value))
        self.created.append(c.name)
        return c

    def qparams(self, node: ir.Node) -> tuple[np.ndarray | None, np.ndarray | None]:
        return qparams(node, self.value)

    def check_uint8_zp(self, node: ir.Node, model_name: str) -> None:
        _, z = self.qparams(node)
        if z is None or z.dtype != np.uint8:
            raise UsageError(f"{model_name}: '{node.name}' mixes a uint8 tensor with a "
                             f"{'missing' if z is None else z.dtype.name} zero-point.")




def _scalar_or_list(v):
    a = np.asarray(v)
    return a.reshape(-1)[0].item() if a.size == 1 else a.reshape(-1).tolist()


def _tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001
        inferred = model
    out = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.output) + list(inferred.graph.value_info):
        if vi.type.tensor_type.elem_type:
            out[vi.name] = vi.type.tensor_type.elem_type
    for t in inferred.graph.initializer:
        out[t.name] = t.data_type
    for n in inferred.graph.node:  # QuantizeLinear outputs carry the zero-point's type
        if n.op_type == "QuantizeLinear" and n.output[0] not in out:
            out[n.output[0]] = TensorProto.UINT8 if len(n.input) < 3 or not n.input[2] else out.get(n.input[2], 0)
    return out


def _dequantizers(t0: ir.Tensor) -> Iterator[ir.Node]:
    """The DequantizeLinear nodes that read ``t0``, directly or through data movement (lazily)."""
    stack, seen = [t0], set()
    while stack:
        t = stack.pop()
        if t.name in seen:
            continue
        seen.add(t.name)
        for c in t.outputs:
            if c.op == "DequantizeLinear":
                yield c
            elif c.op in EXACT_SHIFT_OPS:
                stack.extend(o for o in c.outputs if o.name)


def _reaches_dequantize(t: ir.Tensor) -> bool:
    return next(_dequantizers(t), None) is not None


def _first_dq_params(t0: ir.Tensor, gr: _Index, model_name: str):
    """(scale, zero-point, axis) of the DequantizeLinear(s) reached from ``t0`` through data movement."""
    found = []
    for c in _dequantizers(t0):
        s, z = gr.qparams(c)
        found.append((s, z, attr(c, "axis") if np.size(s) > 1 else None))
    return _agree(found, t0.name, model_name)


def _last_q_params(t0: ir.Tensor, gr: _Index, model_name: str):
    """(scale, zero-point, axis) of the QuantizeLinear(s) that produced ``t0`` (through data movement)."""
    found = []
    stack, seen = [t0], set()
    while stack:
        t = stack.pop()
        if t.name in seen:
            continue
        seen.add(t.name)
        p = t.inputs[0] if t.inputs else None
        if p is None:
            continue
        if p.op == "QuantizeLinear":
            s, z = gr.qparams(p)
            found.append((s, z, attr(p, "axis") if np.size(s) > 1 else None))
        elif p.op in EXACT_SHIFT_OPS:
            stack.extend(i for i in p.inputs[:1] if i.name) if p.op != "Concat" else stack.extend(p.inputs)
    return _agree(found, t0.name, model_name)


def _agree(found, name: str, model_name: str):
    if not found:
        raise UsageError(f"{model_name}: the uint8 tensor '{name}' reaches no QuantizeLinear/DequantizeLinear, so its "
                         "scale and zero-point are unknown.")
    s0, z0, a0 = found[0]
    for s, z, a in found[1:]:
        if not (np.array_equal(s, s0) and np.array_equal(z, z0) and a == a0):
            raise UsageError(f"{model_name}: the uint8 tensor '{name}' is read with different scales or zero-points; "
                             "nafix cannot pick one to convert it with.")
    return np.asarray(s0), np.asarray(z0), a0


def _uint8_or_asym_weights(graph: ir.Graph, gr: _Index) -> list[tuple[ir.Tensor, ir.Node]]:
    """(constant, its DequantizeLinear) for weights the NPU rejects: uint8, or int8 with a non-zero zero-point."""
    out = []
    seen = set()
    for n in graph.nodes:
        if n.op not in WEIGHT_OPS or len(n.inputs) < 2:
            continue
        w = n.inputs[1]
        dq = w.inputs[0] if w.inputs else None
        if dq is None or dq.op != "DequantizeLinear" or not gr.is_const(dq.inputs[0]) or dq.name in seen:
            continue
        v = gr.value(dq.inputs[0])
        _, z = gr.qparams(dq)
        if v.dtype == np.uint8 or (v.dtype == np.int8 and z is not None and np.any(z != 0)):
            out.append((dq.inputs[0], dq))
            seen.add(dq.name)
    return out


def _uint8_plain_constants(graph: ir.Graph, gr: _Index, exclude: set[str]) -> list[ir.Tensor]:
    """uint8 constants read by DequantizeLinear that are not weights to re-quantize (shifted exactly)."""
    out = {}
    for t in graph.tensors().values():
        if t.name in exclude or t.name in out:
            continue
        if not any(c.op == "DequantizeLinear" and c.inputs[0] is t for c in t.outputs):
            continue
        if type(t) is ir.Constant and t.dtype != np.uint8:
            continue
        v = gr.value(t)
        if v is not None and v.dtype == np.uint8:
            out[t.name] = t
    return [out[k] for k in sorted(out)]


def _requantize_weight(gr: _Index, wt: ir.Tensor, dq: ir.Node, per_channel_ok: bool,
                       warnings: list[str], model_name: str) -> float | None:
    """Re-quantize one weight to int8 symmetric per channel (arithmetic on the dequantized values)."""
    wname = wt.name
    q = gr.value(wt)
    s, z = gr.qparams(dq)
    axis_attr = attr(dq, "axis", 1)
    w = _dequantize(q, s, z, axis_attr)
    dq_out = dq.outputs[0]
    users = list(dq_out.outputs)
    axes = {(_weight_axis(c.op, c.attrs.get, q.ndim) if c.op in WEIGHT_OPS and c.inputs[1:2] == [dq_out] else None)
            for c in users}
    axis = axes.pop() if len(axes) == 1 else None
    if not per_channel_ok or q.ndim == 0:
        axis = None
    if axis is None:
        amax = np.abs(w).max() if w.size else 0.0
        scale = np.asarray(amax / 127.0 if amax > 0 else 1.0, np.float32)
        new_q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
        if q.ndim and q.shape[0] > 1 and per_channel_ok:
            warnings.append(f"the weight '{wname}' is read in a way that has no single output-channel axis; "
                            "re-quantized per tensor")
    else:
        red = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.abs(w).max(axis=red) if w.size else np.zeros(w.shape[axis])
        scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
        shape = [1] * w.ndim
        shape[axis] = -1
        new_q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    new_w = _dequantize(new_q, scale, np.zeros(scale.shape, np.int8), axis if axis is not None else 1)
    err = float(np.abs(new_w.astype(np.float64) - w.astype(np.float64)).max()) if w.size else 0.0
    dq.inputs[0] = gr.add_init(wname + "_int8sym", new_q)
    dq.inputs[1] = gr.add_init(dq.inputs[1].name + "_int8sym", scale)
    _set_input(dq, 2, gr.add_init(wname + "_zero_point_int8sym", np.zeros(scale.shape, np.int8)))
    if axis is not None:
        dq.attrs.pop("axis", None)  # re-set last, as it was always written
        dq.attrs["axis"] = int(axis)
    for c in users:
        if c.op in ("Conv", "ConvTranspose", "Gemm") and len(c.inputs) > 2 and c.inputs[2].name:
            _requantize_bias(gr, c, scale, axis, warnings)
    return err


def _set_input(node: ir.Node, k: int, t: ir.Tensor) -> None:
    """Set input ``k`` of ``node``, padding with empty inputs when it has fewer."""
    if len(node.inputs) <= k:
        node.inputs.extend(ir.Variable.empty() for _ in range(k + 1 - len(node.inputs)))
    node.inputs[k] = t


def _dequantize(q: np.ndarray, s, z, axis) -> np.ndarray:
    s = np.asarray(s, np.float32)
    z = np.asarray(z)
    qf = q.astype(np.float32)
    if s.size > 1:
        shape = [1] * q.ndim
        shape[axis if axis >= 0 else axis + q.ndim] = -1
        return ((qf - z.astype(np.float32).reshape(shape)) * s.reshape(shape)).astype(np.float32)
    return ((qf - np.float32(z.reshape(-1)[0] if z.size else 0)) * np.float32(s.reshape(-1)[0])).astype(np.float32)


def _requantize_bias(gr: _Index, node: ir.Node, w_scale: np.ndarray, axis, warnings: list[str]) -> None:
    """Re-express the int32 bias of ``node`` with scale ``input_scale * weight_scale`` (per channel)."""
    b_t = node.inputs[2]
    bdq = b_t.inputs[0] if b_t.inputs else None
    if bdq is None or bdq.op != "DequantizeLinear" or not gr.is_const(bdq.inputs[0]):
        return
    x_t = node.inputs[0]
    xdq = x_t.inputs[0] if x_t.inputs else None
    if xdq is None or xdq.op != "DequantizeLinear":
        warnings.append(f"the bias of '{node.name}' kept its scale: the input scale of the node is unknown")
        return
    xs, _ = gr.qparams(xdq)
    if xs is None or np.size(xs) != 1:
        return
    bq = gr.value(bdq.inputs[0])
    bs, bz = gr.qparams(bdq)
    b = _dequantize(bq, bs, bz, attr(bdq, "axis", 0)).astype(np.float64)
    new_s = (np.float32(xs.reshape(-1)[0]) * w_scale.astype(np.float32)).astype(np.float32).reshape(-1)
    if new_s.size == 1 and b.size > 1:
        new_s_b = np.full(b.shape, new_s[0], np.float32)
    else:
        new_s_b = new_s
    new_bq = np.clip(np.rint(b / new_s_b), -2**31, 2**31 - 1).astype(np.int32)
    bdq.inputs[0] = gr.add_init(bdq.inputs[0].name + "_int8sym", new_bq)
    bdq.inputs[1] = gr.add_init(bdq.inputs[1].name + "_int8sym", new_s if new_s.size > 1 else new_s.reshape(()))
    _set_input(bdq, 2, gr.add_init(bdq.inputs[0].name + "_zero_point",
                                   np.zeros(new_s.shape if new_s.size > 1 else (), np.int32)))
    if new_s.size > 1:
        bdq.attrs.pop("axis", None)
        bdq.attrs["axis"] = 0


def symmetric_output_params(scale, zero_point, dtype=np.int8) -> tuple[np.ndarray, np.ndarray]:
    """(new_scale, 0): zero-point-0 parameters covering the same real range as ``(scale, zero_point)``.

    The calibrated range is ``[(qmin - zp) * s, (qmax - zp) * s]``; the new scale is the smallest
    with zero-point 0 that still covers it: ``max(hi / qmax, lo / qmin)`` (``qmin=-128``,
    ``qmax=127`` for int8). A zero-point of 0 returns the scale unchanged. This is arithmetic on a
    range that was already calibrated - no data, no new quantizer - used to turn a Conv/Gemm output
    in ST's "scale-offset format" (non-zero zero-point, which blocked HW lowering in a forum log)
    into a symmetric one. The price: with a one-sided range (e.g. after ReLU) half the codes go
    unused, so the resolution halves; verify with a tolerance contract. Works element-wise on arrays.
    """
    info = np.iinfo(np.dtype(dtype))
    if info.min >= 0:
        raise UsageError(f"symmetric output parameters need a signed type, not {np.dtype(dtype).name}.")
    s = np.asarray(scale, dtype=np.float64)
    z = np.asarray(zero_point, dtype=np.float64)
    if np.any(s <= 0) or not np.all(np.isfinite(s)):
        raise UsageError("the scale to make symmetric must be positive and finite.")
    lo = (info.min - z) * s
    hi = (info.max - z) * s
    new = np.maximum(np.maximum(hi, 0.0) / info.max, np.minimum(lo, 0.0) / info.min)
    new32 = new.astype(np.float32)
    new32 = np.where(new32.astype(np.float64) < new, np.nextafter(new32, np.float32(np.inf)), new32)  # cover, not 1 ulp short
    new32 = np.where(z == 0, s.astype(np.float32), new32)
    return np.asarray(new32, dtype=np.float32), np.zeros(np.shape(new32), dtype=np.dtype(dtype))
