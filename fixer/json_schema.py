"""Every JSON file nafix reads back, read one way and checked against the shape nafix writes.

nafix reads its own JSON again in three places: an audit cache entry, a baseline (``--baseline``)
and the reports given to ``nafix audit merge``. Such a file may have been edited, truncated, made by
another tool or made to hurt, so each one is

- **read bounded**: only a regular file (a FIFO or device would block or never end), at most
  ``max_bytes``, UTF-8 (:func:`read_json_file`, :func:`read_json_bytes`);
- **parsed safely**: ``NaN``/``Infinity`` and numbers too large for a float (``1e400``) are not JSON
  values nafix writes, nesting deeper than :data:`MAX_DEPTH` is refused instead of raising
  ``RecursionError`` (:func:`parse_json`, and the schema check for what it parsed);
- **checked against its schema**, recursively (:func:`problem`): text where nafix writes text (no
  NUL byte, valid Unicode), non-negative integers of a sane size where it writes counts, lists of
  strings where it writes lists of strings, and so on; the first bad value is named by its JSON path
  (``models[3].sw_nodes[0].why[0].requirement``).

The shapes themselves (:data:`ROW`, :data:`REPORT`, :data:`BASELINE`, :func:`cache_entry`) describe
what ``fixer.report_data.analysis_dict``, ``fixer.zoo.worker.error_row``, ``fixer.zoo.runner.build_report``,
``fixer.zoo.baseline.make_baseline`` and ``fixer.zoo.cache.Cache.put`` write: a row that passes them
renders in every format. Keys nafix does not read are allowed (any JSON value), so a report of a
newer nafix with an extra field still merges.

Writing: :func:`dumps` is ``json.dumps`` that never writes ``NaN``/``Infinity`` (not JSON): a
non-finite float becomes ``null``.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable

from .errors import InputError
from .fsutil import NotRegularFileError, open_regular

#: Deepest nesting accepted in a file nafix reads back (its own files nest 8 levels at most).
MAX_DEPTH = 32
#: Largest audit report or baseline read (a 10 000-model zoo report is tens of MiB).
MAX_REPORT_BYTES = 512 << 20
#: Largest audit cache entry read (one model's row).
MAX_CACHE_ENTRY_BYTES = 64 << 20
#: Largest count or byte size accepted (a signed 64-bit integer).
MAX_INT = 2**63 - 1


class JSONProblem(ValueError):
    """A file that cannot be read as JSON (not a file, too large, not strict JSON, nested too
    deeply): ``where`` is the JSON path of the bad value ("" for the whole document), ``message``
    what is wrong. (A value that does not fit its schema is a :class:`Bad`.)"""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
        self.message = message


class NotAFile(JSONProblem):
    """The path names a folder, a FIFO, a socket or a device, not a file."""


# ------------------------------------------------------------------------------------------------
# Reading and parsing
# ------------------------------------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise JSONProblem("", f"it holds {name}, which is not a JSON number")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise JSONProblem("", f"it holds the number {text[:40]}, too large for a float")
    return v


def _depth_problem(value: Any, max_depth: int) -> str | None:
    """The JSON path of the first value nested deeper than ``max_depth`` (iterative: no recursion;
    paths are built only for a value that fails)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        v, depth = pop()
        if depth > max_depth:
            break
        for child in (v.values() if v.__class__ is dict else v):
            if child.__class__ is dict or child.__class__ is list:
                push((child, depth + 1))
    else:
        return None
    where, v = "", value  # find the path: follow the deepest branch
    for _ in range(max_depth):
        items = v.items() if isinstance(v, dict) else enumerate(v)
        best = max(((_height(c), k, c) for k, c in items if isinstance(c, (dict, list))), key=lambda t: t[0])
        where, v = _join(where, best[1]), best[2]
    return where


def _height(v: Any) -> int:
    """How many levels of containers ``v`` holds (iterative)."""
    top, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        top = max(top, d)
        for c in (x.values() if isinstance(x, dict) else x):
            if isinstance(c, (dict, list)):
                stack.append((c, d + 1))
    return top


