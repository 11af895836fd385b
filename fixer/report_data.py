"""The data the library writes: the JSON dicts of an analysis and a fix, the C header of a fix's
integer edges and the estimate note. No rendering here (:mod:`fixer.report` renders; it sits above
:mod:`fixer.api` and the zoo worker, which only need this data)."""

from __future__ import annotations

from typing import Any

from . import __version__, escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: rendering a report read back (a cache hit) needs no analysis stack
    from .results import FixResult, ModelAnalysis

ESTIMATE_NOTE = (
    "Epoch counts, HW ratios and memory figures are estimated by nafix's placement model "
    "(not measured by stedgeai)."
)


def analysis_dict(a: ModelAnalysis) -> dict[str, Any]:
    sw_nodes = a.sw_nodes()
    by_name = a.placement.by_name
    for n in sw_nodes:  # the failing requirements one by one; an epoch stedgeai inserts gives its lowering
        p = by_name.get(n["name"])
        if p is not None and p.unit == "SW":
            n["why"] = [{"constraint": r.constraint, "requirement": r.requirement, "detail": r.detail, "tag": r.tag}
                        for r in p.reasons]
        else:
            n["why"] = [{"constraint": c, "tag": t, "detail": d,
                         "requirement": f"stedgeai lowers the node with an inserted {op} epoch"}
                        for c, t, d, op in zip(n["constraints"], n["tags"], n["reasons"], n["reported_as"])]
    notes = a.notes()
    note_reasons = [r for n in a.placement.nodes for r in n.notes]
    for d, r in zip(notes, note_reasons):
        d.update({"requirement": r.requirement, "detail": r.detail, "tag": r.tag})
    return {
        "estimate": a.estimate.as_dict(),
        "sw_nodes": sw_nodes,
        "notes": notes,
        "findings": [
            {"constraint": r.constraint, "requirement": r.requirement, "detail": r.detail, "tag": r.tag,
             "severity": r.severity}
            for r in a.findings
        ],
        "memory": a.memory.as_dict(),
        "dynamic_dims": [d.describe() for d in a.loaded.dynamic_dims],
        "warnings": list(a.loaded.warnings),
        **_import_dict(a.loaded),
        "oe_export": a.placement.oe_export,
        "epochs": [{"index": g.index, "unit": g.unit, "nodes": g.nodes,
                    **({"reported_as": g.reported_as} if g.unit != "HW" else {}),
                    **({"ms": a.estimate.latency.epoch_ms[i]} if a.estimate.latency is not None else {})}
                   for i, g in enumerate(a.estimate.groups)],
    }


#: a model's build status, worst first: stedgeai rejects it, it compiles but hangs the board, neither known
STATUSES = ("compile_error", "hang", "ok")


def row_status(row: dict[str, Any]) -> str | None:
    """The build status of an audit row (:data:`STATUSES`) from its findings' severities: a predicted
    compile error wins over a predicted board hang; None for an error row (not analysed)."""
    if row.get("error") or row.get("estimate") is None:
        return None
    if row.get("status") in STATUSES:
        return row["status"]
    severities = {f.get("severity") for f in row.get("findings") or ()}
    return next((s for s in STATUSES[:2] if s in severities), "ok")


def error_row(path: str, message: str, sha256: str | None = None) -> dict[str, Any]:
    """The audit row of a model that could not be analysed."""
    return {"path": path, "sha256": sha256, "error": message, "estimate": None, "sw_nodes": [], "memory": None}


def audit_row(m, *, path: str | None = None, sha256: str | None = None) -> dict[str, Any]:
    """The audit row (``nafix audit --format json``) of one :class:`~fixer.results.ModelAudit`: its
    analysis, build status and ``--quantize`` estimate, or its error (``path``: as the caller names it,
    default the model's)."""
    path = str(m.path) if path is None else path
    if m.analysis is None:
        return error_row(path, m.error or "error", sha256)
    row: dict[str, Any] = {"path": path, "sha256": sha256, "error": None}
    row.update(analysis_dict(m.analysis))
    row["status"] = row_status(row)
    row["quantize"] = m.quantize
    if m.quantize and m.quantize.get("kind") == "float_islands":
        from .rule_index import rules_fixing

        # the default rules that rewrite some of these SW nodes without calibration (NAF018's float
        # slopes and weights, ...): plain `nafix MODEL` runs them first, --quantize is for the rest
        row["quantize"] = {**m.quantize, "plain_rules": sorted({
            r.id for n in row.get("sw_nodes") or () for c in n.get("constraints") or () for r in rules_fixing(c)
            if not r.opt_in})}
    return row


def _import_dict(loaded) -> dict[str, Any]:
    imp = getattr(loaded, "imported", None)
    if imp is None:
        return {"source_format": "onnx"}
    check = imp.check.as_dict() if imp.check is not None else None
    return {"source_format": imp.source_format, "import_check": check}


