"""Report renderings (Markdown, console tables, the rules' Markdown). No printing here: renderers
return strings or rich renderables; the CLI decides where they go. The data the library writes is
in :mod:`fixer.report_data`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from . import escape
from .report_data import ESTIMATE_NOTE, analysis_dict, near_misses

if TYPE_CHECKING:
    from .results import ModelAnalysis  # annotations only (a report read back needs no analysis stack)
    from .rules import Rule


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


_FORMAT_LABELS = {"tflite": "TFLite", "onnx": "ONNX"}



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


#: the build status of a model (fixer.report_data.row_status) as a table badge
STATUS_BADGE = {"compile_error": "COMPILE ERROR", "hang": "BOARD HANG", "ok": "ok"}


def status_badge(row: dict[str, Any]) -> str:
    """``COMPILE ERROR`` (stedgeai is predicted to reject the model), ``BOARD HANG`` (it compiles but
    is predicted to hang the board), ``ok``; ``error`` for a model not analysed."""
    from .report_data import row_status

    st = row_status(row)
    return STATUS_BADGE[st] if st is not None else "error"


def quantize_line(row: dict[str, Any]) -> str | None:
    """The row's ``--quantize`` advice (what it is estimated to remove), or None."""
    from .quantize_advice import gain_text

    g = row.get("quantize") if _ok(row) else None
    return gain_text(g) if g else None


