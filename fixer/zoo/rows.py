"""The shape of a report row (one model of ``nafix audit --format json``), checked wherever a row
comes from outside this process's own analysis: a cache entry, a report given to ``merge``."""

from __future__ import annotations

from typing import Any


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def row_problem(row: Any) -> str | None:
    """None for a well-formed row, else what is wrong (a phrase)."""
    if not isinstance(row, dict) or not isinstance(row.get("path"), str):
        return "a model entry is not an object with a \"path\""
    if row.get("error") is not None:
        return None if isinstance(row["error"], str) else "\"error\" is not text"
    e, mem = row.get("estimate"), row.get("memory")
    if not (isinstance(e, dict) and _is_int(e.get("epochs")) and _is_int(e.get("sw_epochs")) and _is_num(e.get("hw_ratio"))):
        return "\"estimate\" needs integer \"epochs\", \"sw_epochs\" and a numeric \"hw_ratio\""
    if not (isinstance(mem, dict) and isinstance(mem.get("fits_on_chip"), bool)
            and all(mem.get(k) is None or _is_int(mem.get(k))
                    for k in ("weights_bytes", "peak_activation_bytes", "onchip_activation_capacity_bytes"))):
        return "\"memory\" needs \"fits_on_chip\" and byte counts"
    nodes = row.get("sw_nodes")
    if not (isinstance(nodes, list) and all(
            isinstance(n, dict) and isinstance(n.get("name"), str) and isinstance(n.get("op_type"), str)
            and isinstance(n.get("reasons"), list) and all(isinstance(r, str) for r in n["reasons"])
            and isinstance(n.get("constraints", []), list)
            and isinstance(n.get("why", []), list) and all(isinstance(w, dict) for w in n.get("why", []))
            for n in nodes)):
        return "\"sw_nodes\" must be objects with a \"name\", an \"op_type\" and \"reasons\""
    findings = row.get("findings", [])
    if not (isinstance(findings, list) and all(
            isinstance(f, dict) and all(isinstance(f.get(k), str) for k in ("constraint", "requirement", "detail", "tag", "severity"))
            for f in findings)):
        return "\"findings\" must be objects with text fields"
    for key in ("epochs", "notes"):
        if not isinstance(row.get(key, []), list) or not all(isinstance(x, dict) for x in row.get(key, [])):
            return f"\"{key}\" must be a list of objects"
    return None
