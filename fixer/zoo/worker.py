"""The per-model function every executor runs (in-process, a worker process, or a Dask worker)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import NafixError

log = logging.getLogger(__name__)

#: profile and memory pools resolved once per worker process and options
_resolved: dict[str, tuple[Any, Any]] = {}


def _profile_and_pools(opts):
    from ..api import resolve_pools, resolve_profile

    key = repr(opts)
    if key not in _resolved:
        _resolved.clear()
        _resolved[key] = (resolve_profile(opts), resolve_pools(opts))
    return _resolved[key]


def prime(opts, profile, pools) -> None:
    """Remember the profile and pools already resolved for ``opts`` (workers forked after this
    inherit them)."""
    _resolved.clear()
    _resolved[repr(opts)] = (profile, pools)


def error_row(path: str, message: str, sha256: str | None = None) -> dict[str, Any]:
    return {"path": path, "sha256": sha256, "error": message, "estimate": None, "sw_nodes": [], "memory": None}


def audit_one(path: str, opts, sha256: str | None = None) -> dict[str, Any]:
    """Audit one model file and return its report row; every failure becomes an error row."""
    from ..api import analyze_path
    from ..report import analysis_dict

    if sha256 is None:
        from .cache import content_sha256

        sha256 = content_sha256(Path(path))
    try:
        profile, pools = _profile_and_pools(opts)
        analysis = analyze_path(Path(path), opts, profile=profile, pools=pools)
        row: dict[str, Any] = {"path": path, "sha256": sha256, "error": None}
        row.update(analysis_dict(analysis))
        analysis.released()  # free the graph now, not at the next full garbage collection
        return row
    except NafixError as exc:
        return error_row(path, exc.message, sha256)
    except MemoryError:
        return error_row(path, f"{path}: nafix ran out of memory analysing this model.", sha256)
    except Exception as exc:  # noqa: BLE001 - one broken model must not abort a zoo audit
        from ..model_io import invalid_model_error

        log.debug("unexpected error on %s", path, exc_info=True)
        invalid = invalid_model_error(Path(path), exc)
        return error_row(path, invalid.message if invalid else
                         f"{path}: nafix could not analyse this model ({type(exc).__name__}: {exc}).", sha256)


def audit_and_store(path: str, opts, sha256: str | None, key: str | None, cache_root: str | None) -> dict[str, Any]:
    """``audit_one``, then store a successful row in the cache (in the worker: the writes run in
    parallel too)."""
    row = audit_one(path, opts, sha256)
    if key is not None and cache_root is not None:
        from .cache import Cache

        Cache(Path(cache_root)).put(key, row)
    return row


def worker_main(conn, opts, cache_root: str | None = None) -> None:
    """Loop of a worker process: receive (index, path, sha256, cache key), send (index, row); None
    stops it."""
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        index, path, sha, key = task
        row = audit_and_store(path, opts, sha, key, cache_root)
        try:
            conn.send((index, row))
        except (BrokenPipeError, OSError):
            return
