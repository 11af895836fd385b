"""The pictures of nafix's HTML reports: the epoch strip (a model's estimated epochs in order,
coloured HW / hybrid / SW, each as wide as its estimated time, with a hover title naming its nodes
and why they run where they do), the compile/hang status badge of an audit row, and the
self-contained HTML page of one fix (``nafix MODEL --html FILE``): the strips before and after,
the changes and the verification beside them.

Everything here reads the JSON dicts nafix writes (:mod:`fixer.report_data`): an audit row, or the
fix report with the report rows of the model before and after. Every string that is not nafix's
own words goes through :func:`fixer.escape.html`. No printing, no files written here."""

from __future__ import annotations

from typing import Any

from . import escape
from .node_info import node_infos
from .report import ms_text
from .report_data import ESTIMATE_NOTE

#: Fill colour of an epoch by unit (the tests look for these in a screenshot).
COLOURS = {"HW": "#2e9e5b", "hybrid": "#e8a33d", "SW": "#d6483b"}
BLOCKED = "#9a9a9a"  # the HW share of a model that will not build or run
STRIP_WIDTH = 720
MIN_EPOCH_PX = 2  # the narrowest epoch drawn, so a short SW island stays visible
STRIP_CSS = (
    ".strip{display:block;margin:.3em 0}"
    ".legend span{display:inline-block;width:.9em;height:.9em;margin:0 .3em 0 1em;vertical-align:middle}"
    ".badge{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;font-weight:bold;white-space:nowrap}"
    ".badge.ok{background:#e3f3e8;color:#1c6b3b}.badge.compile_error,.badge.hang{background:#d6483b;color:#fff}"
    ".blocked{color:#777;text-decoration:line-through}"
)


# ---------------------------------------------------------------------------------------------------
# status: what stops the build


#: Finding severities that stop a build (compile error) or its run on the board (hang), worst first,
#: with the badge text; the severities are the audit JSON's ``findings[].severity``.
STATUS = (("hang", "board hang"), ("compile_error", "compile error"))


