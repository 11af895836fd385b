"""Exact uint8 -> int8 conversion of a QDQ model (:func:`convert_uint8_to_int8`) and the symmetric
parameters covering an already calibrated range (:func:`symmetric_output_params`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import UsageError
from .checks import WEIGHT_OPS, _weight_axis
from .modelproto import _Graph, _attr, _clamp_ir, _copy, _opset, _remove_dead, _set_attr, _unique_names
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
    from ..rewriters import IoChange

    m = _copy(model)
    _unique_names(m)
    gr = _Graph(m)
    types = _tensor_types(m)
    changes: list[str] = []
    warnings: list[str] = []
    io_changes: list = []
    weight_errors: dict[str, float] = {}

    # --- 1. find the uint8 activation region ---------------------------------------------------
    region: set[str] = set()  # tensors whose uint8 values become int8 (value - 128)
    dq_in: set[str] = set()  # DequantizeLinear nodes reading the region
    q_out: set[str] = set()  # QuantizeLinear nodes writing the region
    stack: list[str] = []
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and not gr.is_const(n.input[0]):
            _, z = gr.qparams(n)
            if z is not None and z.dtype == np.uint8:
                stack.append(n.output[0])
    u8_inputs = [name for name in gr.inputs if types.get(name) == TensorProto.UINT8]
    kept_inputs: set[str] = set()
    input_bridges: dict[str, str] = {}
    for name in u8_inputs:
        if not _reaches_dequantize(gr, name):
            continue  # a uint8 input that is not quantized data (e.g. indices); leave it
        direct = all(c.op_type == "DequantizeLinear" for c in gr.consumers[name])
        if io == "keep" and direct:
            kept_inputs.add(name)
            continue
        if io == "keep":
            input_bridges[name] = ""  # filled below once the region is known
        stack.append(name)
    while stack:
        t = stack.pop()
        if t in region:
            continue
        region.add(t)
        for c in gr.consumers[t]:
            if c.op_type == "DequantizeLinear":
                if c.input[0] == t:
                    dq_in.add(c.name)
                continue
            if c.op_type in EXACT_SHIFT_OPS and c.input[0] == t or (c.op_type == "Concat"):
                if c.op_type == "Resize" and (_attr(c, "mode", b"nearest") not in (b"nearest", "nearest")):
                    raise UsageError(f"{model_name}: '{c.name}' (Resize, {_attr(c, 'mode')!r}) interpolates uint8 "
                                     "values; nafix can shift uint8 to int8 exactly only through data movement.")
                stack.extend(o for o in c.output if o)
                continue
            raise UsageError(f"{model_name}: '{c.name}' ({c.op_type}) computes on the uint8 tensor '{t}'; nafix "
                             "converts uint8 activations exactly only in QDQ models where uint8 tensors pass "
                             "between QuantizeLinear and DequantizeLinear through data movement.")
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.output[0] in region:
            q_out.add(n.name)
    u8_weights = _uint8_or_asym_weights(gr)
    shift_consts = _uint8_plain_constants(gr, exclude={w for w, _ in u8_weights} if requantize_weights else set())
    if not region and not u8_weights and not shift_consts:
        return Uint8Conversion(m, [], warnings=["the model has no uint8 tensor"])

    # --- 2. keep-mode interface: bridges at uint8 inputs and outputs ----------------------------
    kept_outputs: set[str] = set()
    bridges: set[str] = set()  # nodes nafix adds at kept uint8 edges (already int8 on the inside)
    if io == "keep":
        for name in list(input_bridges):
            s, z, axis = _first_dq_params(gr, name, model_name)
            new = gr.fresh(name + "_int8")
            for c in list(gr.consumers[name]):
                for k, i in enumerate(c.input):
                    if i == name:
                        c.input[k] = new
            dq_out = gr.fresh(name + "_dequantized")
            s_name = gr.add_init(name + "_scale", s)
            z_name = gr.add_init(name + "_zero_point", z)
            z8_name = gr.add_init(name + "_zero_point_int8", (z.astype(np.int16) - 128).astype(np.int8))
            attrs = {"axis": axis} if axis is not None else {}
            dq = helper.make_node("DequantizeLinear", [name, s_name, z_name], [dq_out], name=gr.fresh(name + "_DequantizeLinear"), **attrs)
            q = helper.make_node("QuantizeLinear", [dq_out, s_name, z8_name], [new], name=gr.fresh(name + "_QuantizeLinear"), **attrs)
            m.graph.node.insert(0, q)
            m.graph.node.insert(0, dq)
            bridges.update((q.name, dq.name))
            region.discard(name)
            region.add(new)
            types[new] = TensorProto.INT8
            input_bridges[name] = new
            changes.append(f"uint8 input '{name}' kept; an exact DequantizeLinear -> QuantizeLinear(int8) "
                           f"bridge feeds its data-movement consumers")
        for out in list(gr.outputs):
            if out not in region:
                continue
            p = gr.producer.get(out)
            if p is not None and p.name in q_out:
                q_out.discard(p.name)  # a QuantizeLinear writing the output directly keeps uint8
                region.discard(out)
                kept_outputs.add(out)
                continue
            s, z, axis = _last_q_params(gr, out, model_name)
            inner = gr.fresh(out + "_int8")
            for k, o in enumerate(p.output):
                if o == out:
                    p.output[k] = inner
            for c in gr.consumers[out]:
                for k, i in enumerate(c.input):
                    if i == out:
                        c.input[k] = inner
            region.discard(out)
            region.add(inner)
            s_name = gr.add_init(out + "_scale", s)
            z_name = gr.add_init(out + "_zero_point", z)
            z8_name = gr.add_init(out + "_zero_point_int8", (z.astype(np.int16) - 128).astype(np.int8))
            deq = gr.fresh(out + "_dequantized")
            attrs = {"axis": axis} if axis is not None else {}
            bdq = helper.make_node("DequantizeLinear", [inner, s_name, z8_name], [deq],
                                   name=gr.fresh(out + "_DequantizeLinear"), **attrs)
            bq = helper.make_node("QuantizeLinear", [deq, s_name, z_name], [out],
                                  name=gr.fresh(out + "_QuantizeLinear"), **attrs)
            m.graph.node.extend([bdq, bq])
            bridges.update((bdq.name, bq.name))
            changes.append(f"uint8 output '{out}' kept; an exact DequantizeLinear -> QuantizeLinear(uint8) bridge writes it")
        gr.refresh()
        dq_in = {n.name for n in m.graph.node
                 if n.op_type == "DequantizeLinear" and n.input[0] in region and n.name not in bridges}
        q_out = {n.name for n in m.graph.node
                 if n.op_type == "QuantizeLinear" and n.output[0] in region and n.name not in bridges}

    if io == "int8":  # recorded before the zero-points below are shifted
        for name in u8_inputs:
            if name in region:
                s, z, _ = _first_dq_params(gr, name, model_name)
                io_changes.append(IoChange("input", name, "int8", _scalar_or_list(s),
                                           _scalar_or_list(z.astype(np.int16) - 128), was="uint8"))
        for out in gr.outputs:
            if out in region:
                s, z, _ = _last_q_params(gr, out, model_name)
                io_changes.append(IoChange("output", out, "int8", _scalar_or_list(s),
                                           _scalar_or_list(z.astype(np.int16) - 128), was="uint8"))

    # --- 3. shift zero-points of the region's Q/DQ ----------------------------------------------
    zp_cache: dict[tuple[str, int], str] = {}

    def shifted_zp(node: onnx.NodeProto) -> str:
        s, z = gr.qparams(node)
        key = (node.input[2] if len(node.input) > 2 else "", int(np.size(s)))
        if key not in zp_cache:
            if z.dtype != np.uint8:
                raise UsageError(f"{model_name}: '{node.name}' mixes a uint8 tensor with a {z.dtype.name} zero-point.")
            zp_cache[key] = gr.add_init((key[0] or node.name) + "_int8", (z.astype(np.int16) - 128).astype(np.int8))
        return zp_cache[key]

    for n in m.graph.node:
        if n.name in dq_in or n.name in q_out:
            z_name = shifted_zp(n)
            while len(n.input) < 3:
                n.input.append("")
            n.input[2] = z_name
    for n in m.graph.node:  # Pad's constant value in the region shifts too
        if n.op_type == "Pad" and n.input[0] in region and len(n.input) > 2 and n.input[2]:
            v = gr.consts.get(n.input[2])
            if v is not None and v.dtype == np.uint8:
                n.input[2] = gr.add_init(n.input[2] + "_int8", (v.astype(np.int16) - 128).astype(np.int8))
    shifted = {t for t in region}
    _retype(m, shifted, TensorProto.INT8)
    n_q, n_dq = len(q_out), len(dq_in)
    if region:
        changes.append(f"{len(region)} uint8 activation tensor(s) made int8 exactly (zero-point - 128, same scale) "
                       f"across {n_q} QuantizeLinear and {n_dq} DequantizeLinear")

    # --- 4. constants: exact shift or symmetric per-channel re-quantization ---------------------
    u8_weight_names = {w for w, _ in u8_weights}
    plain = [c for c in shift_consts if c not in u8_weight_names]
    for name in shift_consts:
        v = gr.consts[name]
        new_v = gr.add_init(name + "_int8", (v.astype(np.int16) - 128).astype(np.int8))
        for dq in [c for c in gr.consumers[name] if c.op_type == "DequantizeLinear" and c.input[0] == name]:
            z_name = shifted_zp(dq)
            dq.input[0] = new_v
            while len(dq.input) < 3:
                dq.input.append("")
            dq.input[2] = z_name
    if plain:
        changes.append(f"{len(plain)} uint8 constant(s) read by DequantizeLinear shifted to int8 exactly")
    if requantize_weights:
        per_channel_ok = _opset(m) >= MIN_PER_CHANNEL_OPSET
        if not per_channel_ok and u8_weights:
            warnings.append(f"opset {_opset(m)} has no per-axis DequantizeLinear: weights re-quantized per tensor")
        for wname, dq in u8_weights:
            err = _requantize_weight(gr, wname, dq, per_channel_ok, warnings, model_name)
            if err is not None:
                weight_errors[wname] = err
        if weight_errors:
            worst = max(weight_errors, key=weight_errors.get)
            changes.append(f"{len(weight_errors)} weight tensor(s) re-quantized to int8 symmetric per channel "
                           f"(max abs weight error {weight_errors[worst]:.3g}, in '{worst}')")
    else:
        n_u8 = sum(1 for w, _ in u8_weights if gr.consts[w].dtype == np.uint8)
        if u8_weights:
            changes.append(f"{n_u8} uint8 weight tensor(s) shifted to int8 exactly; {len(u8_weights)} weight(s) stay "
                           "asymmetric, which the NPU rejects (re-run with weight re-quantization)")
    _remove_dead(m)
    _clamp_ir(m)
    return Uint8Conversion(m, changes, io_changes, weight_errors, len(shifted), warnings)


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


def _reaches_dequantize(gr: _Graph, name: str) -> bool:
    stack, seen = [name], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for c in gr.consumers[t]:
            if c.op_type == "DequantizeLinear":
                return True
            if c.op_type in EXACT_SHIFT_OPS:
                stack.extend(o for o in c.output if o)
    return False


def _first_dq_params(gr: _Graph, name: str, model_name: str):
    """(scale, zero-point, axis) of the DequantizeLinear(s) reached from ``name`` through data movement."""
    found = []
    stack, seen = [name], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for c in gr.consumers[t]:
            if c.op_type == "DequantizeLinear":
                s, z = gr.qparams(c)
                found.append((s, z, _attr(c, "axis") if np.size(s) > 1 else None))
            elif c.op_type in EXACT_SHIFT_OPS:
                stack.extend(o for o in c.output if o)
    return _agree(found, name, model_name)


def _last_q_params(gr: _Graph, name: str, model_name: str):
    """(scale, zero-point, axis) of the QuantizeLinear(s) that produced ``name`` (through data movement)."""
    found = []
    stack, seen = [name], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        p = gr.producer.get(t)
        if p is None:
            continue
        if p.op_type == "QuantizeLinear":
            s, z = gr.qparams(p)
            found.append((s, z, _attr(p, "axis") if np.size(s) > 1 else None))
        elif p.op_type in EXACT_SHIFT_OPS:
            stack.extend(i for i in p.input[:1] if i) if p.op_type != "Concat" else stack.extend(p.input)
    return _agree(found, name, model_name)


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


def _uint8_or_asym_weights(gr: _Graph) -> list[tuple[str, onnx.NodeProto]]:
    """(constant, its DequantizeLinear) for weights the NPU rejects: uint8, or int8 with a non-zero zero-point."""
    out = []
    seen = set()
    for n in gr.g.node:
        if n.op_type not in WEIGHT_OPS or len(n.input) < 2:
            continue
        dq = gr.producer.get(n.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or not gr.is_const(dq.input[0]) or dq.name in seen:
            continue
        v = gr.consts[dq.input[0]]
        _, z = gr.qparams(dq)
        if v.dtype == np.uint8 or (v.dtype == np.int8 and z is not None and np.any(z != 0)):
            out.append((dq.input[0], dq))
            seen.add(dq.name)
    return out


def _uint8_plain_constants(gr: _Graph, exclude: set[str]) -> list[str]:
    """uint8 constants read by DequantizeLinear that are not weights to re-quantize (shifted exactly)."""
    out = []
    for name, v in gr.consts.items():
        if v.dtype != np.uint8 or name in exclude:
            continue
        if any(c.op_type == "DequantizeLinear" and c.input[0] == name for c in gr.consumers[name]):
            out.append(name)
    return sorted(out)


def _requantize_weight(gr: _Graph, wname: str, dq: onnx.NodeProto, per_channel_ok: bool,
                       warnings: list[str], model_name: str) -> float | None:
    """Re-quantize one weight to int8 symmetric per channel (arithmetic on the dequantized values)."""
    q = gr.consts[wname]
    s, z = gr.qparams(dq)
    axis_attr = _attr(dq, "axis", 1)
    w = _dequantize(q, s, z, axis_attr)
    users = [c for c in gr.consumers[dq.output[0]]]
    axes = {(_weight_axis(c, q.ndim) if c.op_type in WEIGHT_OPS and list(c.input[1:2]) == [dq.output[0]] else None)
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
    dq.input[0] = gr.add_init(wname + "_int8sym", new_q)
    dq.input[1] = gr.add_init(dq.input[1] + "_int8sym", scale)
    while len(dq.input) < 3:
        dq.input.append("")
    dq.input[2] = gr.add_init(wname + "_zero_point_int8sym", np.zeros(scale.shape, np.int8))
    if axis is not None:
        _set_attr(dq, "axis", int(axis))
    for c in users:
        if c.op_type in ("Conv", "ConvTranspose", "Gemm") and len(c.input) > 2 and c.input[2]:
            _requantize_bias(gr, c, scale, axis, warnings)
    return err


def _dequantize(q: np.ndarray, s, z, axis) -> np.ndarray:
    s = np.asarray(s, np.float32)
    z = np.asarray(z)
    qf = q.astype(np.float32)
    if s.size > 1:
        shape = [1] * q.ndim
        shape[axis if axis >= 0 else axis + q.ndim] = -1
        return ((qf - z.astype(np.float32).reshape(shape)) * s.reshape(shape)).astype(np.float32)
    return ((qf - np.float32(z.reshape(-1)[0] if z.size else 0)) * np.float32(s.reshape(-1)[0])).astype(np.float32)


def _requantize_bias(gr: _Graph, node: onnx.NodeProto, w_scale: np.ndarray, axis, warnings: list[str]) -> None:
    """Re-express the int32 bias of ``node`` with scale ``input_scale * weight_scale`` (per channel)."""
    bdq = gr.producer.get(node.input[2])
    if bdq is None or bdq.op_type != "DequantizeLinear" or not gr.is_const(bdq.input[0]):
        return
    xdq = gr.producer.get(node.input[0])
    if xdq is None or xdq.op_type != "DequantizeLinear":
        warnings.append(f"the bias of '{node.name}' kept its scale: the input scale of the node is unknown")
        return
    xs, _ = gr.qparams(xdq)
    if xs is None or np.size(xs) != 1:
        return
    bq = gr.consts[bdq.input[0]]
    bs, bz = gr.qparams(bdq)
    b = _dequantize(bq, bs, bz, _attr(bdq, "axis", 0)).astype(np.float64)
    new_s = (np.float32(xs.reshape(-1)[0]) * w_scale.astype(np.float32)).astype(np.float32).reshape(-1)
    if new_s.size == 1 and b.size > 1:
        new_s_b = np.full(b.shape, new_s[0], np.float32)
    else:
        new_s_b = new_s
    new_bq = np.clip(np.rint(b / new_s_b), -2**31, 2**31 - 1).astype(np.int32)
    bdq.input[0] = gr.add_init(bdq.input[0] + "_int8sym", new_bq)
    bdq.input[1] = gr.add_init(bdq.input[1] + "_int8sym", new_s if new_s.size > 1 else new_s.reshape(()))
    while len(bdq.input) < 3:
        bdq.input.append("")
    bdq.input[2] = gr.add_init(bdq.input[0] + "_zero_point", np.zeros(new_s.shape if new_s.size > 1 else (), np.int32))
    if new_s.size > 1:
        _set_attr(bdq, "axis", 0)


def _retype(model: onnx.ModelProto, names: set[str], elem: int) -> None:
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        if vi.name in names:
            vi.type.tensor_type.elem_type = elem


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