def audit_markdown(report: dict[str, Any]) -> str:
    """Markdown rendering of the JSON audit report."""
    from .outputs import text_mark

    rows = report["models"]
    lines = [f"# nafix audit (profile {_md(report['profile'])})", "", text_mark(report.get("nafix_version")), "",
             f"_{ESTIMATE_NOTE}_", "",
             "| model | status | est. epochs | est. SW epochs | est. HW ratio | est. ms | SW ops | peak activations | fits on-chip |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in rows:
        if not _ok(m):
            lines.append(f"| {_mdc(m['path'])} | error | | | | | {_md(m['error'] or 'error')} | | |")
            continue
        e, mem = m["estimate"], m["memory"]
        badge = status_badge(m)
        lines.append(
            f"| {_mdc(_name(m))} | {badge if badge == 'ok' else f'**{badge}**'} | {e['epochs']} | {e['sw_epochs']} | "
            f"{e['hw_ratio']:.1%} | {ms_text(e.get('latency_ms'))} | "
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
        if (advice := quantize_line(m)):
            lines.append(f"- **quantize**: {_md(advice)}")
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
    if s.get("compile_errors") or s.get("board_hangs"):
        st = s.get("status") or {}
        parts = []
        for key, label, count in (("compile_error", "a predicted compile error (stedgeai would reject it)",
                                   s.get("compile_errors")),
                                  ("hang", "a predicted board hang", s.get("board_hangs"))):
            if count:
                names = [Path(p).name for p in st.get(key) or ()]
                shown = f": {', '.join(names[:5])}{f' and {len(names) - 5} more' if len(names) > 5 else ''}" if names else ""
                parts.append(f"{count} model(s) with {label}{shown}")
        out.append("; ".join(parts) + ".")
    q = s.get("quantize") or {}
    if q.get("models"):
        ms = f", {ms_text(q['ms_removed'])} ms" if q.get("ms_removed") is not None else ""
        names = [Path(p).name for p in q.get("paths") or ()]
        out.append(f"{q['models']} model(s) ({q['float']} float, {q['float_islands']} with float islands) need "
                   f"`{q['command']}` (calibration data with --calib): it would remove an estimated "
                   f"{q['sw_epochs_removed']} SW epochs{ms} in all; most first: {', '.join(names[:5])}"
                   f"{f' and {len(names) - 5} more' if len(names) > 5 else ''}.")
    for r in s["rules"][:5]:
        epochs = f", {r['epochs']} estimated SW/hybrid epochs" if r.get("epochs") is not None else ""
        ms = f" costing an estimated {ms_text(r['ms'])} ms (at most what it saves)" if r.get("ms") is not None else ""
        out.append(f"{r['rule']} {r['name']} addresses SW nodes or findings in {r['models']} model(s) "
                   f"({r['sw_nodes']} SW nodes{epochs}{ms}): run `{r['command']}`.")
    return out


def audit_renderables(report: dict[str, Any], *, verbose: bool = False):
    """Rich renderables for the console audit report: a summary table, then per model the SW nodes
    grouped by the requirement they fail (each requirement printed once), then the zoo summary."""
    from rich.table import Table

    rows = report["models"]
    out: list[Any] = []
    summary = Table(title=_t(f"nafix audit - profile {report['profile']} (estimated)", no_wrap=True), expand=False)
    for col, just in (("model", "left"), ("status", "left"), ("epochs", "right"), ("SW", "right"),
                      ("HW ratio", "right"), ("est. ms", "right"), ("SW ops", "left"), ("peak act.", "right"),
                      ("on-chip", "center")):
        summary.add_column(col, justify=just, overflow="fold", no_wrap=col == "status")  # a badge stays whole
    for m in rows:
        if not _ok(m):
            summary.add_row(_t(_name(m)), _t("error", style="bold red"), "-", "-", "-", "-",
                            _t(m.get("error") or "error", style="red"), "-", "-")
            continue
        e, mem = m["estimate"], m["memory"]
        badge = status_badge(m)
        summary.add_row(
            _t(_name(m)), _t(badge, style="green" if badge == "ok" else "bold red"), str(e["epochs"]),
            str(e["sw_epochs"]), _t(f"{e['hw_ratio']:.1%}", style="dim" if badge != "ok" else None),
            ms_text(e.get("latency_ms")),
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
        if (advice := quantize_line(m)):
            out.append(_t(f"  QUANTIZE: {advice}", style="bold yellow"))
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
    for text, count in grouped_problems(q.get("problems", [])):
        out.append(_t(f"  problem: {text}", style="yellow"))
    return out


def grouped_problems(problems) -> list[tuple[str, int]]:
    """The quantization problems, those that differ only in the names they quote said once with a count
    ("the weight 'w' of 'conv' (Conv) is quantized per tensor, not per channel (x33: 32 more like it,
    each in the JSON report)"), in first-seen order: (text, count). The JSON report keeps every one."""
    import re

    groups: dict[str, list[str]] = {}
    for p in problems:
        groups.setdefault(re.sub(r"'[^']*'", "'...'", p), []).append(p)
    out = []
    for key, items in groups.items():
        if len(items) == 1:
            out.append((items[0], 1))
        else:
            out.append((f"{items[0]} (x{len(items)}: {len(items) - 1} more like it, each in the JSON report)",
                        len(items)))
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
    dry = getattr(result, "dry_run", False)
    if result.engine.changes:
        ranked = result.engine.rules_ranked
        saved = ", ".join(f"{r} {ms_text(ms)} ms" for r, ms in ranked if ms is not None)
        head = (f"changes nafix would make ({len(result.engine.changes)}; --dry-run)" if dry
                else f"changes ({len(result.engine.changes)})")
        out.append(_t(head + (f", rules by estimated time saved: {saved}" if saved else "") + ":", style="bold"))
        for c in result.engine.changes_ranked():
            out.append(_t(f"  {c.rule} '{c.node}' ({c.op_type}): {c.detail}"))
    elif q is None and getattr(result, "static_shape", None) is None:
        out.append(_t("no rule applied: nothing to fix that nafix knows how to fix.", style="bold"))
    st = getattr(result, "static_shape", None)
    if st is not None:
        shapes = "; ".join(f"{k}={','.join(map(str, v))}" for k, v in st["inputs"].items())
        where = "in the written model" if result.written else "in the model nafix would write"
        out.append(_t(f"static input shape (--input-shape): {shapes} {where}, shapes inferred "
                      f"({'; '.join(st['pinned'])})", style="bold"))
    v = result.verification
    if v is not None:
        style = "green" if v.ok else "bold red"
        contract_text = v.as_dict()["contract_text"]
        where = f"{v.samples} {v.inputs} input set(s), rules {', '.join(v.rules)}"
        if v.ok:
            out.append(_t(f"verification: PASSED ({contract_text}; {where})", style=style))
        else:  # what failed first, then what was required (the contract is not what happened)
            out.append(_t(f"verification: FAILED: {v.failure()} (required: {contract_text}; {where})", style=style))
        for o in v.boundaries:
            out.append(_t(f"  at {o.name}: {o.detail}, {o.bit_exact_fraction:.1%} bit-exact",
                            style=None if o.ok else "red"))
        for o in v.outputs:
            extra = f", {o.bit_exact_fraction:.1%} bit-exact" if o.bit_exact_fraction < 1 else ""
            out.append(_t(f"  {o.name}: max abs error {o.max_abs_error:.3g}, cosine {o.cosine:.6f}{extra}: {o.detail}",
                            style=None if o.ok else "red"))
        if getattr(v, "caution", None):
            out.append(_t(f"caution: {v.caution}", style="bold yellow"))
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
    near = near_misses(result)
    if near:
        out.append(_t(f"near-misses ({len(near)}): rules that matched but did not apply, "
                      "by estimated time at stake", style="bold"))
        for n in near:
            at_stake = ""
            if (n.ms_before is None or n.ms_after is None) and n.node_ms is not None:
                at_stake = f" [its SW/hybrid epochs: estimated {ms_text(n.node_ms)} ms]"
            out.append(_t(f"  {n.rule} '{n.node}' ({n.op_type}): {n.reason}{at_stake}"))
    for w in result.warnings:
        out.append(_t(f"warning: {w}", style="bold red"))
    if result.written:
        files = [str(result.output)] + [str(p) for p in (result.report_path, result.header_path) if p]
        out.append(_t("wrote " + ", ".join(files), style="green"))
    elif result.engine.changes and v is not None and not v.ok:
        out.append(_t("nothing written: verification failed (use --keep-failed to write anyway)", style="bold red"))
    elif dry:
        # "would write" only where the run would: verified, not estimated worse, accurate enough
        would = (result.changed and result.verified and getattr(result, "regression", None) is None
                 and getattr(result, "accuracy_failure", None) is None)
        out.append(_t("dry run: nothing written" + (" (without --dry-run nafix would write the fixed model, its "
                                                    "JSON report" + (" and C header" if result.engine.io_changes else "")
                                                    + ")" if would else ""), style="bold"))
    if getattr(result, "compiled", None) is not None:
        out.extend(comparison_renderables(result.compiled))
    out.append(_t(ESTIMATE_NOTE, style="dim"))
    return out


# ------------------------------------------------------------------------------------------------
# nafix rules
# ------------------------------------------------------------------------------------------------


#: How rules are chosen, for ``nafix rules`` and docs/RULES.md.
SELECTION_TEXT = ("Rules not marked opt-in run by default. `--extend-select ID` adds a rule (an opt-in one, "
                  "say) to the default set; `--select ID` runs only the rules named; `--ignore ID` turns one "
                  "off (all three take ids or names and repeat).")


def rule_markdown(rules: Sequence[Rule]) -> str:
    """docs/RULES.md: generated from the rule files and the registered docstrings. What a rule file
    says reaches the Markdown through :mod:`fixer.escape` (a rule given with ``--rules`` is not
    nafix's text): names and values as code or literal text, its prose as one-line Markdown."""
    from .engine import GUARANTEE
    from .npu.constraints import REGISTRY
    from .npu.profile import load_profile
    from .predicates import PREDICATES
    from .rewriters import REWRITERS

    values = load_profile().values()

    lines = ["# nafix rules", "", "Generated by `nafix rules --markdown`; do not edit by hand.", "",
             GUARANTEE, "", SELECTION_TEXT, "",
             "| id | name | summary | fixes | verify |", "|---|---|---|---|---|"]
    for r in rules:
        lines.append(f"| {escape.markdown(r.id)} | {escape.markdown(r.name)} | {escape.markdown_prose(r.summary)} "
                     f"| {escape.markdown(', '.join(r.fixes))} | {r.verify.describe()}"
                     f"{' (opt-in)' if r.opt_in else ''} |")
    for r in rules:
        lines += ["", f"## {escape.markdown(r.id)} {escape.markdown(r.name)}", "", escape.markdown_prose(r.summary), "",
                  f"**Why.** {escape.markdown_prose(r.why)}", ""]
        if r.opt_in:
            lines += [f"**Opt-in**: runs only when selected: `--extend-select {r.id}` (with the default rules) or "
                      f"`--select {r.id}` (alone).", ""]
        lines.append("**Fixes:**")
        for f in r.fixes:
            c = REGISTRY.get(f)
            lines.append(f"- {escape.markdown_code(f)}"
                         + (f": {escape.markdown_prose(c.requirement(values))} [{c.tag}]" if c is not None else ""))
        lines += ["", f"**Matches** {', '.join(escape.markdown_code(o) for o in r.ops)} when:"]
        for i, c in enumerate(r.when):
            p = PREDICATES[c.predicate]
            args = ", ".join(f"{k}={v}" for k, v in c.params.items())
            role = "trigger" if i == 0 else "precondition"
            lines.append(f"- {role}: {escape.markdown_code(f'{c.predicate}({args})')}: {p.doc}")
        rw = REWRITERS[r.rewriter]
        params = ", ".join(f"{k}={v}" for k, v in r.params.items()) or "none"
        lines += ["", f"**Rewrite** (`{r.rewriter}`, params: {escape.markdown(params)}): {rw.doc}", "",
                  f"**Verify:** {r.verify.describe()}.", "", "**References:**"]
        lines += [f"- {escape.markdown_prose(ref)}" for ref in r.references]
    return "\n".join(lines) + "\n"
