"""``nafix audit merge``: join the JSON reports of shards (or of separate runs) into one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ..errors import InputError
from ..json_schema import REPORT, problem, read_json_file
from .runner import build_report

#: At most this many missing shards are named in the warning (the rest are counted).
_NAMED_MISSING = 20


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a JSON audit report against the shape nafix writes
    (:data:`fixer.json_schema.REPORT`): one InputError naming the file and the JSON path of the first
    bad value otherwise."""
    p = Path(path)
    hint = "write the report again with nafix audit --format json -o FILE."
    data = read_json_file(p, None, what="JSON audit report", hint=hint, missing="report file not found")
    if not (isinstance(data, dict) and "models" in data):
        raise InputError(f"{p}: not a nafix audit JSON report (write one with nafix audit --format json -o FILE).")
    found = problem(data, REPORT)
    if found is not None:
        raise InputError(f"{p}: {found}; {hint}")
    sh = data.get("shard")
    if sh is not None and sh["index"] > sh["count"]:
        raise InputError(f"{p}: shard.index {sh['index']} is more than shard.count {sh['count']}; {hint}")
    return data


def _missing_shards(count: int, got: set[int]) -> str | None:
    """The shards of ``count`` not in ``got``, named up to :data:`_NAMED_MISSING` (the work is bounded
    by the shards given, not by ``count``)."""
    n_missing = count - len(got)
    if n_missing <= 0:
        return None
    named = []
    k = 1
    while len(named) < min(n_missing, _NAMED_MISSING):  # at most len(got) + _NAMED_MISSING steps
        if k not in got:
            named.append(f"{k}/{count}")
        k += 1
    more = f" and {n_missing - len(named):,} more" if n_missing > len(named) else ""
    return f"shard(s) {', '.join(named)}{more} missing from the merge."


def merge_reports(paths: Sequence[str | os.PathLike[str]]) -> tuple[dict[str, Any], list[str]]:
    """The merged report and warnings (missing shards). Reports must share the nafix version and
    profile; a model in two reports is an error (overlapping shards or runs)."""
    if not paths:
        raise InputError("give the JSON reports to merge.")
    reports = [(Path(p), read_report(p)) for p in paths]
    first_path, first = reports[0]
    rows: dict[str, dict[str, Any]] = {}
    seen_in: dict[str, Path] = {}
    shards: dict[int, set[int]] = {}
    for p, r in reports:
        for k in ("nafix_version", "profile"):
            if r.get(k) != first.get(k):
                raise InputError(f"{p}: {k} '{r.get(k)}' differs from '{first.get(k)}' in {first_path}; "
                                 "merge reports of one nafix version and profile.")
        sh = r.get("shard")
        if sh is not None:
            shards.setdefault(sh["count"], set()).add(sh["index"])
        for m in r["models"]:
            if m["path"] in rows:
                raise InputError(f"{p}: model '{m['path']}' is also in {seen_in[m['path']]}; the reports overlap.")
            rows[m["path"]] = m
            seen_in[m["path"]] = p
    warnings = [w for count, got in sorted(shards.items()) if (w := _missing_shards(count, got))]
    return build_report(list(rows.values()), profile=first["profile"], nafix_version=first["nafix_version"]), warnings
