"""Quantize only the float islands of a QDQ model with onnxruntime, keeping every existing scale and
zero-point (:func:`requantize_islands`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx

from .. import ir
from ..analysis import analyze_model
from ..errors import UsageError
from ..graph import Editor, gc_paused, qparams, read_graph
from .calibration import CalibrationOptions, Progress, _reader, open_calibration
from .checks import _analysis_copy, check_npu_quantization, float_islands
from .modelproto import (
    _clamp_ir,
    _copy,
    _export,
    _is_quantized,
    _keep_initializer_order,
    _load_profile,
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
    with gc_paused():
        graph = ir.import_onnx(m)
    original_inits = [t.name for t in m.graph.initializer]
    original_qdq = {n.name: _qdq_signature(n) for n in graph.nodes if n.op in ("QuantizeLinear", "DequantizeLinear")}
    shared = _share_input_params(graph, islands)
    if shared:
        m = _export(graph, m)
        _keep_initializer_order(m, original_inits)
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
    if renamed:
        # a renamed island node or touched tensor (a name that starts like onnxruntime's names for
        # another touched tensor: NAF002's 'conv__nafix_5' beside the tensor 'conv') goes to
        # onnxruntime by its new name: nodes_to_quantize naming the old one would leave it in float
        fwd = {old: new for new, old in renamed.items()}
        islands_for_ort = [fwd.get(n, n) for n in islands_for_ort]
        island_set = set(islands_for_ort)
        touched = {fwd.get(t, t) for t in touched}
        tensor_overrides = {fwd.get(k, k): v for k, v in (tensor_overrides or {}).items()}
    graph = read_graph(m)
    tensors = graph.tensors()
    overrides: dict[str, list[dict]] = {}
    for t in sorted(touched):
        qs = [c for c in tensors[t].outputs if c.op == "QuantizeLinear"] if t in tensors else []
        if not qs:
            continue
        s, z = qparams(qs[0])
        if s is None or z is None or np.size(s) != 1:
            continue
        if len(qs) > 1 and any(not np.array_equal(qparams(q)[0], s) or not np.array_equal(qparams(q)[1], z) for q in qs[1:]):
            warnings.append(f"the tensor '{t}' is quantized twice with different parameters; the first is kept")
        if z.dtype != np.int8:
            continue
        overrides[t] = [{"scale": np.array(s.reshape(-1)[0], np.float32), "zero_point": np.array(z.reshape(-1)[0], np.int8)}]
    shared_ops = _ort_shared_param_ops()
    for n in graph.nodes:  # a data-movement island takes the parameters its output already has
        if n.name in island_set and n.op in shared_ops and n.inputs and n.inputs[0].name not in overrides:
            known = [overrides[o.name] for o in n.outputs if o.name in overrides]
            src = n.inputs[0].inputs[0] if n.inputs[0].inputs else None
            if known and (src is None or src.op != "DequantizeLinear"):
                overrides[n.inputs[0].name] = known[0]
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
    with gc_paused():
        graph = ir.import_onnx(out)
    collapsed = _collapse_requantize_chains(graph)
    ort_inits = [t.name for t in out.graph.initializer]
    out = _export(graph.cleanup(), out)
    _keep_initializer_order(out, ort_inits)
    _rename_back(out, renamed)
    return _island_result(m, out, source.kind, reader.done, islands, original_qdq, changes, warnings, profile,
                          collapsed, model_name=model_name)


def _island_result(before: onnx.ModelProto, out: onnx.ModelProto, kind: str, samples: int, islands: list[str],
                   original_qdq: dict, changes: list[str], warnings: list[str], profile, collapsed: int,
                   model_name: str = "the model") -> IslandResult:
    _clamp_ir(out)
    _check_interface(before, out, model_name)
    island_set = set(islands)
    preserved, changed = 0, []
    by_name = {n.name: n for n in read_graph(out).nodes}
    for name, sig in original_qdq.items():
        n = by_name.get(name)
        if n is None:
            changed.append(f"'{name}' disappeared")
            continue
        if _qdq_signature(n) == sig:
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


def _share_input_params(graph: ir.Graph, islands: list[str]) -> list[str]:
    """For island data-movement ops reading a DequantizeLinear directly: quantize each float output with
    the parameters of that DequantizeLinear (or of the QuantizeLinear the output already has) - what
    onnxruntime's parameter sharing produces, done here because its quantizer loops forever when the
    shared input is an already dequantized tensor. Edits ``graph``; returns the nodes handled."""
    shared_ops = _ort_shared_param_ops()
    island_set = set(islands)
    done: list[str] = []
    ed = Editor(graph, rule_id="requantize_islands", anchor=None, provenance={})
    out_names = {t.name for t in graph.outputs}
    for node in list(graph.nodes):
        if node.name not in island_set or node.op not in shared_ops or not node.inputs:
            continue
        x = node.inputs[0]
        dq = x.inputs[0] if x.inputs else None
        if dq is None or dq.op != "DequantizeLinear":
            continue
        s, z = qparams(dq)
        if s is None or z is None or np.size(s) != 1:
            continue
        for o in [o for o in node.outputs if o.name]:
            qs = [c for c in o.outputs if c.op == "QuantizeLinear"]
            others = [c for c in o.outputs if c.op != "QuantizeLinear"]
            is_out = o.name in out_names
            if qs and not others and not is_out:
                continue
            src = qs[0] if qs else dq
            params = list(src.inputs[1:3]) if len(src.inputs) > 2 else [src.inputs[1], ir.Variable.empty()]
            q_out = ir.Variable(ed.name(o.name + "_QuantizeLinear_Output"))
            dq_out = ir.Variable(ed.name(o.name + "_DequantizeLinear_Output"))
            pre = o
            if is_out:  # keep the graph output's name on the DequantizeLinear
                pre = ir.Variable(ed.name(o.name + "_QuantizeLinear_Input"))
                node.outputs[list(node.outputs).index(o)] = pre
                dq_out = o
            for c in others:
                for k, i in enumerate(c.inputs):
                    if i is o:
                        c.inputs[k] = dq_out
            if is_out:
                for q in qs:
                    q.inputs[0] = pre
            idx = graph.nodes.index(node) + 1
            ed.node("QuantizeLinear", [pre, *params], [q_out], base=o.name + "_QuantizeLinear", at=idx)
            ed.node("DequantizeLinear", [q_out, *params], [dq_out], base=o.name + "_DequantizeLinear", at=idx + 1)
        done.append(node.name)
    return done


def _qdq_signature(node: ir.Node) -> tuple:
    s, z = qparams(node)
    return (node.op,
            None if s is None else (str(s.dtype), tuple(np.asarray(s).reshape(-1).tolist())),
            None if z is None else (str(z.dtype), tuple(np.asarray(z).reshape(-1).tolist())),
            node.attrs.get("axis", 1) if s is not None and np.size(s) > 1 else None)


def _collapse_requantize_chains(graph: ir.Graph) -> int:
    """``Q2 -> DQ -> Q`` with identical parameters: Q reads Q2's input directly (exact on int8 values)."""
    count = 0
    for q in graph.nodes:
        if q.op != "QuantizeLinear":
            continue
        x = q.inputs[0]
        dq = x.inputs[0] if x.inputs else None
        if dq is None or dq.op != "DequantizeLinear":
            continue
        y = dq.inputs[0]
        q2 = y.inputs[0] if y.inputs else None
        if q2 is None or q2.op != "QuantizeLinear":
            continue
        sig = _qdq_signature(q)[1:]
        if _qdq_signature(dq)[1:] == sig and _qdq_signature(q2)[1:] == sig:
            q.inputs[0] = q2.inputs[0]
            count += 1
    return count
