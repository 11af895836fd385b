"""The zoo summary: where a model-zoo owner should start."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

#: HW-ratio buckets of the distribution: (label, lower bound inclusive, upper bound exclusive)
BUCKETS = (("100%", 1.0, 2.0), ("90-99%", 0.9, 1.0), ("75-89%", 0.75, 0.9), ("50-74%", 0.5, 0.75), ("<50%", 0.0, 0.5))


def sw_epochs_by_op(row: dict[str, Any]) -> Counter:
    """Estimated SW epochs of one model row by the op name the report would print (hybrid epochs
    as "OP (hybrid)")."""
    e = row.get("estimate") or {}
    if "sw_ops" in e:
        c = Counter(e.get("sw_ops") or {})
        c.update({f"{op} (hybrid)": n for op, n in (e.get("hybrid_ops") or {}).items()})
        return c
    ops = {n["name"]: n["op_type"] for n in row.get("sw_nodes") or []}  # a report without "sw_ops"
    c = Counter()
    for ep in row.get("epochs") or []:
        if ep.get("unit") == "SW":
            c[next((ops[n] for n in ep.get("nodes", []) if n in ops), "?")] += 1
    return c


def _entry_keys(row: dict[str, Any], n: dict[str, Any]) -> set[str]:
    """The constraints a rule can fix on one SW-node entry of a row. A graph node's: its failing
    constraints and ``sw_op:OP``; an op the compiler inserts when lowering a node (no graph node of
    its own: a DepthToSpace of a nearest Resize is not one NAF010 could rewrite) gives its lowering
    and the notes on the node it lowers (a dilated Conv's ``conv_dilation``: its SpaceToDepth and
    DepthToSpace epochs are what NAF015 removes)."""
    keys = set(n.get("constraints") or [])
    if any(c.startswith("lowering") for c in keys):
        origin = set(n.get("from_nodes") or [])
        keys.update(x.get("constraint") for x in row.get("notes") or []
                    if x.get("name") in origin and x.get("constraint") and x.get("severity") == "note")
    else:
        keys.add(f"sw_op:{n['op_type']}")
    return keys


def _entry_epochs(n: dict[str, Any]) -> set:
    """The estimated SW and hybrid epochs an entry's fix addresses: its own, or the SW epoch it runs in
    (a graph-input conversion inside the float prologue's epoch); a report without the lists: one."""
    if "epochs" not in n:
        return {n["name"]}
    return set(n.get("epochs") or []) | ({n["in_epoch"]} if n.get("in_epoch") is not None else set())


def _addressed_ms(rows: list[dict[str, Any]], addressed: set) -> float | None:
    """The estimated ms of the epochs ``addressed`` ((model path, epoch index) pairs) over ``rows``;
    None when one of them carries no estimated time."""
    ms = {(r["path"], ep.get("index")): ep.get("ms") for r in rows for ep in r.get("epochs") or []}
    total = 0.0
    for key in addressed:
        v = ms.get(key)
        if v is None:
            return None
        total += v
    return total


def sw_ms_by_op(row: dict[str, Any]) -> Counter | None:
    """Estimated ms of the SW (and hybrid, as "OP (hybrid)") epochs of one model row by the op name
    the report would print; None when the row's epochs carry no estimated time."""
    eps = [ep for ep in row.get("epochs") or [] if ep.get("unit") in ("SW", "hybrid")]
    if not eps or any(ep.get("ms") is None or "reported_as" not in ep for ep in eps):
        return None
    c: Counter = Counter()
    for ep in eps:
        c[ep["reported_as"] + (" (hybrid)" if ep["unit"] == "hybrid" else "")] += ep["ms"]
    return c


def _row_constraints(row: dict[str, Any]) -> set[str]:
    keys: set[str] = set()
    for n in row.get("sw_nodes") or []:
        keys |= _entry_keys(row, n)
    for f in row.get("findings") or []:
        if f.get("severity") != "note":
            keys.add(f["constraint"])
    return keys


def zoo_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Models audited / failed, the estimated HW-ratio distribution, the SW op types costing the
    most estimated epochs over the zoo, and the nafix rules that address them (by the constraints
    each rule ``fixes``: a rule may still not apply to a given node; ``nafix MODEL`` says)."""
    ok = [r for r in rows if not r.get("error") and r.get("estimate")]
    ratios = [r["estimate"]["hw_ratio"] for r in ok]
    dist = [{"range": label, "models": sum(1 for x in ratios if low <= x < high)} for label, low, high in BUCKETS]
    ops: Counter = Counter()
    op_ms: Counter = Counter()
    timed = True  # every row's SW epochs carry an estimated time: the op types are ranked by it
    op_models: dict[str, set[str]] = defaultdict(set)
    for r in ok:
        counts = sw_epochs_by_op(r)
        for op, n in counts.items():
            ops[op] += n
            op_models[op].add(r["path"])
        ms = sw_ms_by_op(r) if counts else Counter()
        if ms is None:
            timed = False
        else:
            op_ms.update(ms)
    rules_out = []
    try:
        from ..rule_index import builtin_rule_refs  # light: no rule engine for a summary

        rules = builtin_rule_refs()
    except Exception:  # noqa: BLE001 - the summary never fails an audit
        rules = []
    for rule in rules:
        fixes = set(rule.fixes)
        models = [r["path"] for r in ok if fixes & _row_constraints(r)]
        if not models:
            continue
        hits = [(r["path"], n) for r in ok for n in r.get("sw_nodes") or [] if fixes & _entry_keys(r, n)]
        addressed = {(path, i) for path, n in hits for i in _entry_epochs(n)}
        ms = _addressed_ms(ok, addressed) if timed else None
        rules_out.append({
            "rule": rule.id, "name": rule.name, "opt_in": rule.opt_in, "models": len(models), "sw_nodes": len(hits),
            "epochs": len(addressed),
            # the estimated ms of the SW/hybrid epochs it addresses: at most what it could save
            **({"ms": round(ms, 3)} if ms is not None else {}),
            # an opt-in rule is added to the default set: --select would run it alone
            "command": f"nafix MODEL --extend-select {rule.id}" if rule.opt_in else "nafix MODEL",
        })
    # ranked by the estimated ms they address where every row has it, else by the models they address
    rules_out.sort(key=lambda d: ((-d["ms"],) if "ms" in d else ()) + (-d["models"], d["rule"]))
    from ..report_data import row_status

    severities = [{f.get("severity") for f in r.get("findings") or ()} for r in ok]
    gains = [(r["path"], r["quantize"]) for r in ok if r.get("quantize")]
    ms = [g["ms"].get("removed") for _, g in gains]
    return {
        "models": len(rows),
        "audited": len(ok),
        "failed": len(rows) - len(ok),
        "with_sw": sum(1 for r in ok if r["estimate"]["sw_epochs"] > 0),
        "hw_ratio": {
            "min": min(ratios) if ratios else None,
            "median": round(statistics.median(ratios), 4) if ratios else None,
            "max": max(ratios) if ratios else None,
            "distribution": dist,
        },
        # ranked by estimated ms (nafix's cost model) where every row has it, else by SW epochs
        "sw_op_types": [{"op_type": op, "sw_epochs": n, **({"ms": round(op_ms[op], 3)} if timed else {}),
                         "models": len(op_models[op])}
                        for op, n in sorted(ops.items(), key=lambda kv: ((-op_ms[kv[0]],) if timed else ())
                                            + (-kv[1], kv[0]))],
        "rules": rules_out,
        # models stedgeai is predicted to reject / that compile but are predicted to hang the board
        "compile_errors": sum(1 for sev in severities if "compile_error" in sev),
        "board_hangs": sum(1 for sev in severities if "hang" in sev),
        "status": {st: [r["path"] for r in ok if row_status(r) == st] for st in ("compile_error", "hang")},
        # models whose estimated SW epochs --quantize would remove (float, or float islands to calibrate)
        "quantize": {
            "models": len(gains),
            "float": sum(1 for _, g in gains if g["kind"] == "float"),
            "float_islands": sum(1 for _, g in gains if g["kind"] != "float"),
            "sw_epochs_removed": sum(g["sw_epochs"]["removed"] for _, g in gains),
            "ms_removed": round(sum(ms), 3) if gains and all(x is not None for x in ms) else None,
            "paths": [p for p, _ in sorted(gains, key=lambda pg: (-pg[1]["sw_epochs"]["removed"], pg[0]))],
            "command": "nafix MODEL --quantize",
        },
    }