def parse_json(text: str | bytes, *, max_depth: int | None = MAX_DEPTH) -> Any:
    """``text`` parsed as strict JSON, or :class:`JSONProblem`: not JSON, ``NaN``/``Infinity``, a
    number beyond a float, nesting deeper than ``max_depth`` (None: only what the parser itself
    refuses, for a value checked against a :class:`Schema` next, which bounds the nesting)."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except JSONProblem:
        raise
    except RecursionError:  # deeper than the interpreter's recursion limit
        raise JSONProblem("", "it is nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise JSONProblem("", f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, an integer of more than 4300 digits
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise JSONProblem("", f"it is not valid JSON ({first})") from None
    deep = _depth_problem(value, max_depth) if max_depth is not None else None
    if deep is not None:
        raise JSONProblem(deep, f"nested too deeply (more than {max_depth} levels)")
    return value


def read_json_bytes(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``), opened by
    :func:`fixer.fsutil.open_regular` (a FIFO, socket or device is refused without blocking). Raises
    ``FileNotFoundError``, other ``OSError`` for an unreadable file, and :class:`JSONProblem` for
    something that is not a regular file or is too large."""
    try:
        fh = open_regular(path)
    except NotRegularFileError as exc:
        raise NotAFile("", "is a folder" if exc.kind == "a folder"
                       else "is not a regular file (a FIFO, socket or device)") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise JSONProblem("", f"is {size:,} bytes, more than the {max_bytes:,} nafix reads")
        data = fh.read(max_bytes + 1)  # bounded even if the file grows while it is read
    if len(data) > max_bytes:
        raise JSONProblem("", f"is more than the {max_bytes:,} bytes nafix reads")
    return data


def read_json_file(path: str | os.PathLike[str], schema: "Schema | None", *, what: str, hint: str,
                   missing: str | None = None, max_bytes: int | None = None) -> Any:
    """Read, parse and check the JSON file ``path`` (a ``what``, e.g. "baseline file") against
    ``schema``; every failure is one :class:`InputError` sentence naming the file and, for a bad
    value, its JSON path, followed by ``hint`` (what to do). With ``schema`` None the value is
    only parsed: the caller must check it with :func:`problem` before reading into it (the check
    bounds the nesting)."""
    p = Path(path)
    try:
        data = read_json_bytes(p, max_bytes=MAX_REPORT_BYTES if max_bytes is None else max_bytes)
    except FileNotFoundError:
        raise InputError(f"{p}: {missing or f'{what} not found'}.") from None
    except NotAFile as exc:
        raise InputError(f"{p}: {exc.message}; give the {what} itself.") from None
    except JSONProblem as exc:
        raise InputError(f"{p}: the {what} {exc.message}.") from None
    except OSError as exc:
        raise InputError(f"{p}: the {what} cannot be read ({exc.strerror or exc}).") from None
    try:
        value = parse_json(data, max_depth=None)
    except JSONProblem as exc:
        at = f" at {exc.where}" if exc.where else ""
        raise InputError(f"{p}: not a valid {what}{at}: {exc.message}; {hint}") from None
    found = problem(value, schema) if schema is not None else None
    if found is not None:
        raise InputError(f"{p}: {found}; {hint}")
    return value


# ------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` for every JSON nafix writes: never ``NaN`` or ``Infinity`` (not JSON; strict
    parsers, nafix's own included, refuse them): a non-finite float is written as ``null``."""
    kwargs["allow_nan"] = False
    try:
        return json.dumps(obj, **kwargs)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
        return json.dumps(_finite(obj), **kwargs)


# ------------------------------------------------------------------------------------------------
# Schemas
# ------------------------------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _join(where: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    if _IDENT.match(key):
        return f"{where}.{key}" if where else key
    return f"{where}[{json.dumps(key[:80])}]"  # a path or node name as key: quoted (and cut)


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


class Bad:
    """Why a value does not fit: ``message`` ("must be ...") and the keys from the value up to the
    root (``keys``, innermost first: the JSON path is built only for a value that does not fit)."""

    __slots__ = ("message", "keys")

    def __init__(self, message: str):
        self.message = message
        self.keys: list[Any] = []

    def at(self, key: Any) -> "Bad":
        self.keys.append(key)
        return self

    def path(self, root: str = "") -> str:
        where = root
        for k in reversed(self.keys):
            where = _join(where, k)
        return where


