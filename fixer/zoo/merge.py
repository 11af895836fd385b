"""``nafix audit merge``: join the JSON reports of shards (or of separate runs) into one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from ..errors import InputError
from ..model_io import regular_file
from .rows import row_problem
from .runner import build_report


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    regular_file(p, "JSON audit report", missing="report file not found")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{p}: not a JSON audit report ({exc}).") from None
    if not (isinstance(data, dict) and isinstance(data.get("models"), list) and isinstance(data.get("profile"), str)):
        raise InputError(f"{p}: not a nafix audit JSON report (write one with nafix audit --format json -o FILE).")
    for i, m in enumerate(data["models"]):
        problem = row_problem(m)
        if problem is not None:
            raise InputError(f"{p}: models[{i}] is malformed ({problem}); write the report again with nafix audit --format json.")
    return data


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
        if isinstance(sh, dict) and isinstance(sh.get("index"), int) and isinstance(sh.get("count"), int):
            shards.setdefault(sh["count"], set()).add(sh["index"])
        for m in r["models"]:
            if m["path"] in rows:
                raise InputError(f"{p}: model '{m['path']}' is also in {seen_in[m['path']]}; the reports overlap.")
            rows[m["path"]] = m
            seen_in[m["path"]] = p
    warnings = []
    for count, got in sorted(shards.items()):
        missing = sorted(set(range(1, count + 1)) - got)
        if missing:
            warnings.append(f"shard(s) {', '.join(f'{k}/{count}' for k in missing)} missing from the merge.")
    return build_report(list(rows.values()), profile=first["profile"], nafix_version=first["nafix_version"]), warnings
