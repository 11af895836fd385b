"""Report data and renderings (JSON, Markdown, console tables). No printing here: renderers return
strings or rich renderables; the CLI decides where they go."""

from __future__ import annotations

from collections import Counter
from typing import Any

from . import __version__
from .api import AuditResult, ModelAnalysis

ESTIMATE_NOTE = (
    "Epoch counts, HW ratios and memory figures are estimated by nafix's placement model "
    "(not measured by stedgeai)."
)


def kib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024:,.1f} KiB"


def analysis_dict(a: ModelAnalysis) -> dict[str, Any]:
    return {
        "estimate": a.estimate.as_dict(),
        "sw_nodes": a.sw_nodes(),
        "notes": a.notes(),
        "findings": [
            {"constraint": r.constraint, "requirement": r.requirement, "detail": r.detail, "tag": r.tag,
             "severity": r.severity}
            for r in a.findings
        ],
        "memory": a.memory.as_dict(),
        "dynamic_dims": [d.describe() for d in a.loaded.dynamic_dims],
        "warnings": list(a.loaded.warnings),
        "oe_export": a.placement.oe_export,
        "epochs": [{"index": g.index, "unit": g.unit, "nodes": g.nodes} for g in a.estimate.groups],
    }


def audit_dict(result: AuditResult, *, profile: str) -> dict[str, Any]:
    models = []
    for m in result.models:
        row: dict[str, Any] = {"path": str(m.path), "error": m.error}
        if m.analysis is not None:
            row.update(analysis_dict(m.analysis))
        else:
            row.update({"estimate": None, "sw_nodes": [], "memory": None})
        models.append(row)
    return {
        "nafix_version": __version__,
        "profile": profile,
        "estimated": True,
        "note": ESTIMATE_NOTE,
        "models": models,
    }


def _sw_summary(a: ModelAnalysis) -> str:
    c = Counter(g.nodes and a.placement.by_name[g.nodes[0]].op_type for g in a.estimate.groups if g.unit == "SW")
    return ", ".join(f"{op} x{n}" for op, n in c.most_common()) or "-"


def audit_markdown(result: AuditResult, *, profile: str) -> str:
    lines = [f"# nafix audit (profile {profile})", "", f"_{ESTIMATE_NOTE}_", "",
             "| model | est. epochs | est. SW epochs | est. HW ratio | SW ops | peak activations | fits on-chip |",
             "|---|---|---|---|---|---|---|"]
    for m in result.models:
        if m.error or m.analysis is None:
            lines.append(f"| `{m.path}` | error | | | {m.error} | | |")
            continue
        a = m.analysis
        e = a.estimate
        lines.append(
            f"| `{m.path.name}` | {e.epochs} | {e.sw_epochs} | {e.hw_ratio:.1%} | {_sw_summary(a)} | "
            f"{kib(a.memory.peak_activation_bytes)} | {'yes' if a.memory.fits_on_chip else '**no**'} |"
        )
    for m in result.models:
        if m.analysis is None:
            continue
        a = m.analysis
        lines += ["", f"## {m.path.name}", ""]
        sw = a.sw_nodes()
        if sw:
            lines += ["| node | op | why it runs in SW |", "|---|---|---|"]
            for n in sw:
                why = "<br>".join(_md(r) for r in n["reasons"])
                lines.append(f"| `{n['name']}` | {n['op_type']} | {why} |")
        else:
            lines.append("No SW node predicted.")
        for r in a.findings:
            lines.append(f"- **{r.severity}**: {_md(r.requirement)} ({_md(r.detail)}) [{r.tag}]")
        for n in a.notes():
            lines.append(f"- note on `{n['name']}`: {_md(n['note'])}")
        mem = a.memory
        lines.append(
            f"- memory (estimated): weights {kib(mem.weights_bytes)}, peak activations {kib(mem.peak_activation_bytes)}"
            f" at `{mem.peak_at}`, on-chip capacity {kib(mem.onchip_bytes)}"
        )
    return "\n".join(lines) + "\n"


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def model_summary_line(path_name: str, a: ModelAnalysis) -> str:
    e, mem = a.estimate, a.memory
    fit = "fits on-chip" if mem.fits_on_chip else f"does NOT fit on-chip ({kib(mem.onchip_bytes)})"
    return (f"{path_name}: estimated {e.epochs} epochs, {e.sw_epochs} SW, HW ratio {e.hw_ratio:.1%}; "
            f"weights {kib(mem.weights_bytes)}, peak activations {kib(mem.peak_activation_bytes)} ({fit})")


def grouped_reasons(a: ModelAnalysis, *, notes: bool = False) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """SW nodes (or notes) grouped by requirement: [(requirement, tag, [(node, op, detail), ...])]."""
    groups: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for n in a.placement.nodes:
        rs = n.notes if notes else (n.reasons if n.unit == "SW" else ())
        for r in rs:
            groups.setdefault((r.requirement, r.tag), []).append((n.name, n.op_type, r.detail))
    return [(req, tag, items) for (req, tag), items in groups.items()]


def audit_renderables(result: AuditResult, *, profile: str, verbose: bool = False):
    """Rich renderables for the console audit report: a summary table, then per model the SW nodes
    grouped by the requirement they fail (each requirement printed once)."""
    from rich.table import Table
    from rich.text import Text

    out: list[Any] = []
    summary = Table(title=f"nafix audit - profile {profile} (estimated)", expand=False)
    for col, just in (("model", "left"), ("epochs", "right"), ("SW", "right"), ("HW ratio", "right"),
                      ("SW ops", "left"), ("peak act.", "right"), ("on-chip", "center")):
        summary.add_column(col, justify=just, overflow="fold")
    for m in result.models:
        if m.analysis is None:
            summary.add_row(m.path.name, "-", "-", "-", Text(m.error or "error", style="red"), "-", "-")
            continue
        a = m.analysis
        e = a.estimate
        summary.add_row(
            m.path.name, str(e.epochs), str(e.sw_epochs), f"{e.hw_ratio:.1%}", _sw_summary(a),
            kib(a.memory.peak_activation_bytes), "yes" if a.memory.fits_on_chip else Text("NO", style="bold red"),
        )
    out.append(summary)
    for m in result.models:
        if m.analysis is None:
            continue
        a = m.analysis
        out.append(Text(""))
        out.append(Text(model_summary_line(m.path.name, a), style="bold"))
        for req, tag, items in grouped_reasons(a):
            out.append(Text(f"  SW x{len(items)}: {req} [{tag}]", style="yellow"))
            shown = items if verbose else items[:6]
            for name, op, detail in shown:
                out.append(Text(f"      {detail}"))
            if len(shown) < len(items):
                out.append(Text(f"      ... and {len(items) - len(shown)} more (--verbose lists all)", style="dim"))
        for r in a.findings:
            style = "red" if r.severity == "compile_error" else "yellow"
            label = {"compile_error": "COMPILE ERROR", "hang": "BOARD HANG", "note": "NOTE"}.get(r.severity, r.severity)
            out.append(Text(f"  {label}: {r.requirement} ({r.detail}) [{r.tag}]", style=style))
        if verbose:
            for req, tag, items in grouped_reasons(a, notes=True):
                out.append(Text(f"  note x{len(items)}: {req} [{tag}]", style="dim"))
                for name, op, detail in items:
                    out.append(Text(f"      {detail}", style="dim"))
    out.append(Text(""))
    out.append(Text(ESTIMATE_NOTE, style="dim"))
    return out