class Schema:
    """A JSON shape: :meth:`check` returns None, or :class:`Bad`."""

    expected = "a JSON value"

    def check(self, v: Any) -> Bad | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def bad(self, v: Any) -> Bad:
        return Bad(f"must be {self.expected}, not {_kind(v)}")


def _deep(v: Any, max_depth: int) -> Bad | None:
    """A value nested more than ``max_depth`` levels below ``v`` (iterative: no recursion)."""
    if not isinstance(v, (dict, list)):
        return None
    if _depth_problem(v, max_depth) is None:
        return None
    return Bad(f"is nested too deeply (more than {max_depth} levels)")


class AnyJSON(Schema):
    """Any JSON value, nested at most :data:`MAX_DEPTH` levels (nafix does not read it; it may write
    it again)."""

    def check(self, v):
        return _deep(v, MAX_DEPTH)


class Str(Schema):
    """Text: no NUL byte (a path with one cannot be opened and breaks other tools), valid Unicode
    (no lone surrogate, unless ``surrogates``: a path read from a file name that is not UTF-8)."""

    def __init__(self, *, empty: bool = True, max_len: int | None = None, surrogates: bool = False):
        self.empty, self.max_len, self.surrogates = empty, max_len, surrogates
        self.expected = "a string" if empty else "a non-empty string"

    def check(self, v):
        if v.__class__ is not str:
            if not isinstance(v, str):
                return self.bad(v)
        if not v and not self.empty:
            return Bad("must be a non-empty string")
        if self.max_len is not None and len(v) > self.max_len:
            return Bad(f"must be a string of at most {self.max_len} characters")
        if "\0" in v:
            return Bad("must not hold a NUL byte")
        if not self.surrogates and not v.isascii():
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return Bad("must be valid Unicode text (it holds a lone surrogate)")
        return None


class Int(Schema):
    """An integer (never true/false) in [lo, hi]."""

    def __init__(self, lo: int = 0, hi: int = MAX_INT):
        self.lo, self.hi = lo, hi
        self.expected = "a non-negative integer" if lo == 0 else f"an integer from {lo} to {hi}"

    def check(self, v):
        if v.__class__ is not int:
            return self.bad(v)  # bool is a subclass of int: refused too
        if not self.lo <= v <= self.hi:
            return Bad(f"must be an integer from {self.lo} to {self.hi}, not {v if abs(v) < 10**30 else 'a larger one'}")
        return None


class Num(Schema):
    """A finite number (integer or float, never true/false) in [lo, hi]."""

    def __init__(self, lo: float = -math.inf, hi: float = math.inf):
        self.lo, self.hi = lo, hi
        self.expected = "a number" if math.isinf(lo) and math.isinf(hi) else f"a number from {lo:g} to {hi:g}"

    def check(self, v):
        if v.__class__ is not float and v.__class__ is not int:
            return self.bad(v)
        if v.__class__ is int and abs(v) > MAX_INT or not (self.lo <= v <= self.hi):
            return Bad(f"must be {self.expected}, not {v if abs(v) < 10**30 else 'a larger one'}")
        return None


class Bool(Schema):
    expected = "true or false"

    def check(self, v):
        return None if v is True or v is False else self.bad(v)


class Null(Schema):
    expected = "null"

    def check(self, v):
        return None if v is None else self.bad(v)


class Const(Schema):
    def __init__(self, value: Any):
        self.value = value
        self.expected = json.dumps(value)

    def check(self, v):
        if type(v) is type(self.value) and v == self.value:
            return None
        return Bad(f"must be {self.expected}, not {json.dumps(v[:60]) if isinstance(v, str) else _kind(v)}")


class Opt(Schema):
    """null or ``inner``."""

    def __init__(self, inner: Schema):
        self.inner = inner
        self.expected = f"null or {inner.expected}"

    def check(self, v):
        if v is None:
            return None
        found = self.inner.check(v)
        if found is not None and not found.keys and found.message == self.inner.bad(v).message:
            return self.bad(v)  # the wrong type: say that null would do too
        return found