def _const(model, name):
    import onnx

    for t in model.graph.initializer:
        if t.name == name:
            return onnx.numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output[0] == name and n.attribute:
            return onnx.numpy_helper.to_array(n.attribute[0].t)
    return None


def _qparams(model, node):
    import numpy as np

    s = _const(model, node.input[1])
    z = _const(model, node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
    if s is None or z is None:
        return None, None, None
    conv = (lambda a: a.reshape(-1)[0].item()) if np.size(s) == 1 else (lambda a: a.reshape(-1).tolist())
    return conv(np.asarray(s, dtype=np.float64)), conv(np.asarray(z).astype(np.int64)), np.asarray(z).dtype.name


def _type_text(tp) -> str:
    """A value type as text: numpy dtype name of a tensor, seq(...)/map(...)/optional(...) otherwise."""
    import onnx

    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        try:
            return onnx.helper.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type).name
        except (KeyError, ValueError, TypeError):
            return onnx.TensorProto.DataType.Name(tp.tensor_type.elem_type).lower() if tp.tensor_type.elem_type in \
                onnx.TensorProto.DataType.values() else "unknown"
    if kind == "sequence_type":
        return f"seq({_type_text(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_type_text(tp.optional_type.elem_type)})"
    if kind == "map_type":
        key = onnx.TensorProto.DataType.Name(tp.map_type.key_type).lower()
        return f"map({key}, {_type_text(tp.map_type.value_type)})"
    return kind or "unknown"


def edge_io(model) -> dict[str, list[dict[str, Any]]]:
    """Graph inputs and outputs with dtype, and scale/zero_point wherever the edge is quantized:
    an int8/uint8 edge (the values are (q - zero_point) * scale), or a float edge that a
    QuantizeLinear/DequantizeLinear converts right at the boundary."""
    import onnx

    init_names = {t.name for t in model.graph.initializer}
    consumers: dict[str, list] = {}
    producers = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
        for o in n.output:
            producers[o] = n

    def dtype_of(vi):
        return _type_text(vi.type)

    def shape_of(vi):
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]

    ins, outs = [], []
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        row = {"name": vi.name, "dtype": dtype_of(vi), "shape": shape_of(vi), "scale": None, "zero_point": None}
        for c in consumers.get(vi.name, []):
            if c.op_type in ("QuantizeLinear", "DequantizeLinear") and c.input[0] == vi.name:
                row["scale"], row["zero_point"], qtype = _qparams(model, c)
                if c.op_type == "QuantizeLinear":
                    row["quantized_inside_as"] = qtype
                break
        ins.append(row)
    for vi in model.graph.output:
        row = {"name": vi.name, "dtype": dtype_of(vi), "shape": shape_of(vi), "scale": None, "zero_point": None}
        p = producers.get(vi.name)
        if p is not None and p.op_type in ("QuantizeLinear", "DequantizeLinear"):
            row["scale"], row["zero_point"], _ = _qparams(model, p)
        outs.append(row)
    return {"inputs": ins, "outputs": outs}


def edge_params(change) -> tuple[float, int]:
    """(scale, zero-point) of an interface change as the C header writes them (the first of per-axis lists)."""
    scale = change.scale if not isinstance(change.scale, (list, tuple)) else change.scale[0]
    zp = change.zero_point if not isinstance(change.zero_point, (list, tuple)) else change.zero_point[0]
    return float(scale), int(zp)


def _with_io_changes(io: dict, changes) -> dict:
    """``edge_io``'s rows with the scale and zero-point of every edge nafix made integer, as the C header
    has them: read off the interface changes, not the graph (an int8 output behind a Reshape that NAF004
    moved onto the int8 data has no QuantizeLinear at the edge to read them from)."""
    for c in changes:
        rows = io["inputs"] if c.kind == "input" else io["outputs"]
        for row in rows:
            if row["name"] == c.name:
                row["scale"], row["zero_point"] = edge_params(c)
    return io


def near_misses(result) -> list:
    """The fix's near-misses, most estimated ms at stake first: the rule engine's, and the float-stage
    rewrites of --quantize that the guard did not keep (estimated slower once quantized)."""
    from .engine import rank_near_misses

    pre = getattr(result, "pre_engine", None)
    refused = [n for n in pre.near_misses if n.ms_after is not None] if pre is not None else []
    return rank_near_misses(list(result.engine.near_misses) + refused) if refused else list(result.engine.near_misses)


def _near_ms(n) -> dict[str, Any]:
    """A near-miss's estimated figures (ms), where it has them."""
    out: dict[str, Any] = {}
    if n.ms_before is not None and n.ms_after is not None:
        out.update(ms_before=round(n.ms_before, 3), ms_after=round(n.ms_after, 3))
    elif n.node_ms is not None:
        out["node_ms"] = round(n.node_ms, 3)
    if n.ms_saved is not None:
        out["ms_saved"] = round(n.ms_saved, 3)
    return out


