"""Report data and renderings (JSON, Markdown, console tables). No printing here: renderers return
strings or rich renderables; the CLI decides where they go."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from . import __version__, escape
from .results import AuditResult, FixResult, ModelAnalysis

ESTIMATE_NOTE = (
    "Epoch counts, HW ratios and memory figures are estimated by nafix's placement model "
    "(not measured by stedgeai)."
)


def _t(text: str, style: str | None = None, *, no_wrap: bool = False):
    """One line of console text as a ``rich.text.Text``: never Rich markup, and every untrusted part
    (names, messages) escaped for a terminal or CI log by :func:`fixer.escape.terminal` (the whole
    line goes through it: nafix's own words hold nothing it changes). ``no_wrap`` keeps a table
    title on one line, so no part of a name can start a line of its own."""
    from rich.text import Text

    return Text(escape.terminal(text), style=style or "", no_wrap=no_wrap, overflow="ignore" if no_wrap else None)


def kib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024:,.1f} KiB"


def ms_text(ms: float | None) -> str:
    """An estimated time in ms for a table cell or sentence ("-" when not estimated)."""
    if ms is None:
        return "-"
    return f"{ms:,.3f}" if ms < 10 else f"{ms:,.1f}"


def ms_change(before: float | None, after: float | None) -> str:
    """"estimated time B ms -> A ms (-x.x %)", or "" when either side was not estimated."""
    if before is None or after is None:
        return ""
    pct = f" ({(after - before) / before:+.1%})" if before > 0 else ""
    return f"estimated time {ms_text(before)} ms -> {ms_text(after)} ms{pct}"


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


_FORMAT_LABELS = {"tflite": "TFLite", "onnx": "ONNX"}


def _import_dict(loaded) -> dict[str, Any]:
    imp = getattr(loaded, "imported", None)
    if imp is None:
        return {"source_format": "onnx"}
    check = imp.check.as_dict() if imp.check is not None else None
    return {"source_format": imp.source_format, "import_check": check}


def audit_dict(result: AuditResult, *, profile: str) -> dict[str, Any]:
    """The JSON report of an in-process ``fixer.api.audit`` result (same shape as ``nafix audit``)."""
    from .zoo.runner import build_report
    from .zoo.worker import error_row

    rows = []
    for m in result.models:
        if m.analysis is not None:
            rows.append({"path": str(m.path), "sha256": None, "error": m.error, **analysis_dict(m.analysis)})
        else:
            rows.append(error_row(str(m.path), m.error or "error"))
    return build_report(rows, profile=profile)


def _name(row: dict[str, Any]) -> str:
    return Path(row["path"]).name


def _sw_summary(row: dict[str, Any]) -> str:
    """SW (and hybrid) epochs by the op name the report would print."""
    from collections import Counter

    e = row["estimate"]
    parts = [f"{op} x{n}" for op, n in Counter(e.get("sw_ops") or {}).most_common()]
    parts += [f"{op} x{n} (hybrid)" for op, n in Counter(e.get("hybrid_ops") or {}).most_common()]
    return ", ".join(parts) or "-"


def _ok(row: dict[str, Any]) -> bool:
    return not row.get("error") and row.get("estimate") is not None


def audit_markdown(report: dict[str, Any]) -> str:
    """Markdown rendering of the JSON audit report."""
    from .outputs import text_mark

    rows = report["models"]
    lines = [f"# nafix audit (profile {_md(report['profile'])})", "", text_mark(report.get("nafix_version")), "",
             f"_{ESTIMATE_NOTE}_", "",
             "| model | est. epochs | est. SW epochs | est. HW ratio | est. ms | SW ops | peak activations | fits on-chip |",
             "|---|---|---|---|---|---|---|---|"]
    for m in rows:
        if not _ok(m):
            lines.append(f"| {_mdc(m['path'])} | error | | | | {_md(m['error'] or 'error')} | | |")
            continue
        e, mem = m["estimate"], m["memory"]
        lines.append(
            f"| {_mdc(_name(m))} | {e['epochs']} | {e['sw_epochs']} | {e['hw_ratio']:.1%} | {ms_text(e.get('latency_ms'))} | "
            f"{_md(_sw_summary(m))} | "
            f"{kib(mem['peak_activation_bytes'])} | {'yes' if mem['fits_on_chip'] else '**no**'} |"
        )
    for m in rows:
        if not _ok(m):
            continue
        lines += ["", f"## {_md(_name(m))}", ""]
        sw = m["sw_nodes"]
        if sw:
            lines += ["| node | op | est. epochs | why it runs in SW |", "|---|---|---|---|"]
            for n in sw:
                why = "<br>".join(_md(r) for r in n["reasons"])
                lines.append(f"| {_mdc(n['name'])} | {_md(n['op_type'])} | {_epochs_cell(n)} | {why} |")
        else:
            lines.append("No SW node predicted.")
        for r in m["findings"]:
            lines.append(f"- **{_md(r['severity'])}**: {_md(r['requirement'])} ({_md(r['detail'])}) [{_md(r['tag'])}]")
        for n in m.get("notes") or []:
            lines.append(f"- note on {escape.markdown_code(n['name'])}: {_md(n['note'])}")
        mem = m["memory"]
        lines.append(
            f"- memory (estimated): weights {kib(mem['weights_bytes'])}, peak activations "
            f"{kib(mem['peak_activation_bytes'])} at {escape.markdown_code(mem['peak_at'])}, on-chip capacity "
            f"{kib(mem['onchip_activation_capacity_bytes'])}"
        )
    if len(rows) > 1 and report.get("summary"):
        lines += ["", "## Zoo summary (estimated)", ""] + [f"- {_md(t)}" for t in summary_lines(report["summary"])]
    return "\n".join(lines) + "\n"


def _md(s: Any) -> str:
    """Untrusted text in a Markdown cell, list item or heading (:func:`fixer.escape.markdown`)."""
    return escape.markdown(s)


def _mdc(s: Any) -> str:
    """A name as inline code in a Markdown table cell (:func:`fixer.escape.markdown_code`)."""
    return escape.markdown_code(s, table=True)


def _epochs_cell(n: dict[str, Any]) -> str:
    """A SW-node row's estimated epochs: "2 SW", "1 hybrid", "1 SW + 1 hybrid", or the epoch it runs in."""
    parts = [f"{_entry_epochs(n, u)} {u}" for u in ("SW", "hybrid") if _entry_epochs(n, u)]
    if parts:
        return " + ".join(parts)
    return f"0 (in epoch {n['in_epoch']})" if "in_epoch" in n else "0"


def model_summary_line(path_name: str, a: ModelAnalysis) -> str:
    return row_summary_line(path_name, {"estimate": a.estimate.as_dict(), "memory": a.memory.as_dict()})


def row_summary_line(path_name: str, row: dict[str, Any]) -> str:
    e, mem = row["estimate"], row["memory"]
    fit = "fits on-chip" if mem["fits_on_chip"] else f"does NOT fit on-chip ({kib(mem['onchip_activation_capacity_bytes'])})"
    hyb = f", {e['hybrid_epochs']} hybrid" if e.get("hybrid_epochs") else ""
    ms = f", estimated time {ms_text(e['latency_ms'])} ms" if e.get("latency_ms") is not None else ""
    return (f"{path_name}: estimated {e['epochs']} epochs, {e['sw_epochs']} SW{hyb}, core {e.get('core') or '?'}, "
            f"HW ratio {e['hw_ratio']:.1%}{ms}; "
            f"weights {kib(mem['weights_bytes'])}, peak activations {kib(mem['peak_activation_bytes'])} ({fit})")


class ReasonGroup(NamedTuple):
    """SW (or hybrid) epochs of one report row that fail the same requirement(s), or notes."""

    unit: str  # SW | hybrid | note
    requirement: str  # the first failing requirement of its nodes
    tag: str
    items: list[tuple[str, str, str]]  # (node, op, detail): one per node
    epochs: int  # estimated epochs of its nodes (notes: how many)
    more: tuple[tuple[str, str], ...] = ()  # (requirement, tag) its nodes also fail


def _entry_epochs(n: dict[str, Any], unit: str) -> int:
    """The estimated epochs of unit ``unit`` a row's SW-node entry accounts for (a report without the
    counts: one of its own unit)."""
    key = "sw_epochs" if unit == "SW" else "hybrid_epochs"
    if key in n:
        return int(n[key])
    return 1 if (n.get("unit") or "SW") == unit else 0


def grouped_row_reasons(row: dict[str, Any], *, notes: bool = False) -> list[ReasonGroup]:
    """SW/hybrid epochs (or notes) of a report row grouped by unit and the requirements their nodes
    fail: each node is in one group per unit, with all its failing requirements, so the groups
    partition the row's SW and hybrid epochs (a node making two epochs counts two, one run inside
    another node's epoch counts none, and the sums equal the estimate's totals)."""
    groups: dict[tuple, list] = {}
    if notes:
        for n in row.get("notes") or []:
            groups.setdefault(("note", ((n["requirement"], n["tag"]),)), []).append(
                ((n["name"], n["op_type"], n["detail"]), 1))
    else:
        owner = {i: n["name"] for n in row.get("sw_nodes") or [] for i in n.get("epochs") or []}
        for n in row.get("sw_nodes") or []:
            why = n.get("why") or [{"requirement": r, "tag": "", "detail": r} for r in n.get("reasons") or []]
            if not why:
                continue
            reqs = tuple(dict.fromkeys((w["requirement"], w["tag"]) for w in why))
            detail = "; ".join(w["detail"] for w in why)
            units = [u for u in ("SW", "hybrid") if _entry_epochs(n, u)] or [n.get("unit") or "SW"]
            for unit in units:
                k = _entry_epochs(n, unit)
                more = ""
                if "in_epoch" in n and not k:
                    host = owner.get(n["in_epoch"])
                    more = f" (runs in estimated epoch {n['in_epoch']}" + (f", counted with '{host}')" if host else ")")
                elif k != 1:
                    more = f" ({k} estimated epochs)"
                groups.setdefault((unit, reqs), []).append(((n["name"], n["op_type"], detail + more), k))
    return [ReasonGroup(unit, reqs[0][0], reqs[0][1], [i for i, _ in its], sum(k for _, k in its), reqs[1:])
            for (unit, reqs), its in groups.items()]


def summary_lines(s: dict[str, Any]) -> list[str]:
    """The zoo summary as sentences (console, Markdown, HTML, GitHub annotations)."""
    out = [f"{s['audited']} of {s['models']} models audited, {s['failed']} failed; "
           f"{s['with_sw']} with estimated SW epochs."]
    h = s["hw_ratio"]
    if h["median"] is not None:
        dist = ", ".join(f"{d['range']}: {d['models']}" for d in h["distribution"])
        out.append(f"estimated HW ratio: min {h['min']:.1%}, median {h['median']:.1%}, max {h['max']:.1%} ({dist}).")
    top = s["sw_op_types"][:5]
    if top and any(o.get("ms") is not None for o in top):
        out.append("SW op types costing the most estimated time: "
                   + ", ".join(f"{o['op_type']} {ms_text(o.get('ms'))} ms ({o['sw_epochs']} epochs) in {o['models']} model(s)"
                               for o in top) + ".")
    elif top:
        out.append("SW op types costing the most estimated epochs: "
                   + ", ".join(f"{o['op_type']} {o['sw_epochs']} epochs in {o['models']} model(s)" for o in top) + ".")
    for r in s["rules"][:5]:
        epochs = f", {r['epochs']} estimated SW/hybrid epochs" if r.get("epochs") is not None else ""
        out.append(f"{r['rule']} {r['name']} addresses SW nodes or findings in {r['models']} model(s) "
                   f"({r['sw_nodes']} SW nodes{epochs}): run `{r['command']}`.")
    return out


def audit_renderables(report: dict[str, Any], *, verbose: bool = False):
    """Rich renderables for the console audit report: a summary table, then per model the SW nodes
    grouped by the requirement they fail (each requirement printed once), then the zoo summary."""
    from rich.table import Table

    rows = report["models"]
    out: list[Any] = []
    summary = Table(title=_t(f"nafix audit - profile {report['profile']} (estimated)", no_wrap=True), expand=False)
    for col, just in (("model", "left"), ("epochs", "right"), ("SW", "right"), ("HW ratio", "right"),
                      ("est. ms", "right"), ("SW ops", "left"), ("peak act.", "right"), ("on-chip", "center")):
        summary.add_column(col, justify=just, overflow="fold")
    for m in rows:
        if not _ok(m):
            summary.add_row(_t(_name(m)), "-", "-", "-", "-", _t(m.get("error") or "error", style="red"), "-", "-")
            continue
        e, mem = m["estimate"], m["memory"]
        summary.add_row(
            _t(_name(m)), str(e["epochs"]), str(e["sw_epochs"]), f"{e['hw_ratio']:.1%}", ms_text(e.get("latency_ms")),
            _t(_sw_summary(m)),
            kib(mem["peak_activation_bytes"]), "yes" if mem["fits_on_chip"] else _t("NO", style="bold red"),
        )
    out.append(summary)
    for m in rows:
        if not _ok(m):
            continue
        out.append(_t(""))
        out.append(_t(row_summary_line(_name(m), m), style="bold"))
        for grp in grouped_row_reasons(m):
            unit, req, tag, items = grp[:4]
            out.append(_t(f"  {unit} x{grp.epochs}: {req} [{tag}]", style="yellow"))
            for also, also_tag in grp.more:
                out.append(_t(f"    and: {also} [{also_tag}]", style="yellow"))
            shown = items if verbose else items[:6]
            for name, op, detail in shown:
                out.append(_t(f"      {detail}"))
            if len(shown) < len(items):
                out.append(_t(f"      ... and {len(items) - len(shown)} more (--verbose lists all)", style="dim"))
        for r in m["findings"]:
            style = "red" if r["severity"] == "compile_error" else "yellow"
            label = {"compile_error": "COMPILE ERROR", "hang": "BOARD HANG", "note": "NOTE"}.get(r["severity"], r["severity"])
            out.append(_t(f"  {label}: {r['requirement']} ({r['detail']}) [{r['tag']}]", style=style))
        if verbose:
            for _, req, tag, items, *_ in grouped_row_reasons(m, notes=True):
                out.append(_t(f"  note x{len(items)}: {req} [{tag}]", style="dim"))
                for name, op, detail in items:
                    out.append(_t(f"      {detail}", style="dim"))
    if len(rows) > 1 and report.get("summary"):
        out.append(_t(""))
        out.append(_t("zoo summary (estimated):", style="bold"))
        for line in summary_lines(report["summary"]):
            out.append(_t(f"  {line}"))
    out.append(_t(""))
    out.append(_t(ESTIMATE_NOTE, style="dim"))
    return out


def quantization_renderables(q: dict, result):
    """What --quantize did: calibration, accuracy per output, the worst tensors."""
    out: list[Any] = []
    kind = q.get("input_kind")
    cal = q.get("calibration")
    what = {"float": "float model quantized with onnxruntime (int8 activations, int8 symmetric per-channel weights)",
            "uint8": "uint8 activations converted to int8", "qdq": "float islands quantized, existing scales kept"}
    out.append(_t(f"quantization: {what.get(kind, kind)}; calibration: {cal}"
                    + (f" ({q['samples']} samples)" if q.get("samples") and cal != "none" else ""), style="bold"))
    if cal == "random":
        out.append(_t("  WARNING: calibrated on random data; pass --calib with real samples", style="bold red"))
    pre = getattr(result, "pre_engine", None)
    if pre is not None and pre.changes:
        out.append(_t(f"  float rewrites before quantization ({len(pre.changes)}):"))
        for c in pre.changes:
            out.append(_t(f"    {c.rule} '{c.node}' ({c.op_type}): {c.detail}"))
    if q.get("accuracy_samples") and q.get("outputs"):
        out.append(_t(f"  accuracy on the first {q['accuracy_samples']} sample(s):"))
    for o in q.get("outputs", []):
        out.append(_t(f"  {o['name']}: cosine {o['cosine']:.5f}, SNR {o['snr_db']:.1f} dB, max abs error "
                        f"{o['max_abs_error']:.3g} (quantized vs original)"))
    worst = q.get("worst_tensors", [])[:3]
    if worst:
        out.append(_t("  lowest SQNR: " + ", ".join(f"{w['tensor']} {w['sqnr_db']:.1f} dB" for w in worst), style="dim"))
    for p in q.get("problems", []):
        out.append(_t(f"  problem: {p}", style="yellow"))
    return out


def comparison_renderables(comp):
    """Measured before/after epochs from stedgeai, and where the estimate disagreed."""
    from rich.table import Table

    out: list[Any] = []
    t = Table(title=_t(f"stedgeai {comp.version} (measured)", no_wrap=True), expand=False)
    for col in ("", "epochs", "SW epochs", "hybrid", "HW ratio", "SW ops"):
        t.add_column(col)
    for cm in (comp.before, comp.after):
        if cm is None:
            continue
        rep = cm.result.report
        if rep is None:
            t.add_row(_t(cm.label), "-", "-", "-", "-", _t("compile failed" if not cm.result.ok else "no report", style="red"))
        else:
            t.add_row(_t(cm.label), str(rep.epochs), str(rep.sw_epochs), str(rep.hybrid_epochs if rep.hybrid_epochs is not None else 'n/a'), f"{rep.hw_ratio:.1%}",
                      _t(", ".join(rep.sw_ops) or "-"))
    out.append(t)
    for cm in (comp.before, comp.after):
        if cm is None:
            continue
        out.extend(_compiled_details(cm))
    out.append(_t("real HW-epoch ratio " + ("increased (or was already 100 %)" if comp.improved else "did NOT increase"),
                    style="green" if comp.improved else "bold red"))
    return out


def _compiled_details(cm):
    out = []
    for k in cm.result.known_errors:
        out.append(_t(f"  {cm.label}: {k.code}: {k.cause} -> fix: {k.fix}", style="yellow"))
    for p in cm.result.problems:
        out.append(_t(f"  {cm.label}: {p}", style="yellow"))
    rep = cm.result.report
    if rep is not None:
        for pool in rep.memory:
            out.append(_t(f"  {cm.label}: {pool.name} {kib(pool.used_bytes)} / {kib(pool.total_bytes)}", style="dim"))
    if cm.disagreements:
        out.append(_t(f"  {cm.label}: where nafix's estimate disagreed with stedgeai:", style="bold"))
        for d in cm.disagreements:
            if d["what"] == "node":
                out.append(_t(f"    node '{d['node']}' ({d['op']}): predicted {d['predicted']}, actual {d['actual']}"))
            elif d["what"] == "sw_ops":
                out.append(_t(f"    {d['op']}: predicted {d['predicted']} SW epoch(s), actual {d['actual']}"))
            else:
                out.append(_t(f"    epochs: predicted {d['predicted']}, actual {d['actual']}"))
    return out


def compile_renderables(cm, version, analysis):
    out: list[Any] = []
    rep = cm.result.report
    if rep is not None:
        out.append(_t(f"stedgeai {version} (measured): {rep.epochs} epochs, {rep.sw_epochs} SW, "
                        f"{rep.hybrid_epochs if rep.hybrid_epochs is not None else 'n/a'} hybrid, HW ratio {rep.hw_ratio:.1%}", style="bold"))
        if rep.sw_ops:
            out.append(_t("  SW ops: " + ", ".join(rep.sw_ops)))
    else:
        out.append(_t(f"stedgeai {version}: " + ("compile failed" if not cm.result.ok else "no report found"),
                        style="bold red"))
    e = analysis.estimate
    ms = f", estimated time {ms_text(e.latency_ms)} ms" if e.latency_ms is not None else ""
    out.append(_t(f"nafix estimate: {e.epochs} epochs, {e.sw_epochs} SW, HW ratio {e.hw_ratio:.1%}{ms}", style="dim"))
    out.extend(_compiled_details(cm))
    return out


# ------------------------------------------------------------------------------------------------
# nafix fix
# ------------------------------------------------------------------------------------------------


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
        "profile": before.profile.name,
        "estimated": True,
        "note": ESTIMATE_NOTE,
        "estimate": {"before": before.estimate.as_dict(), "after": after.estimate.as_dict()},
        "changes": [{"rule": c.rule, "node": c.node, "op_type": c.op_type, "detail": c.detail,
                     "new_nodes": list(c.new_nodes)} for c in result.engine.changes],
        "near_misses": [{"rule": n.rule, "node": n.node, "op_type": n.op_type, "reason": n.reason}
                        for n in result.engine.near_misses],
        "verification": v.as_dict() if v is not None else {"ok": True, "outputs": [], "contract": None,
                                                             "detail": "nothing changed, nothing to verify"},
        "io": edge_io(model),
        "io_changes": [{"kind": c.kind, "name": c.name, "dtype": c.dtype, "scale": c.scale,
                        "zero_point": c.zero_point, "was": c.was} for c in result.engine.io_changes],
        "remaining_sw_nodes": after.sw_nodes(),
        "findings": [{"constraint": r.constraint, "detail": r.detail, "severity": r.severity, "tag": r.tag}
                     for r in after.findings],
        "memory": {"before": before.memory.as_dict(), "after": after.memory.as_dict()},
        "rules_run": result.rules_run,
        "warnings": result.warnings,
        "advice": list(getattr(result, "advice", ())),
        "source_format": {"before": _import_dict(before.loaded)["source_format"], "after": "onnx"},
        **({"import_check": before.loaded.imported.check.as_dict()}
           if getattr(before.loaded, "imported", None) is not None and before.loaded.imported.check is not None
           else {}),
        **({"fixed_vs_tflite": [o.as_dict() for o in result.source_check]}
           if getattr(result, "source_check", None) else {}),
        **({"stedgeai": result.compiled.as_dict()} if getattr(result, "compiled", None) is not None else {}),
        **({"quantization": result.quantization} if getattr(result, "quantization", None) is not None else {}),
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
        scale = c.scale if not isinstance(c.scale, list) else c.scale[0]
        zp = c.zero_point if not isinstance(c.zero_point, list) else c.zero_point[0]
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


def fix_renderables(result, *, verbose: bool = False):
    from rich.table import Table

    out: list[Any] = []
    b, a = result.before.estimate, result.final.estimate
    t = Table(title=_t(f"nafix {result.input.name} (estimated by nafix's placement model)", no_wrap=True), expand=False)
    t.add_column("")
    t.add_column("epochs", justify="right")
    t.add_column("SW epochs", justify="right")
    t.add_column("hybrid", justify="right")
    t.add_column("HW ratio", justify="right")
    timed = b.latency_ms is not None and a.latency_ms is not None
    if timed:
        t.add_column("est. ms", justify="right")
    imported = getattr(result.before.loaded, "imported", None)
    src_label = f" ({_FORMAT_LABELS.get(imported.source_format, imported.source_format)})" if imported is not None else ""
    t.add_row("before" + src_label, str(b.epochs), str(b.sw_epochs), str(b.hybrid_epochs), f"{b.hw_ratio:.1%}",
              *([ms_text(b.latency_ms)] if timed else []))
    t.add_row("after (ONNX)" if imported is not None else "after", str(a.epochs), str(a.sw_epochs),
              str(a.hybrid_epochs), f"{a.hw_ratio:.1%}", *([ms_text(a.latency_ms)] if timed else []))
    out.append(t)
    if timed:
        out.append(_t(f"{ms_change(b.latency_ms, a.latency_ms)} per inference (nafix's cost model, not measured)"))
    for line in getattr(result, "advice", ()):
        out.append(_t(f"advice: {line}", style="bold yellow"))
    if imported is not None and imported.check is not None:
        out.append(_t(imported.check.summary(), style="dim"))
    for o in getattr(result, "source_check", None) or []:
        lsb = f"max {o.max_lsb} LSB, " if o.max_lsb is not None else f"max error {o.max_rel:.2%} of its largest magnitude, "
        out.append(_t(f"  fixed model vs TFLite interpreter, {o.name}: {lsb}{o.exact_fraction:.2%} exact"))
    q = getattr(result, "quantization", None)
    if q is not None:
        out.extend(quantization_renderables(q, result))
    if result.engine.changes:
        out.append(_t(f"changes ({len(result.engine.changes)}):", style="bold"))
        for c in result.engine.changes:
            out.append(_t(f"  {c.rule} '{c.node}' ({c.op_type}): {c.detail}"))
    elif q is None:
        out.append(_t("no rule applied: nothing to fix that nafix knows how to fix.", style="bold"))
    v = result.verification
    if v is not None:
        style = "green" if v.ok else "bold red"
        contract_text = v.as_dict()["contract_text"]
        out.append(_t(f"verification: {'PASSED' if v.ok else 'FAILED'} ({contract_text}; "
                        f"{v.samples} {v.inputs} input set(s), rules {', '.join(v.rules)})", style=style))
        for o in v.boundaries:
            out.append(_t(f"  at {o.name}: {o.detail}, {o.bit_exact_fraction:.1%} bit-exact",
                            style=None if o.ok else "red"))
        for o in v.outputs:
            extra = f", {o.bit_exact_fraction:.1%} bit-exact" if o.bit_exact_fraction < 1 else ""
            out.append(_t(f"  {o.name}: max abs error {o.max_abs_error:.3g}, cosine {o.cosine:.6f}{extra}: {o.detail}",
                            style=None if o.ok else "red"))
    for ch in result.engine.io_changes:
        out.append(_t(f"  {ch.kind} '{ch.name}' is now {ch.dtype} (scale {ch.scale}, zero-point {ch.zero_point})"))
    final = result.final
    row = analysis_dict(final)
    sw = row["sw_nodes"]
    if sw:
        e = row["estimate"]
        out.append(_t(f"SW and hybrid epochs that remain ({e['sw_epochs']} SW, {e['hybrid_epochs']} hybrid; "
                        "estimated):", style="bold yellow"))
        for grp in grouped_row_reasons(row):
            unit, req, tag, items = grp[:4]
            out.append(_t(f"  {unit} x{grp.epochs}: {req} [{tag}]", style="yellow"))
            for also, also_tag in grp.more:
                out.append(_t(f"    and: {also} [{also_tag}]", style="yellow"))
            for name, op, detail in (items if verbose else items[:6]):
                out.append(_t(f"      {detail}"))
            if not verbose and len(items) > 6:
                out.append(_t(f"      ... and {len(items) - 6} more (--verbose lists all)", style="dim"))
    for r in final.findings:
        out.append(_t(f"  {r.severity.upper()}: {r.requirement} ({r.detail}) [{r.tag}]", style="yellow"))
    if result.engine.near_misses:
        out.append(_t(f"near-misses ({len(result.engine.near_misses)}): rules that matched but did not apply", style="bold"))
        for n in result.engine.near_misses:
            out.append(_t(f"  {n.rule} '{n.node}' ({n.op_type}): {n.reason}"))
    for w in result.warnings:
        out.append(_t(f"warning: {w}", style="bold red"))
    if result.written:
        files = [str(result.output)] + [str(p) for p in (result.report_path, result.header_path) if p]
        out.append(_t("wrote " + ", ".join(files), style="green"))
    elif result.engine.changes and v is not None and not v.ok:
        out.append(_t("nothing written: verification failed (use --keep-failed to write anyway)", style="bold red"))
    if getattr(result, "compiled", None) is not None:
        out.extend(comparison_renderables(result.compiled))
    out.append(_t(ESTIMATE_NOTE, style="dim"))
    return out


def calibration_table(rows) -> str:
    """``nafix calibrate`` as a Markdown table (real figures from the reports, the rest estimated)."""
    from .calibrate import EPOCH_TOLERANCE, summary

    def ops(d: dict) -> str:
        return " ".join(d) if d else "="

    out = ["| pair | report | core | options | epochs real / est | SW real / est | hybrid real / est "
           "| SW ops (+extra -missing) | hybrid ops | on target |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rep = r.report.split("/", 1)[-1] + (f" (x{r.runs})" if r.runs > 1 else "")
        opts = " ".join(o.replace("--", "") for o in r.options) or "-"
        if not r.estimated:
            out.append(f"| {_md(r.pair)} | {_md(rep)} | {_md(r.core)} | {_md(opts)} | {r.real_epochs} / - | {r.real_sw} / - "
                       f"| {r.real_hybrid if r.real_hybrid is not None else '-'} / - | - | - | {_md(r.status)} |")
            continue
        hy = f"{r.real_hybrid} / {r.est_hybrid}" if r.real_hybrid is not None else f"- / {r.est_hybrid}"
        sw_ops = ops(r.sw_diff()) if r.ops_listed else "(not listed)"
        hy_ops = ops(r.hybrid_diff()) if r.real_hybrid is not None else "-"
        err = r.epoch_error
        out.append(f"| {_md(r.pair)} | {_md(rep)} | {_md(r.core)} | {_md(opts)} | {r.real_epochs} / {r.est_epochs}"
                   f"{f' ({err:+.0%})' if err else ''} | {r.real_sw} / {r.est_sw} | {hy} | {_md(sw_ops)} | {_md(hy_ops)} "
                   f"| {'yes' if not r.failures() else 'no'} |")
    s = summary(rows)
    out.append("")
    out.append(f"{s['on_target']} of {s['estimated']} estimated reports on target (SW op multiset equal, hybrid ops "
               f"equal where the report counts them, estimated epochs within {EPOCH_TOLERANCE:.0%}); "
               f"{s['sw_ops_equal']} with equal SW ops, {s['epochs_within']} with epochs within {EPOCH_TOLERANCE:.0%}; "
               f"{len(s['not_estimated'])} not estimated.")
    return "\n".join(out) + "\n"
