"""Quantize only the float islands of a QDQ model with onnxruntime, keeping every existing scale and
zero-point (:func:`requantize_islands`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from ..analysis import analyze_model
from ..errors import UsageError
from .calibration import CalibrationOptions, Progress, _reader, open_calibration
from .checks import _analysis_copy, check_npu_quantization, float_islands
from .modelproto import (
    _Graph,
    _attr,
    _clamp_ir,
    _copy,
    _is_quantized,
    _load_profile,
    _remove_dead,
    _rename_back,
    _rename_collisions,
    _strip_initializer_inputs,
    _unique_names,
)
from .ort import (
    _check_interface,
    _grouped_conv_transpose_overrides,
    _prelu_slope_overrides,
    _run_quantize_static,
    npu_op_types,
)

log = logging.getLogger(__name__)

_QUANT_REASONS = frozenset({"quantized_activations", "params_quantized", "prelu_slope_quantized"})


@dataclass
class IslandResult:
    """What :func:`requantize_islands` did.

    ``calibration``: ``random`` | ``npz`` | ``images``, or ``none`` when no island needed
    onnxruntime (nothing to do, or only data movement that takes its input's parameters);
    ``quantized_nodes``: the island nodes quantized; ``remaining``: float islands left
    (:func:`float_islands`); ``preserved``: existing QuantizeLinear/DequantizeLinear nodes whose
    scale and zero-point are unchanged; ``changed_params``: those that changed (should be empty);
    ``problems``: what :func:`check_npu_quantization` still rejects.
    """

    model: onnx.ModelProto
    calibration: str
    samples: int
    quantized_nodes: list[str] = field(default_factory=list)
    remaining: list[dict] = field(default_factory=list)
    preserved: int = 0
    changed_params: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"calibration": self.calibration, "samples": self.samples, "quantized_nodes": list(self.quantized_nodes),
                "remaining": list(self.remaining), "preserved": self.preserved,
                "changed_params": list(self.changed_params), "changes": list(self.changes),
                "warnings": list(self.warnings), "problems": list(self.problems)}


def island_nodes(model: onnx.ModelProto, *, profile=None, exclude: Sequence[str] = ()) -> list[str]:
    """Names of the nodes of a QDQ model that run in float only because they are not quantized.

    From nafix's placement: SW nodes (not Q/DQ) failing ``quantized_activations``,
    ``params_quantized`` or ``prelu_slope_quantized``, and SW ops with an int8 kernel that run the
    float kernel; restricted to op types onnxruntime can quantize (:func:`npu_op_types`).
    """
    profile = _load_profile(profile)
    op_types, _ = npu_op_types(profile)
    ops = set(op_types)
    analysis = analyze_model(_analysis_copy(model), profile=profile)
    out = []
    for p in analysis.placement.nodes:
        if p.unit != "SW" or p.op_type in ("QuantizeLinear", "DequantizeLinear") or p.name in exclude:
            continue
        if p.op_type not in ops:
            continue
        quant = any(r.constraint in _QUANT_REASONS for r in p.reasons)
        int8_kernel_unused = p.op_type in profile.sw_int8_kernels and p.kernel == "float"
        if quant or int8_kernel_unused:
            out.append(p.name)
    return out


def requantize_islands(model: onnx.ModelProto, *, calib: CalibrationOptions, progress: Progress | None = None,
                       nodes_to_exclude: Sequence[str] = (), tensor_overrides: Mapping[str, list[dict]] | None = None,
                       profile=None, model_name: str = "the model") -> IslandResult:
    """Quantize the float islands of a QDQ model with onnxruntime, keeping every existing scale and zero-point.

    Only the island nodes (:func:`island_nodes`) go to ``quantize_static`` (``nodes_to_quantize``);
    their inputs that already come from a DequantizeLinear are left alone by onnxruntime, and a
    tensor that already has a QuantizeLinear gets that QuantizeLinear's scale and zero-point through
    ``TensorQuantOverrides`` - calibration decides only for tensors that had none, and float
    constants (PRelu slopes int8 symmetric per channel, weights per channel). The redundant
    ``Q -> DQ -> Q`` chains this leaves (identical parameters, an exact identity on int8 values)
    are collapsed, so every original Q/DQ node keeps its name, inputs and parameters; this is
    checked (``preserved`` / ``changed_params``).
    """
    if not _is_quantized(model):
        raise UsageError(f"{model_name}: the model is not quantized at all; quantize it with quantize_float_model "
                         "(nafix --quantize) instead of fixing float islands.")
    m = _copy(model)
    _unique_names(m)
    changes: list[str] = []
    warnings: list[str] = []
    dropped = _strip_initializer_inputs(m)
    if dropped:
        changes.append(f"{len(dropped)} initializer(s) listed as graph inputs ({', '.join(dropped[:3])}"
                       f"{', ...' if len(dropped) > 3 else ''}) made plain constants so they can be quantized")
    u8 = [p for p in check_npu_quantization(m, allow_uint8_io=True) if "uint8" in p]
    if u8:
        raise UsageError(f"{model_name}: the model has uint8 activations ({u8[0]}); convert them to int8 first "
                         "(convert_uint8_to_int8).")
    known = {n.name for n in m.graph.node}
    unknown = [n for n in nodes_to_exclude if n not in known]
    if unknown:
        raise UsageError(f"{model_name}: no node named {', '.join(repr(u) for u in unknown[:3])} to exclude from quantization.")
    profile = _load_profile(profile)
    islands = island_nodes(m, profile=profile, exclude=nodes_to_exclude)
    source_kind = "none"
    if not islands:
        _clamp_ir(m)
        return IslandResult(m, source_kind, 0, [], float_islands(m, profile=profile), 0, [], changes,
                            ["the model has no float island onnxruntime can quantize"])
    source = open_calibration(m, calib, model_name=model_name)
    warnings.extend(source.warnings)
    if source.kind == "random":
        warnings.append("calibrated on random data: the new ranges (island tensors without a QuantizeLinear) "
                        "do not reflect real inputs")
    gr = _Graph(m)
    original_qdq = {n.name: _qdq_signature(gr, n) for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    shared = _share_input_params(m, islands)
    if shared:
        changes.append(f"{len(shared)} data-movement island node(s) ({', '.join(sorted({_op_of(m, n) for n in shared}))}) "
                       "got QuantizeLinear/DequantizeLinear with the parameters of their already quantized input "
                       "(what onnxruntime gives such ops; its quantizer cannot share parameters with a tensor "
                       "that is already dequantized)")
    ort_islands = [n for n in islands if n not in shared]
    if not ort_islands:
        return _island_result(m, m, "none", 0, islands, original_qdq, changes, warnings, profile, 0)
    islands_for_ort = ort_islands
    island_set = set(ort_islands)
    touched: set[str] = set()
    for n in m.graph.node:
        if n.name in island_set:
            touched.update(i for i in n.input if i)
            touched.update(o for o in n.output if o)
    renamed = _rename_collisions(m, touched)
    gr.refresh()
    overrides: dict[str, list[dict]] = {}
    for t in sorted(touched):
        qs = [c for c in gr.consumers[t] if c.op_type == "QuantizeLinear"]
        if not qs:
            continue
        s, z = gr.qparams(qs[0])
        if s is None or z is None or np.size(s) != 1:
            continue
        if len(qs) > 1 and any(not np.array_equal(gr.qparams(q)[0], s) or not np.array_equal(gr.qparams(q)[1], z) for q in qs[1:]):
            warnings.append(f"the tensor '{t}' is quantized twice with different parameters; the first is kept")
        if z.dtype != np.int8:
            continue
        overrides[t] = [{"scale": np.array(s.reshape(-1)[0], np.float32), "zero_point": np.array(z.reshape(-1)[0], np.int8)}]
    shared_ops = _ort_shared_param_ops()
    for n in m.graph.node:  # a data-movement island takes the parameters its output already has
        if n.name in island_set and n.op_type in shared_ops and n.input and n.input[0] not in overrides:
            known = [overrides[o] for o in n.output if o in overrides]
            src = gr.producer.get(n.input[0])
            if known and (src is None or src.op_type != "DequantizeLinear"):
                overrides[n.input[0]] = known[0]
    overrides.update(_prelu_slope_overrides(m, island_set))
    overrides.update(_grouped_conv_transpose_overrides(m, island_set))
    overrides.update({k: list(v) for k, v in (tensor_overrides or {}).items()})
    op_types, _ = npu_op_types(profile)
    reader = _reader(source, progress)
    log.info("quantizing %d float island node(s) of %s with onnxruntime on %s", len(islands_for_ort), model_name,
             source.description)
    producer = (m.producer_name, m.producer_version)
    out = _run_quantize_static(m, reader, op_types=op_types, method=calib.method, nodes_to_quantize=islands_for_ort,
                               overrides=overrides, keep_activations=True, model_name=model_name)
    out.producer_name, out.producer_version = producer
    collapsed = _collapse_requantize_chains(out)
    _remove_dead(out)
    _rename_back(out, renamed)
    return _island_result(m, out, source.kind, reader.done, islands, original_qdq, changes, warnings, profile,
                          collapsed, model_name=model_name)


def _island_result(before: onnx.ModelProto, out: onnx.ModelProto, kind: str, samples: int, islands: list[str],
                   original_qdq: dict, changes: list[str], warnings: list[str], profile, collapsed: int,
                   model_name: str = "the model") -> IslandResult:
    _clamp_ir(out)
    _check_interface(before, out, model_name)
    island_set = set(islands)
    gr2 = _Graph(out)
    preserved, changed = 0, []
    by_name = {n.name: n for n in out.graph.node}
    for name, sig in original_qdq.items():
        n = by_name.get(name)
        if n is None:
            changed.append(f"'{name}' disappeared")
            continue
        if _qdq_signature(gr2, n) == sig:
            preserved += 1
        else:
            changed.append(f"'{name}' changed its scale or zero-point")
    remaining = float_islands(out, profile=profile)
    problems = check_npu_quantization(out, allow_uint8_io=True)
    changes.append(f"{len(islands)} float island node(s) quantized "
                   f"({', '.join(sorted({n.op_type for n in out.graph.node if n.name in island_set}))}); "
                   f"{preserved} existing QuantizeLinear/DequantizeLinear kept their parameters"
                   + (f", {collapsed} redundant re-quantization(s) collapsed" if collapsed else ""))
    return IslandResult(out, kind, samples, islands, remaining, preserved, changed, changes, warnings, problems)


def _op_of(model: onnx.ModelProto, name: str) -> str:
    return next((n.op_type for n in model.graph.node if n.name == name), "?")


def _ort_shared_param_ops() -> frozenset[str]:
    """Op types whose onnxruntime QDQ handler gives the output the input's quantization parameters."""
    from onnxruntime.quantization.operators.direct_q8 import QDQDirect8BitOp
    from onnxruntime.quantization.operators.gather import QDQGather
    from onnxruntime.quantization.operators.pad import QDQPad
    from onnxruntime.quantization.operators.split import QDQSplit
    from onnxruntime.quantization.registry import QDQRegistry

    return frozenset(op for op, cls in QDQRegistry.items()
                     if isinstance(cls, type) and issubclass(cls, (QDQDirect8BitOp, QDQGather, QDQPad, QDQSplit)))


def _share_input_params(model: onnx.ModelProto, islands: list[str]) -> list[str]:
    """For island data-movement ops reading a DequantizeLinear directly: quantize each float output with
    the parameters of that DequantizeLinear (or of the QuantizeLinear the output already has) - what
    onnxruntime's parameter sharing produces, done here because its quantizer loops forever when the
    shared input is an already dequantized tensor. Returns the nodes handled."""
    shared_ops = _ort_shared_param_ops()
    island_set = set(islands)
    done: list[str] = []
    gr = _Graph(model)
    for node in list(model.graph.node):
        if node.name not in island_set or node.op_type not in shared_ops or not node.input:
            continue
        dq = gr.producer.get(node.input[0])
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        s, z = gr.qparams(dq)
        if s is None or z is None or np.size(s) != 1:
            continue
        for o in [o for o in node.output if o]:
            qs = [c for c in gr.consumers[o] if c.op_type == "QuantizeLinear"]
            others = [c for c in gr.consumers[o] if c.op_type != "QuantizeLinear"]
            if qs and not others and o not in gr.outputs:
                continue
            src = qs[0] if qs else dq
            s_name, z_name = src.input[1], src.input[2] if len(src.input) > 2 else ""
            q_out, dq_out = gr.fresh(o + "_QuantizeLinear_Output"), gr.fresh(o + "_DequantizeLinear_Output")
            pre = o
            if o in gr.outputs:  # keep the graph output's name on the DequantizeLinear
                pre = gr.fresh(o + "_QuantizeLinear_Input")
                node.output[list(node.output).index(o)] = pre
                dq_out = o
            for c in others:
                for k, i in enumerate(c.input):
                    if i == o:
                        c.input[k] = dq_out
            qn = helper.make_node("QuantizeLinear", [pre, s_name, z_name], [q_out], name=gr.fresh(o + "_QuantizeLinear"))
            dqn = helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out],
                                   name=gr.fresh(o + "_DequantizeLinear"))
            idx = list(model.graph.node).index(node) + 1
            model.graph.node.insert(idx, dqn)
            model.graph.node.insert(idx, qn)
            if o in gr.outputs:
                for q in qs:
                    q.input[0] = pre
        done.append(node.name)
        gr.refresh()
    return done


def _qdq_signature(gr: _Graph, node: onnx.NodeProto) -> tuple:
    s, z = gr.qparams(node)
    return (node.op_type,
            None if s is None else (str(s.dtype), tuple(np.asarray(s).reshape(-1).tolist())),
            None if z is None else (str(z.dtype), tuple(np.asarray(z).reshape(-1).tolist())),
            _attr(node, "axis", 1) if s is not None and np.size(s) > 1 else None)


def _collapse_requantize_chains(model: onnx.ModelProto) -> int:
    """``Q2 -> DQ -> Q`` with identical parameters: Q reads Q2's input directly (exact on int8 values)."""
    gr = _Graph(model)
    count = 0
    for q in model.graph.node:
        if q.op_type != "QuantizeLinear":
            continue
        dq = gr.producer.get(q.input[0])
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        q2 = gr.producer.get(dq.input[0])
        if q2 is None or q2.op_type != "QuantizeLinear":
            continue
        sig = _qdq_signature(gr, q)[1:]
        if _qdq_signature(gr, dq)[1:] == sig and _qdq_signature(gr, q2)[1:] == sig:
            q.input[0] = q2.input[0]
            count += 1
    if count:
        gr.refresh()
    return count