def fix_dict(result: FixResult) -> dict[str, Any]:
    before = result.before
    after = result.final
    v = result.verification
    model = result.engine.model if result.changed else result.before.loaded.model
    return {
        "nafix_version": __version__,
        "input": str(result.input),
        "output": str(result.output) if result.output else None,
        "written": result.written,
        "dry_run": getattr(result, "dry_run", False),
        "profile": before.profile.name,
        "estimated": True,
        "note": ESTIMATE_NOTE,
        "estimate": {"before": before.estimate.as_dict(), "after": after.estimate.as_dict()},
        # the rules that changed the model, most estimated ms saved first, and their changes in that order
        "rules": [{"rule": r, "changes": sum(1 for c in result.engine.changes if c.rule == r),
                   "ms_saved": None if ms is None else round(ms, 3)} for r, ms in result.engine.rules_ranked],
        "changes": [{"rule": c.rule, "node": c.node, "op_type": c.op_type, "detail": c.detail,
                     "new_nodes": list(c.new_nodes)} for c in result.engine.changes_ranked()],
        # ranked by estimated ms saved (ms_before -> ms_after where the guard estimated the change,
        # else the node's SW/hybrid epochs: the most a rewrite there could save)
        "near_misses": [{"rule": n.rule, "node": n.node, "op_type": n.op_type, "reason": n.reason,
                         **_near_ms(n)} for n in near_misses(result)],
        "verification": v.as_dict() if v is not None else {"ok": True, "outputs": [], "contract": None,
                                                             "detail": "nothing changed, nothing to verify"},
        "io": _with_io_changes(edge_io(model), result.engine.io_changes),
        "io_changes": [{"kind": c.kind, "name": c.name, "dtype": c.dtype, "scale": c.scale,
                        "zero_point": c.zero_point, "was": c.was} for c in result.engine.io_changes],
        "remaining_sw_nodes": after.sw_nodes(),
        "findings": [{"constraint": r.constraint, "detail": r.detail, "severity": r.severity, "tag": r.tag}
                     for r in after.findings],
        "memory": {"before": before.memory.as_dict(), "after": after.memory.as_dict()},
        "rules_run": result.rules_run,
        "warnings": result.warnings,
        "advice": list(getattr(result, "advice", ())),
        **({"quantize_estimate": result.quantize_estimate} if getattr(result, "quantize_estimate", None) else {}),
        **({"static_shape": result.static_shape} if getattr(result, "static_shape", None) else {}),
        "source_format": {"before": _import_dict(before.loaded)["source_format"], "after": "onnx"},
        **({"import_check": before.loaded.imported.check.as_dict()}
           if getattr(before.loaded, "imported", None) is not None and before.loaded.imported.check is not None
           else {}),
        **({"fixed_vs_tflite": [o.as_dict() for o in result.source_check]}
           if getattr(result, "source_check", None) else {}),
        **({"stedgeai": result.compiled.as_dict()} if getattr(result, "compiled", None) is not None else {}),
        **({"quantization": result.quantization} if getattr(result, "quantization", None) is not None else {}),
        **({"accuracy_failure": result.accuracy_failure} if getattr(result, "accuracy_failure", None) else {}),
    }


def fix_header(result, header_path) -> str:
    """A C header with the scale and zero-point of every graph edge nafix made integer. Names from
    the model reach it only through :func:`fixer.escape.c_comment` (inside comments) and
    :func:`fixer.escape.c_identifier` (macro and type names: valid, unique in the file)."""
    taken: set[str] = set()
    guard = escape.c_identifier(header_path.name)
    if guard.startswith(("NAFIX_IN_", "NAFIX_OUT_")):  # never one of the edge macros below
        guard = "HEADER_" + guard
    taken.add(guard)
    model_name = escape.c_comment(result.output.name) if result.output else "the fixed model"
    lines = [
        f"/* Generated by nafix {__version__} for {model_name}.",
        " * Integer graph edges: real_value = (q - ZERO_POINT) * SCALE; q = round(real_value / SCALE) + ZERO_POINT",
        " * (round half to even, saturated to the type's range). */",
        f"#ifndef {guard}", f"#define {guard}", "", "#include <stdint.h>", "",
    ]
    for c in result.engine.io_changes:
        base = escape.c_identifier(f"NAFIX_{'IN' if c.kind == 'input' else 'OUT'}_{c.name}", taken=taken)
        scale, zp = edge_params(c)
        ctype = escape.c_identifier(f"{c.dtype}_t", upper=False)
        lines += [
            f"/* {escape.c_comment(c.kind)} '{escape.c_comment(c.name)}': {escape.c_comment(c.dtype)} "
            f"(was {escape.c_comment(c.was)}) */",
            f"#define {base}_SCALE {float(scale)!r}f",
            f"#define {base}_ZERO_POINT ({int(zp)})",
            f"typedef {ctype} {base.lower()}_t;",
            "",
        ]
    lines += [
        "static inline float nafix_dequantize(int32_t q, float scale, int32_t zero_point)",
        "{", "    return (float)(q - zero_point) * scale;", "}", "",
        f"#endif /* {guard} */", "",
    ]
    return "\n".join(lines)
