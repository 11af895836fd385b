"""A content-addressed cache of audit rows.

Key = sha256 of (the model's bytes and those of its external data files, the nafix version, a
fingerprint of nafix's own code and rule files, the resolved target profile and memory pools, the
options that change placement). An entry is a JSON file holding its own key and a schema tag; an
entry that does not parse, has another schema, holds another key or a malformed row is ignored and
recomputed, never trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from .. import __version__
from ..json_schema import CACHE_SCHEMA, MAX_CACHE_ENTRY_BYTES, cache_entry, dumps, parse_json, problem, read_json_bytes

log = logging.getLogger(__name__)

SCHEMA = CACHE_SCHEMA
ENV = "NAFIX_CACHE_DIR"
_CHUNK = 1 << 20


def default_cache_dir() -> Path:
    """``$NAFIX_CACHE_DIR``, else the platform's user cache folder + ``nafix``:
    ``%LOCALAPPDATA%\\nafix\\Cache`` (Windows), ``~/Library/Caches/nafix`` (macOS),
    ``$XDG_CACHE_HOME/nafix`` or ``~/.cache/nafix`` (elsewhere)."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "nafix" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "nafix"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache") / "nafix"


def _hash_file(h, path: Path) -> None:
    from ..fsutil import open_regular

    with open_regular(path) as f:  # a FIFO or device raises here, never blocks (before any --timeout applies)
        while chunk := f.read(_CHUNK):
            h.update(chunk)


def content_sha256(path: Path) -> str | None:
    """sha256 of the model file followed by each external data file an ONNX model names (sorted by location);
    None when the file (or a data file) cannot be read: the worker then reports why."""
    from ..fsutil import open_regular

    try:
        h = hashlib.sha256()
        mark, seen, tail = b"location", False, b""
        # streamed: a multi-GB model is never held in memory here; a FIFO or device is refused
        # without blocking (no key: the worker reports it, under --timeout)
        with open_regular(path) as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                seen = seen or mark in tail + chunk
                tail = chunk[-len(mark):]
        if seen and path.suffix.lower() == ".onnx":  # the key of every external-data entry; parse only then
            for loc in _external_locations(path):
                h.update(b"\0" + loc.encode() + b"\0")
                target = (path.parent / loc)
                if not target.resolve().is_relative_to(path.parent.resolve()):
                    return None
                _hash_file(h, target)
        return h.hexdigest()
    except Exception:  # noqa: BLE001 - unreadable: no key, the worker reports the reason
        return None