class ListOf(Schema):
    def __init__(self, item: Schema):
        self.item = item
        self.expected = "a list"

    def check(self, v):
        if v.__class__ is not list:
            return self.bad(v)
        check = self.item.check
        for i, x in enumerate(v):
            found = check(x)
            if found is not None:
                return found.at(i)
        return None


class MapOf(Schema):
    """An object with any keys (checked by ``key``) and values of one shape."""

    def __init__(self, value: Schema, key: Schema = Str()):
        self.key, self.value = key, value
        self.expected = "an object"

    def check(self, v):
        if v.__class__ is not dict:
            return self.bad(v)
        check_key, check = self.key.check, self.value.check
        for k, x in v.items():
            found = check_key(k)
            if found is not None:
                return Bad(f"(a key) {found.message}").at(k)
            found = check(x)
            if found is not None:
                return found.at(k)
        return None


class Obj(Schema):
    """An object with ``required`` and ``optional`` keys of the given shapes; other keys may hold any
    JSON value (nested at most :data:`MAX_DEPTH` levels)."""

    def __init__(self, required: dict[str, Schema], optional: dict[str, Schema] | None = None,
                 *, expected: str = "an object"):
        self.required, self.optional = required, optional or {}
        self.known = set(self.required) | set(self.optional)
        self.expected = expected

    def check(self, v):
        if v.__class__ is not dict:
            return self.bad(v)
        for k, s in self.required.items():
            if k not in v:
                return Bad(f"is missing ({s.expected})").at(k)
            found = s.check(v[k])
            if found is not None:
                return found.at(k)
        for k, s in self.optional.items():
            if k in v:
                found = s.check(v[k])
                if found is not None:
                    return found.at(k)
        if len(v) > len(self.known) or not self.known.issuperset(v):
            for k, x in v.items():
                if k not in self.known:
                    found = _deep(x, MAX_DEPTH)
                    if found is not None:
                        return found.at(k)
        return None


class When(Schema):
    """``then`` when ``test(value)`` holds, else ``otherwise`` (e.g. an error row or an analysed one)."""

    def __init__(self, test: Callable[[Any], bool], then: Schema, otherwise: Schema):
        self.test, self.then, self.otherwise = test, then, otherwise
        self.expected = otherwise.expected

    def check(self, v):
        if v.__class__ is not dict:
            return self.bad(v)
        return (self.then if self.test(v) else self.otherwise).check(v)


def problem(value: Any, schema: Schema, where: str = "") -> str | None:
    """None when ``value`` fits ``schema``, else one phrase: "<JSON path> must be ..."."""
    found = schema.check(value)
    if found is None:
        return None
    return f"{found.path(where) or 'the top level'} {found.message}"


# ------------------------------------------------------------------------------------------------
# The shapes nafix writes
# ------------------------------------------------------------------------------------------------

TEXT = Str()
NAME = Str()  # node, tensor and op names: any text, never NUL
TEXTS = ListOf(TEXT)
COUNT = Int()
#: A model path as a row names it (a file name that is not UTF-8 holds lone surrogates, as Python
#: reads it: nafix writes them as \udcXX escapes, which every writer handles).
PATH = Str(empty=False, max_len=4096, surrogates=True)

