"""Audit report renderings for CI and people browsing a zoo: SARIF 2.1.0 (GitHub code scanning),
GitHub workflow-command annotations and one self-contained HTML page. Each reads the JSON report
(``nafix audit --format json``) and carries the same facts. No printing here."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from . import __version__, escape
from .report import ESTIMATE_NOTE, _sw_summary, kib, ms_text, quantize_line, status_badge, summary_lines
from .report_data import row_status
from .report_html import STRIP_CSS, epoch_strip, html_status_badge, status_sort_key, strip_legend

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
ERROR_RULE = "nafix-error"
QUANTIZE_RULE = "nafix-quantize"
_LEVEL = {"compile_error": "error", "hang": "error", "note": "note"}


def _gain_cell(g: dict[str, Any] | None) -> str:
    """A table cell for what ``--quantize`` is estimated to remove from a model ("" when it is not the fix)."""
    if not g:
        return ""
    ms = g["ms"].get("removed")
    return f"{g['sw_epochs']['removed']} SW epochs" + (f", {ms_text(ms)} ms" if ms is not None else "") + " (estimated)"


def _ok(row: dict[str, Any]) -> bool:
    return not row.get("error") and row.get("estimate") is not None


def _uri(path: str) -> str:
    """A model path as a SARIF artifact URI: absolute (symbolic links resolved) or relative,
    percent-encoded; never fails (a path the file system refuses, e.g. with a NUL byte, is encoded
    as given)."""
    p = Path(path)
    if not p.is_absolute():  # a file name that is not UTF-8 (lone surrogates): its own bytes, %-encoded
        return quote(p.as_posix(), errors="surrogateescape")
    try:
        return p.resolve().as_uri()
    except (OSError, ValueError, RuntimeError):  # NUL byte, symlink loop, unreadable folder
        return "file://" + quote(p.as_posix(), errors="surrogateescape")


def _sw_message(n: dict[str, Any], ms: float | None = None) -> str:
    est = f" (estimated {ms_text(ms)} ms per inference)" if ms is not None else ""
    return f"'{n['name']}' ({n['op_type']}) is estimated to run in SW{est}: " + "; ".join(n["reasons"])


def _node_ms(row: dict[str, Any]) -> dict[str, float]:
    """Estimated ms of the SW and hybrid epochs of a report row, by the model node(s) they come from
    (an epoch of two nodes counts for each)."""
    out: dict[str, float] = {}
    for ep in row.get("epochs") or []:
        if ep.get("unit") == "HW" or ep.get("ms") is None:
            continue
        for name in ep.get("nodes") or []:
            out[name] = out.get(name, 0.0) + ep["ms"]
    return out


def _finding_message(f: dict[str, Any]) -> str:
    return f"{f['severity']}: {f['requirement']} ({f['detail']}) [{f['tag']}]"


def _fixing_rules(constraint: str) -> list:
    """The built-in NAF rules whose ``fixes`` name ``constraint`` (light: fixer.rule_index)."""
    try:
        from .rule_index import rules_fixing

        return rules_fixing(constraint)
    except Exception:  # noqa: BLE001 - a report is still written without the rule links
        return []


def _sarif_rule(rid: str, text: str, tag: str | None) -> dict[str, Any]:
    """A SARIF rule for a constraint: its requirement, the fact behind it (helpUri: docs/NPU_FACTS.md),
    and the NAF rule(s) that fix it with the command to run (help)."""
    from .facts import fact_url, rule_url

    if rid == ERROR_RULE:
        return {"id": rid, "shortDescription": {"text": text}, "fullDescription": {"text": text},
                "help": {"text": f"{text} The result's message says why.",
                         "markdown": f"{escape.markdown(text)} The result's message says why."},
                "properties": {"tags": ["nafix"]}}
    fixers = _fixing_rules(rid)
    url = fact_url(rid)
    if fixers:
        cmds = "; ".join(f"{r.id} {r.name} (`nafix MODEL{' --extend-select ' + r.id if r.opt_in else ''}`)"
                         for r in fixers)
        fix_text = f"Fixed by nafix rule {cmds}."
        fix_md = "Fixed by nafix rule " + "; ".join(
            f"[{r.id} {escape.markdown(r.name)}]({rule_url(r.id, r.name)}) (`nafix MODEL"
            f"{' --extend-select ' + r.id if r.opt_in else ''}`)" for r in fixers) + "."
    else:
        fix_text = fix_md = "No nafix rule rewrites it yet: change the model or the stedgeai options."
    return {
        "id": rid,
        "shortDescription": {"text": text},
        "fullDescription": {"text": text},
        "helpUri": url,
        "help": {"text": f"{text} (nafix constraint {rid}, {tag or 'untagged'}). {fix_text} The fact behind it: {url}",
                 "markdown": f"{escape.markdown(text)} (nafix constraint `{rid}`, {tag or 'untagged'}).\n\n{fix_md}\n\n"
                             f"[The fact behind it]({url})."},
        "properties": {"tags": [t for t in ("nafix", tag) if t], "nafixRules": [r.id for r in fixers]},
    }


def sarif_report(report: dict[str, Any]) -> dict[str, Any]:
    """SARIF 2.1.0: one result per SW node (rule = its first failing constraint, the others in the
    message and properties) and per model-level finding; rules are nafix constraint ids with their
    requirement sentence as help; each model is an artifact carrying its estimate and memory."""
    rules: dict[str, dict[str, Any]] = {}

    def rule(rid: str, text: str, tag: str | None) -> int:
        if rid not in rules:
            rules[rid] = _sarif_rule(rid, text, tag)
        return list(rules).index(rid)

    artifacts, results = [], []
    for i, row in enumerate(report["models"]):
        loc = {"physicalLocation": {"artifactLocation": {"uri": _uri(row["path"]), "index": i}}}
        props: dict[str, Any] = {"sha256": row.get("sha256"), "error": row.get("error")}
        if _ok(row):
            props.update({"status": row_status(row), "estimate": row["estimate"], "memory": row["memory"],
                          **({"quantize": row["quantize"]} if row.get("quantize") else {}),
                          **({"estimated_ms": row["estimate"]["latency_ms"]}
                             if row["estimate"].get("latency_ms") is not None else {})})
        artifacts.append({"location": {"uri": _uri(row["path"])}, "properties": props})
        if not _ok(row):
            idx = rule(ERROR_RULE, "The model could not be analysed.", None)
            results.append({"ruleId": ERROR_RULE, "ruleIndex": idx, "level": "error",
                            "message": {"text": row.get("error") or "error"}, "locations": [loc]})
            continue
        node_ms = _node_ms(row)
        for n in row["sw_nodes"]:
            why = n.get("why") or []
            rid = (n.get("constraints") or ["sw"])[0]
            idx = rule(rid, why[0]["requirement"] if why else (n["reasons"] or [f"{n['op_type']} runs in SW."])[0],
                       why[0]["tag"] if why else (n.get("tags") or [None])[0])
            for w in why[1:]:
                rule(w["constraint"], w["requirement"], w["tag"])
            results.append({
                "ruleId": rid, "ruleIndex": idx, "level": "warning",
                "message": {"text": _sw_message(n, node_ms.get(n["name"]))},
                "locations": [dict(loc, logicalLocations=[{"name": n["name"], "fullyQualifiedName": f"{row['path']}:{n['name']}",
                                                          "kind": "member"}])],
                "partialFingerprints": {"nafixNode/v1": f"{row['path']}:{n['name']}:{rid}"},
                "properties": {"node": n["name"], "op_type": n["op_type"], "constraints": n.get("constraints") or [],
                               "kernel": n.get("kernel"), "estimated": True,
                               **({"estimated_ms": round(node_ms[n["name"]], 4)} if n["name"] in node_ms else {})},
            })
        for f in row.get("findings") or []:
            idx = rule(f["constraint"], f["requirement"], f["tag"])
            results.append({"ruleId": f["constraint"], "ruleIndex": idx, "level": _LEVEL.get(f["severity"], "warning"),
                            "message": {"text": _finding_message(f)}, "locations": [loc],
                            "properties": {"severity": f["severity"], "estimated": True}})
        # what --select-finding/--ignore-finding set aside: kept, as suppressed results (accepted)
        accepted = {"kind": "external",
                    "justification": "accepted by nafix audit --select-finding/--ignore-finding or the config"}
        for n in row.get("ignored_sw_nodes") or []:
            why = n.get("why") or []
            rid = (n.get("constraints") or ["sw"])[0]
            idx = rule(rid, why[0]["requirement"] if why else (n["reasons"] or [f"{n['op_type']} runs in SW."])[0],
                       why[0]["tag"] if why else (n.get("tags") or [None])[0])
            results.append({"ruleId": rid, "ruleIndex": idx, "level": "warning",
                            "message": {"text": _sw_message(n, node_ms.get(n["name"]))}, "locations": [loc],
                            "suppressions": [accepted],
                            "partialFingerprints": {"nafixNode/v1": f"{row['path']}:{n['name']}:{rid}"},
                            "properties": {"node": n["name"], "op_type": n["op_type"], "estimated": True}})
        for f in row.get("ignored_findings") or []:
            idx = rule(f["constraint"], f["requirement"], f["tag"])
            results.append({"ruleId": f["constraint"], "ruleIndex": idx, "level": _LEVEL.get(f["severity"], "warning"),
                            "message": {"text": _finding_message(f)}, "locations": [loc], "suppressions": [accepted],
                            "properties": {"severity": f["severity"], "estimated": True}})
        if (advice := quantize_line(row)):
            idx = rule(QUANTIZE_RULE, "A float model, or float islands in a quantized one, runs in SW until it is "
                       "quantized with calibration data: nafix MODEL --quantize.", None)
            results.append({"ruleId": QUANTIZE_RULE, "ruleIndex": idx, "level": "note",
                            "message": {"text": advice}, "locations": [loc],
                            "properties": {**row["quantize"], "estimated": True}})
    from .outputs import text_mark

    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        # near the top: fixer.outputs recognises the file as nafix's, so a rerun may replace it
        "properties": {"generator": text_mark(report.get("nafix_version"))},
        "runs": [{
            "tool": {"driver": {"name": "nafix", "version": report.get("nafix_version", __version__),
                                "rules": list(rules.values())}},
            "artifacts": artifacts,
            "results": results,
            "properties": {"profile": report["profile"], "estimated": True, "note": report.get("note", ESTIMATE_NOTE),
                           "summary": report.get("summary")},
        }],
    }


_gh_escape_data = escape.github_data
_gh_escape_prop = escape.github_property


GITHUB_MAX_PER_LEVEL = 10  # GitHub shows 10 annotations of each level per step and drops the rest
_GH_RANK = {"error": 0, "warning": 1, "notice": 2}


def github_annotations(report: dict[str, Any], *, limit: int = GITHUB_MAX_PER_LEVEL) -> str:
    """GitHub Actions workflow commands, at most ``limit`` per level (what GitHub shows), worst first.

    One annotation per model and cause, with counts: ``::error`` per unreadable model and per
    predicted compile error / board hang constraint, ``::warning`` per SW constraint (its nodes
    counted, their estimated ms summed), ``::notice`` per model estimate (most SW epochs first) and
    one for the zoo summary. What does not fit is counted in one last ``::notice`` line. A ``::debug::``
    line names nafix first."""
    from .outputs import text_mark

    # (level, sort key (lower is worse), message, file, title)
    found: list[tuple[str, tuple, str, str | None, str]] = []
    for row in report["models"]:
        path = row["path"]
        if not _ok(row):
            found.append(("error", (0, 0), row.get("error") or "error", path, "nafix: model not analysed"))
            continue
        e, mem = row["estimate"], row["memory"]
        ms = f", estimated time {ms_text(e['latency_ms'])} ms" if e.get("latency_ms") is not None else ""
        badge = status_badge(row)
        status = f"{badge}: " if badge != "ok" else ""
        found.append(("notice", (-e["sw_epochs"], e["hw_ratio"]),
                      f"{status}estimated {e['epochs']} epochs, {e['sw_epochs']} SW, HW ratio {e['hw_ratio']:.1%}{ms}; weights "
                      f"{kib(mem['weights_bytes'])}, peak activations {kib(mem['peak_activation_bytes'])} "
                      f"({'fits' if mem['fits_on_chip'] else 'does NOT fit'} on-chip, "
                      f"{kib(mem['onchip_activation_capacity_bytes'])})", path, "nafix estimate"))
        if (advice := quantize_line(row)):
            g = row["quantize"]
            # before the other notices: the one fix of the most SW epochs (a float model's note says less)
            found.append(("notice", (-1e7 - g["sw_epochs"]["removed"], 0), advice, path,
                          "nafix --quantize"))
        node_ms = _node_ms(row)
        causes: dict[str, list[dict[str, Any]]] = {}
        for n in row["sw_nodes"]:
            causes.setdefault((n.get("constraints") or ["SW"])[0], []).append(n)
        for cause, nodes in causes.items():
            total = sum(node_ms.get(n["name"], 0.0) for n in nodes)
            first = nodes[0]
            more = f" and {len(nodes) - 1} more node(s) for the same cause" if len(nodes) > 1 else ""
            est = f"; estimated {ms_text(total)} ms per inference in all" if total else ""
            found.append(("warning", (-total, -len(nodes)),
                          f"{len(nodes)} node(s) estimated to run in SW ({cause}): {_sw_message(first)}{more}{est}",
                          path, f"nafix {cause} ({len(nodes)} node(s))"))
        by_constraint: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for f in row.get("findings") or []:
            kind = {"error": "error", "note": "notice"}.get(_LEVEL.get(f["severity"], "warning"), "warning")
            by_constraint.setdefault((kind, f["constraint"]), []).append(f)
        for (kind, constraint), fs in by_constraint.items():
            more = f" (and {len(fs) - 1} more like it)" if len(fs) > 1 else ""
            found.append((kind, (-1e9 if kind == "error" else -1e6, -len(fs)), _finding_message(fs[0]) + more, path,
                          f"nafix {constraint} ({len(fs)})"))
    from .selection import summary_line

    ignored = summary_line(report.get("selection"))
    if ignored is not None:  # never silently lost: one notice with the counts
        found.append(("notice", (-1e12,), ignored, None, "nafix: ignored findings"))
    summary = None
    if len(report["models"]) > 1 and report.get("summary"):
        summary = "\n".join(summary_lines(report["summary"]))
    shown: list[tuple[str, tuple, str, str | None, str]] = []
    dropped: dict[str, int] = {}
    for level in ("error", "warning", "notice"):
        mine = sorted((a for a in found if a[0] == level), key=lambda a: (a[1], a[3] or ""))
        room = limit
        if level == "notice":  # the zoo summary and the overflow line are notices too
            room -= (summary is not None)
            overflow_needed = len(mine) > room or any(dropped.values())
            room -= overflow_needed
        shown += mine[:max(room, 0)]
        dropped[level] = len(mine) - len(mine[:max(room, 0)])

    lines = [f"::debug::{text_mark(report.get('nafix_version'))}"]  # marks a written file as nafix's

    def cmd(kind: str, message: str, file: str | None = None, title: str | None = None) -> None:
        props = []
        if file is not None:
            props.append(f"file={_gh_escape_prop(Path(file).as_posix())}")
        if title:
            props.append(f"title={_gh_escape_prop(title)}")
        lines.append(f"::{kind}{' ' + ','.join(props) if props else ''}::{_gh_escape_data(message)}")

    for kind, _key, message, file, title in sorted(shown, key=lambda a: _GH_RANK[a[0]]):
        cmd(kind, message, file, title)
    if summary is not None:
        cmd("notice", summary, title="nafix zoo summary")
    if any(dropped.values()):
        parts = ", ".join(f"{n} {lvl}(s)" for lvl, n in dropped.items() if n)
        cmd("notice", f"{parts} more not shown (GitHub shows {limit} annotations per level); "
            "see the step summary or nafix audit --format markdown for every model.", title="nafix: more findings")
    return "\n".join(lines) + "\n"


def step_summary_markdown(report: dict[str, Any], *, max_rows: int = 200) -> str:
    """The zoo summary for ``$GITHUB_STEP_SUMMARY``: the summary sentences and one row per model
    (worst first, at most ``max_rows``); per-node detail stays in ``--format markdown``."""
    md, mdc = escape.markdown, escape.markdown_code
    lines = [f"## nafix audit (profile {md(report['profile'])})", "", f"_{ESTIMATE_NOTE}_", ""]
    if report.get("summary"):
        lines += [f"- {md(s)}" for s in summary_lines(report["summary"])] + [""]
    from .selection import summary_line

    if summary_line(report.get("selection")):
        lines += [f"- {md(summary_line(report.get('selection')))}", ""]
    rows = sorted(report["models"], key=lambda r: (_ok(r), -(r.get("estimate") or {}).get("sw_epochs", 0), r["path"]))
    lines += ["| model | status | est. epochs | est. SW epochs | est. HW ratio | est. ms | --quantize would remove |",
              "|---|---|---|---|---|---|---|"]
    for r in rows[:max_rows]:
        if not _ok(r):
            lines.append(f"| {mdc(r['path'], table=True)} | **error** | | | | {md(r.get('error') or 'error')} | |")
            continue
        e, badge = r["estimate"], status_badge(r)
        gain = md(_gain_cell(r.get("quantize")))
        lines.append(f"| {mdc(r['path'], table=True)} | {badge if badge == 'ok' else f'**{badge}**'} | {e['epochs']} | "
                     f"{e['sw_epochs']} | {e['hw_ratio']:.1%} | {ms_text(e.get('latency_ms'))} | {gain} |")
    if len(rows) > max_rows:
        lines.append(f"\n_{len(rows) - max_rows} more model(s) not listed._")
    return "\n".join(lines) + "\n"


def concise_text(report: dict[str, Any]) -> str:
    """One line per finding, like ``ruff --output-format concise``: ``path: NODE op: reason [id]``
    for each SW node, ``path: severity: requirement (detail) [id]`` for each model-level finding,
    ``path: error: message`` for a model that could not be analysed."""
    vis = escape.terminal
    out = []
    for row in report["models"]:
        path = vis(row["path"])
        if not _ok(row):
            out.append(f"{path}: error: {vis(row.get('error') or 'error')}")
            continue
        for n in row["sw_nodes"]:
            reason = (n.get("reasons") or ["estimated to run in SW"])[0]
            cid = (n.get("constraints") or ["SW"])[0]
            out.append(f"{path}: {vis(n['name'])} {vis(n['op_type'])}: {vis(reason)} [{vis(cid)}]")
        badge = status_badge(row)
        if badge != "ok":
            out.append(f"{path}: status: {badge} [{row_status(row)}]")
        for f in row.get("findings") or []:
            out.append(f"{path}: {vis(f['severity'])}: {vis(f['requirement'])} ({vis(f['detail'])}) [{vis(f['constraint'])}]")
        if (advice := quantize_line(row)):
            out.append(f"{path}: quantize: {vis(advice)} [{QUANTIZE_RULE}]")
    from .selection import summary_line

    ignored = summary_line(report.get("selection"))
    if ignored is not None:
        out.append(vis(ignored))
    return "\n".join(out) + ("\n" if out else "")


_CSS = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#eee;cursor:pointer;user-select:none}th.sorted-asc::after{content:" \\25B2"}th.sorted-desc::after{content:" \\25BC"}
td.num{text-align:right}.bar{display:flex;width:160px;height:12px;border:1px solid #999}
.hw{background:#3a7}.sw{background:#d54}.no{color:#b00;font-weight:bold}.err{color:#b00}
.hist div{display:flex;align-items:center;margin:2px 0}.hist span.l{width:14em}.hist span.b{background:#d54;height:12px;margin-right:6px}
details{margin:.4em 0}summary{cursor:pointer;font-weight:bold}.note{color:#666}
"""