def _external_locations(path: Path) -> list[str]:
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    from ..fsutil import read_bytes

    model = onnx.load_model_from_string(read_bytes(path))  # the file just hashed, checked again
    locs = set()
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            for e in t.external_data:
                if e.key == "location":
                    locs.add(e.value)
    return sorted(locs)


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over nafix's own source, profile and rule files: a changed placement model never
    reuses results computed by the old one, even without a version bump."""
    import fixer

    h = hashlib.sha256(__version__.encode())
    roots = [Path(fixer.__file__).parent]
    from ..rule_index import builtin_rules_dir  # not fixer.rules: a cache hit needs no rule engine

    roots.append(Path(str(builtin_rules_dir())))
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.suffix in (".py", ".yaml", ".yml", ".json") and p.is_file() and "__pycache__" not in p.parts:
                h.update(p.relative_to(root).as_posix().encode() + b"\0")
                h.update(p.read_bytes())
    return h.hexdigest()


def options_fingerprint(opts, profile, pools) -> str:
    """What changes an audit result besides the model: the resolved profile and pools (so an edited
    profile or .mpool file is seen), the stedgeai options and pinned input shapes."""
    text = json.dumps({
        "analysis": _canonical(opts),  # every option, including those added later (e.g. the core version)
        "profile": _canonical(profile),
        "pools": _canonical(pools),
        "stedgeai_options": sorted(opts.stedgeai_options),
        "input_shapes": {k: list(v) for k, v in sorted(dict(opts.input_shapes).items())},
    }, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(obj: Any) -> Any:
    """A JSON-able form of ``obj`` that is the same in every process: sets sorted (their iteration
    order follows the per-process string hash), dataclasses and mappings by field, no object ids."""
    import dataclasses
    import re
    from collections.abc import Mapping

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (set, frozenset)):
        return sorted((_canonical(v) for v in obj), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if callable(obj):
        return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


def remembered_options_fingerprint(root: Path, opts, compute) -> str:
    """:func:`options_fingerprint` for ``opts``, remembered in the cache folder: a run answered from
    the cache then neither reads the profile YAML nor imports the placement code to compute it.

    The memo is keyed by what the fingerprint is a function of: nafix's code and built-in profiles
    (:func:`code_fingerprint`), the options, and the bytes of a profile file given by path. Memory
    pools from files (--mpool, --profile) are not remembered (computed each time). ``compute()``
    gives the fingerprint (and raises on bad options); a memo that does not read back is computed
    again and replaced."""
    if getattr(opts, "mpool", None) or getattr(opts, "neural_art_profile", None):
        return compute()
    parts: dict[str, Any] = {"schema": SCHEMA, "nafix": __version__, "code": code_fingerprint(),
                             "analysis": _canonical(opts)}
    spec = getattr(opts, "target_profile", None)
    if spec:
        p = Path(spec)
        if p.suffix in (".yaml", ".yml") or p.exists():
            try:
                from ..fsutil import read_bytes

                parts["profile_file"] = hashlib.sha256(read_bytes(p)).hexdigest()
            except Exception:  # noqa: BLE001 - unreadable: compute() says why
                return compute()
    memo = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    f = Path(root) / "v1" / "options" / f"{memo}.fp"  # not .json: not a result entry
    try:
        entry = parse_json(read_json_bytes(f, max_bytes=4096), max_depth=3)
        if isinstance(entry, dict) and entry.get("key") == memo and _is_hex64(entry.get("fingerprint")):
            return entry["fingerprint"]
    except (OSError, ValueError):
        pass
    fp = compute()
    tmp = None
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=f.parent, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(dumps({"schema": SCHEMA, "key": memo, "fingerprint": fp}))
        os.replace(tmp, f)
        tmp = None
    except OSError as exc:  # a read-only or full cache folder only costs speed
        log.debug("could not remember the options fingerprint in %s (%s)", root, exc)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return fp


def _is_hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def cache_key(content: str, options: str) -> str:
    text = json.dumps({"schema": SCHEMA, "content": content, "nafix": __version__, "code": code_fingerprint(),
                       "options": options}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


class Cache:
    """Rows by key under ``root/v1/<2 hex>/<key>.json``. Only successful analyses are stored (an
    error such as a timeout may not happen again)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.hits = 0
        self.misses = 0

    def _file(self, key: str) -> Path:
        return self.root / "v1" / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The row stored under ``key``, or None. An entry that is not a regular file, is too large,
        does not parse as strict JSON, or does not fit :func:`fixer.json_schema.cache_entry` (its
        schema tag, its own key, a row of the shape nafix writes) is ignored: the model is analysed
        again and the entry replaced."""
        f = self._file(key)
        try:
            entry = parse_json(read_json_bytes(f, max_bytes=MAX_CACHE_ENTRY_BYTES), max_depth=None)  # checked below
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError) as exc:  # JSONProblem is a ValueError
            log.debug("ignoring unreadable cache entry %s (%s)", f, exc)
            self.misses += 1
            return None
        found = problem(entry, cache_entry(key))
        if found is not None:
            log.debug("ignoring foreign or malformed cache entry %s (%s)", f, found)
            self.misses += 1
            return None
        self.hits += 1
        return entry["row"]

    def put(self, key: str, row: dict[str, Any]) -> None:
        """Store ``row`` under ``key`` (atomically: a temporary file renamed over the entry). Any
        failure (a read-only or full cache folder, Ctrl-C) removes the temporary file; an OS error
        only costs speed (logged), anything else goes on up."""
        if row.get("error") is not None:
            return
        f = self._file(key)
        try:
            text = dumps({"schema": SCHEMA, "key": key, "row": row})
        except (TypeError, ValueError) as exc:  # pragma: no cover - rows are JSON-able by construction
            log.warning("could not store an audit row in the cache (%s)", exc)
            return
        tmp = None
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=f.parent, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(tmp, f)
            tmp = None
        except OSError as exc:  # a read-only or full cache folder only costs speed
            log.warning("could not write the audit cache in %s (%s)", self.root, exc)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
