"""Which audit findings count: ``--select-finding`` / ``--ignore-finding`` (and the same keys in the
config file, per path too).

A finding is an SW node of a model (identified by its op type and the constraints it fails) or a
model-level finding (identified by its constraint id). An item names a constraint id
(``resize_nearest_asymmetric``, ``sw_op:Softmax``, ``activations_on_chip``) or an ONNX op type (``Softmax``).
``select`` keeps only the findings an item names; ``ignore`` then sets aside those an item names.
A finding set aside is *accepted*, not hidden: it moves from ``sw_nodes`` / ``findings`` to
``ignored_sw_nodes`` / ``ignored_findings`` in the row, is counted in the row's ``selection`` and in
the report's, is shown as a count in every format (SARIF keeps it as a suppressed result), and no
longer counts for ``--fail-on`` or a baseline. The estimate itself is unchanged: an ignored SW
Softmax is still an SW epoch of the model.

These are findings, not rewrite rules: ``nafix fix --select/--ignore`` take NAF rule ids, and a NAF
id given here is refused with a sentence saying so.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional, Sequence

from .errors import UsageError

_RULE_ID = re.compile(r"^[A-Z]{3}\d{3}$")


def check_items(items: Iterable[str], option: str) -> tuple[str, ...]:
    """The items of ``option`` as given, stripped; a NAF rule id or an empty item is a UsageError."""
    out = []
    for raw in items or ():
        item = str(raw).strip()
        if not item:
            raise UsageError(f"{option}: an empty item; give a constraint id (e.g. resize_nearest_asymmetric) or an op type "
                             "(e.g. Softmax).")
        if _RULE_ID.match(item.upper()) and item.upper().startswith("NAF"):
            raise UsageError(f"{option} {item}: {item.upper()} is a rewrite rule (nafix fix --select/--ignore take "
                             f"rules); {option} takes the findings of an audit: a constraint id (e.g. resize_nearest_asymmetric, "
                             f"sw_op:Softmax) or an op type (e.g. Softmax); `nafix rules {item.upper()}` lists what "
                             "the rule fixes.")
        out.append(item)
    return tuple(out)


def _node_keys(n: dict[str, Any]) -> set[str]:
    return {str(n.get("op_type"))} | set(n.get("constraints") or ())


def _names(items: Sequence[str], keys: set[str]) -> Optional[str]:
    return next((i for i in items if i in keys), None)


def apply_to_row(row: dict[str, Any], select: Sequence[str], ignore: Sequence[str]) -> dict[str, Any]:
    """``row`` with the findings ``select``/``ignore`` set aside moved to ``ignored_*`` and counted."""
    if row.get("error") or row.get("estimate") is None or not (select or ignore):
        return row

    def kept(keys: set[str]) -> bool:
        if select and _names(select, keys) is None:
            return False
        return not (ignore and _names(ignore, keys) is not None)

    nodes = list(row.get("sw_nodes") or [])
    findings = list(row.get("findings") or [])
    keep_nodes = [n for n in nodes if kept(_node_keys(n))]
    drop_nodes = [n for n in nodes if not kept(_node_keys(n))]
    keep_f = [f for f in findings if kept({str(f.get("constraint"))})]
    drop_f = [f for f in findings if not kept({str(f.get("constraint"))})]
    if not drop_nodes and not drop_f:
        return dict(row, selection=_row_selection(row, select, ignore, [], [], keep_nodes))
    out = dict(row, sw_nodes=keep_nodes, findings=keep_f,
               ignored_sw_nodes=list(row.get("ignored_sw_nodes") or []) + drop_nodes,
               ignored_findings=list(row.get("ignored_findings") or []) + drop_f)
    out["selection"] = _row_selection(row, select, ignore, drop_nodes, drop_f, keep_nodes)
    return out


def _row_selection(row, select, ignore, drop_nodes, drop_f, keep_nodes) -> dict[str, Any]:
    return {"select": list(select), "ignore": list(ignore), "ignored_sw_nodes": len(drop_nodes),
            "ignored_findings": len(drop_f), "sw_epochs_counted": counted_sw_epochs(row, keep_nodes, drop_nodes)}


def counted_sw_epochs(row: dict[str, Any], keep_nodes: list, drop_nodes: list) -> int:
    """The model's estimated SW epochs that are not wholly made of ignored SW nodes (what --fail-on sw
    counts). An SW epoch no SW node claims is counted (nothing ignored it)."""
    total = int((row.get("estimate") or {}).get("sw_epochs") or 0)
    if not drop_nodes:
        return total
    epochs = row.get("epochs")
    if not epochs:  # a report without epochs: subtract what the ignored nodes say they cost
        return max(0, total - sum(int(n.get("sw_epochs") or 0) for n in drop_nodes))
    sw = {e["index"] for e in epochs if e.get("unit") == "SW"}
    kept = {i for n in keep_nodes for i in n.get("epochs") or ()}
    dropped = {i for n in drop_nodes for i in n.get("epochs") or ()} - kept
    return len(sw - dropped)


def counted(row: dict[str, Any]) -> int:
    """The SW epochs of a report row that count for --fail-on sw (after any selection)."""
    sel = row.get("selection")
    if sel is not None and "sw_epochs_counted" in sel:
        return int(sel["sw_epochs_counted"])
    return int((row.get("estimate") or {}).get("sw_epochs") or 0)


def summary(rows: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The report-level counts of what was set aside (None when no selection was given)."""
    sels = [r["selection"] for r in rows if r.get("selection")]
    if not sels:
        return None
    by: dict[str, int] = {}
    for r in rows:
        for n in r.get("ignored_sw_nodes") or ():
            by[str(n.get("op_type"))] = by.get(str(n.get("op_type")), 0) + 1
        for f in r.get("ignored_findings") or ():
            by[str(f.get("constraint"))] = by.get(str(f.get("constraint")), 0) + 1
    return {
        "ignored_sw_nodes": sum(s["ignored_sw_nodes"] for s in sels),
        "ignored_findings": sum(s["ignored_findings"] for s in sels),
        "models": sum(1 for s in sels if s["ignored_sw_nodes"] or s["ignored_findings"]),
        "by": dict(sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def summary_line(sel: Optional[dict[str, Any]]) -> Optional[str]:
    """One sentence for the console, Markdown, concise and github formats, or None."""
    if not sel or not (sel["ignored_sw_nodes"] or sel["ignored_findings"]):
        return None
    by = ", ".join(f"{k} x{v}" for k, v in sel["by"].items())
    return (f"ignored (accepted by --select-finding/--ignore-finding or the config): {sel['ignored_sw_nodes']} SW "
            f"node(s) and {sel['ignored_findings']} finding(s) in {sel['models']} model(s) ({by}); they do not count "
            "for --fail-on or the baseline, and the estimate still includes them.")


_OP_TYPE = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def check_known(items: Sequence[str], rows: list[dict[str, Any]], option: str) -> None:
    """Items that named nothing in this audit must at least be a known constraint id or an op type:
    a typo in --select-finding would otherwise select nothing and pass every model. Loads the
    constraint registry only when an item matched nothing."""
    seen: set[str] = set()
    for r in rows:
        for n in list(r.get("sw_nodes") or []) + list(r.get("ignored_sw_nodes") or []):
            seen |= _node_keys(n)
        for f in list(r.get("findings") or []) + list(r.get("ignored_findings") or []):
            seen.add(str(f.get("constraint")))
    unmatched = [i for i in items if i not in seen and not _OP_TYPE.match(i)
                 and not (i.startswith("sw_op:") and _OP_TYPE.match(i[len("sw_op:"):]))]
    if not unmatched:
        return
    from .facts import CONSTRAINT_ANCHORS
    from .npu.constraints import REGISTRY
    from .rules import PLACEMENT_REASONS

    known = set(REGISTRY) | set(PLACEMENT_REASONS) | set(CONSTRAINT_ANCHORS)
    for item in unmatched:
        if item not in known and not item.startswith("lower"):
            import difflib

            near = difflib.get_close_matches(item, sorted(known), n=1)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            raise UsageError(f"{option} {item}: not a constraint id nafix knows nor an op type (op types are written "
                             f"as in ONNX, e.g. Softmax){hint}")