_JS = """
(function(){
  var t=document.getElementById('models');
  function key(td){var v=td.getAttribute('data-sort');return v===null?td.textContent:v;}
  function sortBy(i,desc){
    var b=t.tBodies[0],rows=Array.prototype.slice.call(b.rows);
    rows.sort(function(x,y){var a=key(x.cells[i]),c=key(y.cells[i]);var na=parseFloat(a),nc=parseFloat(c);
      var r=(!isNaN(na)&&!isNaN(nc))?na-nc:a.localeCompare(c);return desc?-r:r;});
    rows.forEach(function(r){b.appendChild(r);});
    Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,j){
      th.className=j===i?(desc?'sorted-desc':'sorted-asc'):'';});
  }
  Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,i){
    th.addEventListener('click',function(){sortBy(i,th.className==='sorted-asc');});});
  var m=/sort=([a-z_]+)(-desc)?/.exec(location.hash);
  if(m){Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,i){
    if(th.getAttribute('data-key')===m[1])sortBy(i,!!m[2]);});}
})();
"""


def html_report(report: dict[str, Any]) -> str:
    """One self-contained HTML page (inline CSS and JS, no network): a sortable table of models
    with its predicted compile/hang status and its epoch strip (:mod:`fixer.report_html`), the memory fit, a histogram of SW op types over the
    zoo, the zoo summary, and per model its SW nodes with their reasons. ``#sort=KEY[-desc]`` in
    the URL sorts the table on load (keys: model, status, epochs, sw_epochs, hw_ratio, ms, peak, fits)."""
    esc = escape.html
    rows = report["models"]
    from .outputs import text_mark

    out = ["<!DOCTYPE html>", f"<!-- {esc(text_mark(report.get('nafix_version')))} -->", "<html lang='en'><head><meta charset='utf-8'>",
           f"<title>nafix audit - profile {esc(report['profile'])}</title><style>{_CSS}{STRIP_CSS}</style></head><body>",
           f"<h1>nafix audit - profile {esc(report['profile'])}</h1>",
           f"<p class='note'>{esc(report.get('note', ESTIMATE_NOTE))} nafix {esc(str(report.get('nafix_version', '')))}.</p>"]
    cols = (("model", "model"), ("status", "status"), ("epochs", "est. epochs"), ("sw_epochs", "est. SW epochs"), ("hw_ratio", "est. HW ratio"),
            ("ms", "est. ms"), ("bar", "epochs (estimated time)"), ("sw_ops", "SW ops"), ("peak", "peak activations"), ("fits", "fits on-chip"),
            ("quantize", "--quantize would remove (est.)"))
    out.append("<table id='models'><thead><tr>" + "".join(f"<th data-key='{k}'>{esc(t)}</th>" for k, t in cols)
               + "</tr></thead><tbody>")
    for i, row in enumerate(rows):
        name = esc(row["path"])
        if not _ok(row):
            out.append(f"<tr class='error'><td data-sort='{name}'>{name}</td><td data-sort='-1'>not analysed</td>"
                       "<td data-sort='-1'>-</td><td data-sort='-1'>-</td>"
                       f"<td data-sort='-1'>-</td><td data-sort='-1'>-</td><td></td><td class='err'>{esc(row.get('error') or 'error')}</td>"
                       "<td data-sort='-1'>-</td><td data-sort='-1'>-</td><td data-sort='-1'>-</td></tr>")
            continue
        e, mem = row["estimate"], row["memory"]
        blocked = row_status(row) not in (None, "ok")  # a model that will not build or run shows no green HW share
        ratio = f"<span class='blocked'>{e['hw_ratio']:.1%}</span>" if blocked else f"{e['hw_ratio']:.1%}"
        ops = _sw_summary(row)
        fits = "yes" if mem["fits_on_chip"] else "<span class='no'>no</span>"
        g = row.get("quantize")
        out.append(
            f"<tr><td data-sort='{name}'><a href='#m{i}'>{name}</a></td>"
            f"<td data-sort='{status_sort_key(row)}'>{html_status_badge(row)}</td><td class='num'>{e['epochs']}</td>"
            f"<td class='num'>{e['sw_epochs']}</td><td class='num' data-sort='{e['hw_ratio']}'>{ratio}</td>"
            f"<td class='num' data-sort='{e.get('latency_ms') if e.get('latency_ms') is not None else -1}'>"
            f"{ms_text(e.get('latency_ms'))}</td>"
            f"<td data-sort='{e['hw_ratio']}'>{epoch_strip(row, width=240, height=12, blocked=blocked)}</td>"
            f"<td>{esc(ops)}</td><td class='num' data-sort='{mem['peak_activation_bytes'] or 0}'>{kib(mem['peak_activation_bytes'])}</td>"
            f"<td data-sort='{int(mem['fits_on_chip'])}'>{fits}</td>"
            f"<td data-sort='{(g or {}).get('sw_epochs', {}).get('removed', -1)}'>{esc(_gain_cell(g))}</td></tr>")
    out.append("</tbody></table>")
    summary = report.get("summary")
    if summary:
        out.append("<h2>Zoo summary (estimated)</h2><ul>" + "".join(f"<li>{esc(s)}</li>" for s in summary_lines(summary)) + "</ul>")
        ops = summary["sw_op_types"]
        timed = bool(ops) and all(o.get("ms") is not None for o in ops)
        if ops:
            top = max((o["ms"] if timed else o["sw_epochs"]) for o in ops) or 1
            out.append(f"<h3>SW op types over the zoo (estimated {'time' if timed else 'SW epochs'})</h3>"
                       "<div class='hist' id='sw-histogram'>")
            for o in ops:
                size = o["ms"] if timed else o["sw_epochs"]
                ms = f"{ms_text(o['ms'])} ms, " if timed else ""
                out.append(f"<div><span class='l'>{esc(o['op_type'])}</span><span class='b' style='width:{300 * size / top:.0f}px'>"
                           f"</span>{ms}{o['sw_epochs']} epochs, {o['models']} model(s)</div>")
            out.append("</div>")
    out.append("<h2>Models</h2>")
    for i, row in enumerate(rows):
        out.append(f"<details id='m{i}'{' open' if len(rows) == 1 else ''}><summary>{esc(row['path'])}</summary>")
        if not _ok(row):
            out.append(f"<p class='err'>{esc(row.get('error') or 'error')}</p></details>")
            continue
        mem = row["memory"]
        out.append(f"<p>{html_status_badge(row)}</p>{epoch_strip(row, blocked=row_status(row) not in (None, 'ok'))}{strip_legend(row)}")
        if (advice := quantize_line(row)):
            out.append(f"<p class='quantize'>{esc(advice)}</p>")
        out.append(f"<p>memory (estimated): weights {kib(mem['weights_bytes'])}, peak activations "
                   f"{kib(mem['peak_activation_bytes'])} at <code>{esc(str(mem['peak_at']))}</code>, on-chip capacity "
                   f"{kib(mem['onchip_activation_capacity_bytes'])}: {'fits' if mem['fits_on_chip'] else 'does NOT fit'}.</p>")
        if row["sw_nodes"]:
            out.append("<table class='sw'><thead><tr><th>node</th><th>op</th><th>why it runs in SW</th></tr></thead><tbody>")
            for n in row["sw_nodes"]:
                out.append(f"<tr><td><code>{esc(n['name'])}</code></td><td>{esc(n['op_type'])}</td><td>"
                           + "<br>".join(esc(r) for r in n["reasons"]) + "</td></tr>")
            out.append("</tbody></table>")
        else:
            out.append("<p>No SW node predicted.</p>")
        if row.get("findings"):
            out.append("<ul>" + "".join(f"<li>{esc(_finding_message(f))}</li>" for f in row["findings"]) + "</ul>")
        out.append("</details>")
    out.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(out) + "\n"


def sarif_text(report: dict[str, Any]) -> str:
    return escape.json_text(sarif_report(report), indent=2) + "\n"