def blocking_kinds(row: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(severity, label, how many findings) of each kind of blocking finding of an audit row, worst
    first; empty when nothing predicted stops the model."""
    found = [f.get("severity") for f in row.get("findings") or []]
    return [(sev, label, found.count(sev)) for sev, label in STATUS if sev in found]


def html_status_badge(row: dict[str, Any]) -> str:
    """The status cell of an audit row: a red badge per predicted compile error / board hang (its
    constraints in the hover title), else a plain 'no error predicted' one."""
    st = blocking_kinds(row)
    if not st:
        return "<span class='badge ok' data-status='ok'>no error predicted</span>"
    out = []
    for sev, label, n in st:
        why = "; ".join(f"{f['constraint']}: {f.get('detail', '')}" for f in row.get("findings") or []
                        if f.get("severity") == sev)
        out.append(f"<span class='badge {sev}' data-status='{sev}' title='{escape.html('predicted ' + why)}'>"
                   f"{label}{f' x{n}' if n > 1 else ''} (predicted)</span>")
    return " ".join(out)


def status_sort_key(row: dict[str, Any]) -> int:
    """0 for a predicted compile error, 1 for a board hang, 2 for nothing predicted (sorts the worst
    first), by the row's build status (:func:`fixer.report_data.row_status`)."""
    from .report_data import row_status

    return {"compile_error": 0, "hang": 1}.get(row_status(row) or "ok", 2)


# ---------------------------------------------------------------------------------------------------
# the epoch strip


def _widths(weights: list[float], width: int) -> list[float]:
    """Pixel widths proportional to ``weights`` summing to ``width`` (or more, when every epoch needs
    its minimum), none narrower than :data:`MIN_EPOCH_PX`."""
    n = len(weights)
    if n * MIN_EPOCH_PX >= width:
        return [float(MIN_EPOCH_PX)] * n
    fixed: set[int] = set()
    while True:
        free = width - MIN_EPOCH_PX * len(fixed)
        total = sum(w for i, w in enumerate(weights) if i not in fixed)
        if total <= 0:
            return [float(MIN_EPOCH_PX) if i in fixed else free / max(1, n - len(fixed)) for i in range(n)]
        out = [MIN_EPOCH_PX if i in fixed else free * w / total for i, w in enumerate(weights)]
        small = {i for i, w in enumerate(out) if i not in fixed and w < MIN_EPOCH_PX}
        if not small:
            return [float(w) for w in out]
        fixed |= small


def epoch_title(ep: dict[str, Any], infos: dict) -> str:
    """The hover title of one epoch: its index, unit and op, its estimated time, its nodes and why
    they run there (plain text; escaped by the caller)."""
    nodes = list(dict.fromkeys(ep.get("nodes") or []))
    head = f"epoch {ep['index']}: {ep['unit']}"
    if ep.get("reported_as"):
        head += f" ({ep['reported_as']})"
    if ep.get("ms") is not None:
        head += f", estimated {ms_text(ep['ms'])} ms"
    shown = nodes[:6]
    lines = [head, "nodes: " + ", ".join(shown) + (f" and {len(nodes) - len(shown)} more" if len(nodes) > len(shown) else "")]
    if ep["unit"] != "HW":
        why = [infos[n].reason for n in shown if n in infos]
        lines += [f"why: {w}" for w in dict.fromkeys(why)][:3]
    return "\n".join(lines)


def epoch_strip(row: dict[str, Any], *, width: int = STRIP_WIDTH, height: int = 18, label: str = "",
                blocked: bool = False) -> str:
    """An inline SVG of the row's epochs in order, each as wide as its estimated time (as one epoch
    each when the row has no time estimate), coloured by unit, with a hover title per epoch.
    ``blocked`` draws the HW epochs grey (a model that will not build or run has no HW share to
    show in green)."""
    epochs = row.get("epochs") or []
    if not epochs:
        return "<p class='note'>No epoch estimated.</p>"
    infos = node_infos(row)
    timed = all(ep.get("ms") is not None for ep in epochs)
    widths = _widths([float(ep["ms"]) if timed else 1.0 for ep in epochs], width)
    total_w = sum(widths)
    by = "estimated time" if timed else "epoch count (no time estimate)"
    aria = f"{label}{len(epochs)} estimated epochs, width by {by}"
    out = [f"<svg class='strip' data-epochs='{len(epochs)}' width='{total_w:.0f}' height='{height}' "
           f"viewBox='0 0 {total_w:.2f} {height}' shape-rendering='crispEdges' role='img' "
           f"aria-label='{escape.html(aria)}'>"]
    x = 0.0
    for ep, w in zip(epochs, widths):
        unit = ep["unit"] if ep["unit"] in COLOURS else "SW"
        fill = BLOCKED if blocked and unit == "HW" else COLOURS[unit]
        out.append(f"<rect class='ep ep-{unit.lower()}' data-unit='{unit}' x='{x:.2f}' y='0' width='{w:.2f}' "
                   f"height='{height}' fill='{fill}'><title>{escape.html(epoch_title(ep, infos))}</title></rect>")
        x += w
    out.append("</svg>")
    return "".join(out)


def strip_legend(row: dict[str, Any] | None = None) -> str:
    """The colour key, with the row's epoch counts and estimated times by unit when given."""
    parts = []
    for unit, colour in COLOURS.items():
        text = unit
        if row is not None:
            eps = [ep for ep in row.get("epochs") or [] if ep["unit"] == unit]
            ms = [ep["ms"] for ep in eps if ep.get("ms") is not None]
            text += f": {len(eps)} epoch(s)" + (f", {ms_text(sum(ms))} ms" if ms and len(ms) == len(eps) else "")
        parts.append(f"<span style='background:{colour}'></span>{escape.html(text)}")
    return "<div class='legend note'>" + "".join(parts) + " (estimated; hover an epoch for its nodes)</div>"


# ---------------------------------------------------------------------------------------------------
# the fix report page

_FIX_CSS = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eee}td code{overflow-wrap:anywhere}td.num{text-align:right}.note{color:#666}.err{color:#b00;font-weight:bold}.good{color:#1c6b3b;font-weight:bold}
.cols{display:flex;gap:2em;flex-wrap:wrap}.cols>section{flex:1 1 420px;min-width:0}.cols>section:first-child{flex-grow:1.4}
.cols table{table-layout:fixed;width:100%}.cols td{overflow-wrap:anywhere}h2{margin-top:1.2em}
.verdict{padding:.5em .8em;border-radius:6px;display:inline-block}.verdict.ok{background:#e3f3e8}.verdict.bad{background:#fbe3e0}.verdict.caution{background:#fff4d6;display:block;margin:.4em 0}
"""


def _total_ms(row: dict[str, Any]) -> float | None:
    ms = [ep.get("ms") for ep in row.get("epochs") or []]
    return sum(ms) if ms and None not in ms else None


def _estimate_cells(e: dict[str, Any]) -> list[str]:
    return [str(e["epochs"]), str(e["sw_epochs"]), str(e.get("hybrid_epochs", 0)), f"{e['hw_ratio']:.1%}",
            ms_text(e.get("latency_ms"))]


def fix_html(fix: dict[str, Any], before_row: dict[str, Any], after_row: dict[str, Any]) -> str:
    """One self-contained HTML page (inline CSS, no script, no network) of a fix: the estimate before
    and after, the epoch strips of both, the changes (rule, node, what was done) and the
    verification (the gate's verdict, per output), the remaining findings and warnings.

    ``fix``: :func:`fixer.report_data.fix_dict`; ``before_row`` / ``after_row``: the report rows
    (:func:`fixer.report_data.analysis_dict`) of the model given and of the model nafix leaves."""
    from .outputs import text_mark

    esc = escape.html
    before, after = fix["estimate"]["before"], fix["estimate"]["after"]
    title = f"nafix fix - {fix['input']}"
    v = fix.get("verification") or {}
    out = ["<!DOCTYPE html>", f"<!-- {esc(text_mark(fix.get('nafix_version')))} -->",
           "<html lang='en'><head><meta charset='utf-8'>",
           f"<title>{esc(title)}</title><style>{_FIX_CSS}{STRIP_CSS}</style></head><body>",
           f"<h1>nafix: <code>{esc(fix['input'])}</code></h1>",
           f"<p class='note'>{esc(fix.get('note', ESTIMATE_NOTE))} Profile {esc(fix.get('profile'))}, "
           f"nafix {esc(fix.get('nafix_version'))}.</p>"]
    if fix.get("written"):
        out.append(f"<p>Written: <code>{esc(fix.get('output'))}</code></p>")
    elif fix["changes"]:
        out.append("<p class='err'>No model written (a dry run, or see the verification and the notes).</p>")
    else:
        out.append("<p>Nothing changed, so no model was written.</p>")
    out.append("<h2>Estimate</h2><table id='estimate'><thead><tr><th></th><th>est. epochs</th><th>est. SW epochs</th>"
               "<th>est. hybrid epochs</th><th>est. HW ratio</th><th>est. ms</th></tr></thead><tbody>")
    for name, e in (("before", before), ("after", after)):
        out.append(f"<tr><th>{name}</th>" + "".join(f"<td class='num'>{c}</td>" for c in _estimate_cells(e)) + "</tr>")
    out.append("</tbody></table>")
    totals = [_total_ms(before_row), _total_ms(after_row)]
    common = all(t is not None and t > 0 for t in totals)  # one time axis: the faster strip is shorter
    out.append("<h2>Epochs (estimated)</h2>"
               + ("<p class='note'>Both strips on one scale of estimated time.</p>" if common else ""))
    for (name, row), t in zip((("before", before_row), ("after", after_row)), totals):
        w = max(120, round(STRIP_WIDTH * t / max(totals))) if common else STRIP_WIDTH
        out.append(f"<h3>{name}</h3><div id='strip-{name}'>{epoch_strip(row, width=w, label=name + ': ')}</div>"
                   f"{strip_legend(row)}")
    out.append("<div class='cols'><section><h2>Changes</h2>")
    if fix["changes"]:
        out.append("<table id='changes'><thead><tr><th style='width:4.5em'>rule</th><th style='width:22%'>node</th>"
                   "<th style='width:6.5em'>op</th><th>what nafix did</th></tr></thead><tbody>")
        for c in fix["changes"]:
            out.append(f"<tr><td>{esc(c['rule'])}</td><td><code>{esc(c['node'])}</code></td><td>{esc(c['op_type'])}</td>"
                       f"<td>{esc(c['detail'])}</td></tr>")
        out.append("</tbody></table>")
    else:
        out.append("<p>No change.</p>")
    for io in fix.get("io_changes") or []:
        out.append(f"<p>{esc(io['kind'])} <code>{esc(io['name'])}</code>: {esc(io['dtype'])} (was {esc(io['was'])}), "
                   f"scale {esc(io['scale'])}, zero point {esc(io['zero_point'])}</p>")
    out.append("</section><section><h2>Verification</h2>")
    ok = v.get("ok", True)
    verdict = ("passed" if ok else "FAILED") if fix["changes"] else "nothing to verify"
    out.append(f"<p class='verdict {'ok' if ok else 'bad'}' id='verdict'>onnxruntime gate: <b>{verdict}</b></p>")
    if not ok and v.get("failed"):
        out.append(f"<p class='verdict bad'>{esc(v['failed'])}</p>")
    if v.get("caution"):  # a verdict on random inputs whose outputs moved a lot: say so (--inputs)
        out.append(f"<p class='verdict caution' id='caution'>caution: {esc(v['caution'])}</p>")
    if v.get("contract_text"):
        out.append(f"<p class='note'>{esc(v['contract_text'])} (inputs: {esc(v.get('inputs'))}, "
                   f"{esc(v.get('samples'))} sample(s))</p>")
    elif v.get("detail"):
        out.append(f"<p class='note'>{esc(v['detail'])}</p>")
    if v.get("outputs"):
        out.append("<table id='outputs'><thead><tr><th style='width:25%'>output</th><th style='width:3em'>ok</th>"
                   "<th style='width:4.5em'>cosine</th><th style='width:5em'>max abs error</th><th>detail</th></tr></thead><tbody>")
        for o in v["outputs"]:
            cos = o.get("cosine")
            mae = o.get("max_abs_error")
            out.append(f"<tr><td><code>{esc(o['name'])}</code></td>"
                       f"<td class='{'good' if o.get('ok') else 'err'}'>{'yes' if o.get('ok') else 'NO'}</td>"
                       f"<td class='num'>{'-' if cos is None else f'{cos:.4f}'}</td>"
                       f"<td class='num'>{'-' if mae is None else f'{mae:.4g}'}</td><td>{esc(o.get('detail', ''))}</td></tr>")
        out.append("</tbody></table>")
    out.append("</section></div>")
    rest = fix.get("remaining_sw_nodes") or []
    out.append(f"<h2>Left in SW or hybrid (estimated): {len(rest)}</h2>")
    if rest:
        out.append("<table id='remaining'><thead><tr><th>node</th><th>op</th><th>why</th></tr></thead><tbody>")
        for n in rest:
            out.append(f"<tr><td><code>{esc(n['name'])}</code></td><td>{esc(n['op_type'])}</td><td>"
                       + "<br>".join(esc(r) for r in n.get("reasons") or []) + "</td></tr>")
        out.append("</tbody></table>")
    blocking = [f for f in fix.get("findings") or [] if f.get("severity") in dict(STATUS)]
    if blocking:
        out.append("<h2 class='err'>Predicted to stop the build or the board</h2><ul>"
                   + "".join(f"<li>{esc(dict(STATUS)[f['severity']])}: {esc(f['constraint'])} ({esc(f['detail'])})</li>"
                             for f in blocking) + "</ul>")
    notes = [*(fix.get("advice") or []), *(fix.get("warnings") or [])]
    if notes:
        out.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def fix_page(result) -> str:
    """:func:`fix_html` of a :class:`fixer.results.FixResult`."""
    from .report_data import analysis_dict, fix_dict

    return fix_html(fix_dict(result), analysis_dict(result.before), analysis_dict(result.final))