#: ``fixer.npu.estimate.EpochEstimate.as_dict``
ESTIMATE = Obj(
    {"epochs": COUNT, "sw_epochs": COUNT, "hw_ratio": Num(0.0, 1.0)},
    {"hybrid_epochs": Opt(COUNT), "hw_epochs": Opt(COUNT), "sw_ops": MapOf(COUNT), "hybrid_ops": MapOf(COUNT),
     "core": Opt(TEXT)},
)
#: ``fixer.npu.memory.MemoryEstimate.as_dict``
MEMORY = Obj(
    {"fits_on_chip": Bool()},
    {"weights_bytes": Opt(COUNT), "peak_activation_bytes": Opt(COUNT), "onchip_activation_capacity_bytes": Opt(COUNT),
     "peak_at": Opt(NAME), "largest_tensor": Opt(NAME), "largest_tensor_bytes": Opt(COUNT),
     "external_activation_bytes": Opt(COUNT), "unallocated_bytes": Opt(COUNT), "tensors_of_unknown_size": Opt(COUNT),
     "pools": ListOf(Obj({}, {"pool": Opt(TEXT), "kind": Opt(TEXT), "bytes": Opt(COUNT), "on_chip": Opt(Bool())}))},
)
#: One failing requirement (``why`` of a SW node, a finding, a note).
REASON = {"constraint": TEXT, "requirement": TEXT, "detail": TEXT, "tag": TEXT}
#: ``fixer.results.ModelAnalysis.sw_nodes`` plus ``why`` (``fixer.report_data.analysis_dict``)
SW_NODE = Obj(
    {"name": NAME, "op_type": NAME, "reasons": TEXTS},
    {"constraints": TEXTS, "tags": TEXTS, "why": ListOf(Obj(REASON)), "kernel": Opt(TEXT), "role": Opt(TEXT),
     "unit": TEXT, "reported_as": TEXTS, "from_nodes": TEXTS},
)
NOTE = Obj({"name": NAME, "op_type": NAME, "note": TEXT, **REASON}, {"severity": TEXT})
FINDING = Obj({**REASON, "severity": TEXT})
EPOCH = Obj({"index": COUNT, "unit": TEXT, "nodes": ListOf(NAME)}, {"reported_as": TEXT, "ms": Opt(Num(0.0))})

#: A model that was analysed: ``fixer.report_data.analysis_dict`` plus path, sha256 and error.
ANALYSED_ROW = Obj(
    {"path": PATH, "estimate": ESTIMATE, "memory": MEMORY, "sw_nodes": ListOf(SW_NODE)},
    {"sha256": Opt(TEXT), "error": Null(), "notes": ListOf(NOTE), "findings": ListOf(FINDING),
     "epochs": ListOf(EPOCH), "dynamic_dims": TEXTS, "warnings": TEXTS, "source_format": TEXT,
     "import_check": Opt(Obj({})), "oe_export": Bool(), "status": TEXT, "quantize": Opt(Obj({}))},
)
#: A model that could not be analysed (``fixer.zoo.worker.error_row``).
ERROR_ROW = Obj(
    {"path": PATH, "error": Str(empty=False)},
    {"sha256": Opt(TEXT), "estimate": Opt(ESTIMATE), "memory": Opt(MEMORY), "sw_nodes": ListOf(SW_NODE),
     "findings": ListOf(FINDING), "notes": ListOf(NOTE)},
)
#: One model of ``nafix audit --format json``.
ROW = When(lambda r: r.get("error") not in (None, ""), ERROR_ROW, ANALYSED_ROW)

#: ``nafix audit --format json`` (``fixer.zoo.runner.build_report``); what ``audit merge`` reads.
#: The summary is not read back (merge computes it again from the rows).
REPORT = Obj(
    {"nafix_version": TEXT, "profile": TEXT, "models": ListOf(ROW)},
    {"shard": Opt(Obj({"index": Int(1), "count": Int(1)})), "note": TEXT},
    expected="a nafix audit JSON report (an object with \"nafix_version\", \"profile\" and \"models\")",
)

BASELINE_SCHEMA = "nafix-baseline/1"
#: ``fixer.zoo.baseline.make_baseline``
BASELINE = Obj(
    {"schema": Const(BASELINE_SCHEMA),
     "models": MapOf(Obj(
         {"sw_nodes": MapOf(Obj({}, {"op_type": NAME, "constraints": TEXTS, "reasons": TEXTS}), key=NAME),
          "hw_ratio": Num(0.0, 1.0), "fits_on_chip": Bool()},
         {"sha256": Opt(TEXT), "compile_errors": TEXTS, "latency_ms": Num(0.0)}), key=PATH)},
    {"nafix_version": TEXT, "profile": TEXT},
    expected=f"a nafix baseline (an object with \"schema\": \"{BASELINE_SCHEMA}\")",
)

CACHE_SCHEMA = "nafix-audit-cache/1"


def cache_entry(key: str) -> Schema:
    """``fixer.zoo.cache.Cache.put``: its own key and schema tag, and a row of an analysed model."""
    return Obj({"schema": Const(CACHE_SCHEMA), "key": Const(key), "row": ANALYSED_ROW})

