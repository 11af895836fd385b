"""Rule files: loading, validation and selection.

A rule is one YAML file ``NAF###-kebab-name.yaml`` saying what it matches, why, which NPU
constraint it fixes, which registered rewriter rebuilds the match, and how the result is verified.
Validation happens at load time: an unknown key, predicate, rewriter or parameter is an error naming
the file, the YAML path and the closest known name.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence


from .errors import RuleError, UsageError, read_yaml
from .gate.contracts import CONTRACTS, VerifyContract
from .predicates import PREDICATES
from .rewriters import REWRITERS, load_all

ID_RE = re.compile(r"^[A-Z]{3}\d{3}$")
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
TOP_KEYS = {"id", "name", "summary", "why", "references", "fixes", "match", "rewrite", "verify", "opt_in"}
REQUIRED = ("id", "name", "summary", "why", "references", "fixes", "match", "rewrite", "verify")
#: Reason ids that placement gives besides the registered constraints.
PLACEMENT_REASONS = ("graph_edge_quantize", "graph_edge_dequantize", "float_island", "operator_table")



@dataclass(frozen=True)
class Condition:
    predicate: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    summary: str
    why: str
    references: tuple[str, ...]
    fixes: tuple[str, ...]
    ops: tuple[str, ...]
    when: tuple[Condition, ...]
    rewriter: str
    params: Mapping[str, Any]
    verify: VerifyContract
    opt_in: bool
    path: str
    builtin: bool = True

    @property
    def title(self) -> str:
        return f"{self.id} {self.name}"


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _err(path: str, where: str, msg: str) -> RuleError:
    return RuleError(f"{path}: {where}: {msg}")


def parse_rule(data: Any, path: str, *, builtin: bool = True) -> Rule:
    """Validate one rule mapping (as loaded from YAML) into a :class:`Rule`."""
    from .npu.constraints import REGISTRY

    load_all()
    if not isinstance(data, Mapping):
        raise _err(path, "<top>", "a rule file must be a mapping with id, name, summary, why, match, rewrite, verify.")
    for key in data:
        if key not in TOP_KEYS:
            raise _err(path, str(key), f"unknown key{_suggest(key, TOP_KEYS)}")
    for key in REQUIRED:
        if key not in data or data[key] in (None, "", []):
            raise _err(path, key, "is required" + (" (say why the pattern is slow, with facts)" if key == "why" else ""))
    rid = str(data["id"])
    if not ID_RE.match(rid):
        raise _err(path, "id", f"'{rid}' is not of the form NAF123")
    name = str(data["name"])
    if not NAME_RE.match(name):
        raise _err(path, "name", f"'{name}' must be kebab-case (lowercase words joined by '-')")
    fname = Path(path).name
    if fname.endswith((".yaml", ".yml")) and not fname.startswith(f"{rid}-{name}."):
        raise _err(path, "id", f"the file must be named {rid}-{name}.yaml")
    refs = data["references"]
    if isinstance(refs, str) or not isinstance(refs, Sequence):
        raise _err(path, "references", "must be a list of sources")
    fixes = data["fixes"]
    if isinstance(fixes, str):
        fixes = [fixes]
    known_fixes = set(REGISTRY) | set(PLACEMENT_REASONS)
    for i, f in enumerate(fixes):
        if f not in known_fixes and not str(f).startswith("sw_op:"):
            raise _err(path, f"fixes[{i}]", f"unknown constraint '{f}'{_suggest(f, known_fixes)}")
    match = data["match"]
    if not isinstance(match, Mapping):
        raise _err(path, "match", "must be a mapping with 'op' and 'when'")
    for key in match:
        if key not in ("op", "when"):
            raise _err(path, f"match.{key}", f"unknown key{_suggest(key, ('op', 'when'))}")
    ops = match.get("op")
    if not ops:
        raise _err(path, "match.op", "is required (the anchor op type or a list of them)")
    ops = (ops,) if isinstance(ops, str) else tuple(str(o) for o in ops)
    when_raw = match.get("when") or []
    if not isinstance(when_raw, Sequence) or isinstance(when_raw, str):
        raise _err(path, "match.when", "must be a list of {predicate: NAME, ...params}")
    when = []
    for i, item in enumerate(when_raw):
        where = f"match.when[{i}]"
        if isinstance(item, str):
            item = {"predicate": item}
        if not isinstance(item, Mapping) or "predicate" not in item:
            raise _err(path, where, "must be a mapping with a 'predicate' key")
        pname = str(item["predicate"])
        if pname not in PREDICATES:
            raise _err(path, f"{where}.predicate", f"unknown predicate '{pname}'{_suggest(pname, PREDICATES)}")
        pred = PREDICATES[pname]
        params = {k: v for k, v in item.items() if k != "predicate"}
        for k in params:
            if k not in pred.params:
                raise _err(path, f"{where}.{k}", f"predicate '{pname}' has no parameter '{k}'{_suggest(k, pred.params)}")
        for k in pred.required:
            if k not in params:
                raise _err(path, where, f"predicate '{pname}' needs the parameter '{k}'")
        if pname == "fails_constraint" and params["constraint"] not in known_fixes and not str(params["constraint"]).startswith("sw_op:"):
            c = params["constraint"]
            raise _err(path, f"{where}.constraint", f"unknown constraint '{c}'{_suggest(c, known_fixes)}")
        when.append(Condition(pname, params))
    rw = data["rewrite"]
    if not isinstance(rw, Mapping) or "rewriter" not in rw:
        raise _err(path, "rewrite", "must be a mapping with 'rewriter' and optional 'params'")
    for key in rw:
        if key not in ("rewriter", "params"):
            raise _err(path, f"rewrite.{key}", f"unknown key{_suggest(key, ('rewriter', 'params'))}")
    rname = str(rw["rewriter"])
    if rname not in REWRITERS:
        raise _err(path, "rewrite.rewriter", f"unknown rewriter '{rname}'{_suggest(rname, REWRITERS)}")
    params = dict(rw.get("params") or {})
    allowed = REWRITERS[rname].params
    for k in params:
        if k not in allowed:
            raise _err(path, f"rewrite.params.{k}", f"rewriter '{rname}' has no parameter '{k}'{_suggest(k, allowed)}")
    ver = data["verify"]
    if not isinstance(ver, Mapping):
        raise _err(path, "verify", "must be a mapping with 'contract'")
    for key in ver:
        if key not in ("contract", "rtol", "atol", "lsb"):
            raise _err(path, f"verify.{key}", f"unknown key{_suggest(key, ('contract', 'rtol', 'atol', 'lsb'))}")
    contract = str(ver.get("contract", ""))
    if contract not in CONTRACTS:
        raise _err(path, "verify.contract", f"'{contract}' is not one of {', '.join(CONTRACTS)}{_suggest(contract, CONTRACTS)}")
    try:
        vc = VerifyContract(contract, float(ver.get("rtol", 1e-5)), float(ver.get("atol", 0.0)), float(ver.get("lsb", 1)))
    except (TypeError, ValueError):
        raise _err(path, "verify", "rtol, atol and lsb must be numbers") from None
    opt_in = data.get("opt_in", False)
    if not isinstance(opt_in, bool):
        raise _err(path, "opt_in", "must be true or false")
    return Rule(
        id=rid, name=name, summary=" ".join(str(data["summary"]).split()), why=" ".join(str(data["why"]).split()),
        references=tuple(str(r) for r in refs), fixes=tuple(str(f) for f in fixes), ops=ops, when=tuple(when),
        rewriter=rname, params={**allowed, **params}, verify=vc, opt_in=opt_in, path=path, builtin=builtin,
    )


from .rule_index import builtin_rules_dir  # noqa: E402,F401  (defined there: light, for the cache key)


def _iter_rule_files(folder) -> list:
    files = []
    if isinstance(folder, Path):
        if not folder.is_dir():
            raise UsageError(f"--rules {folder}: not a folder.")
        return sorted(p for p in folder.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    for entry in folder.iterdir():
        if entry.is_file() and entry.name.endswith((".yaml", ".yml")):
            files.append(entry)
    return sorted(files, key=lambda e: e.name)


#: Rules parsed in this process, by (label, built-in, file bytes): a library caller fixing a folder
#: of models parses each rule file once (a Rule is frozen); a file whose text changed is parsed again.
_PARSED: dict[tuple, "Rule"] = {}


def _read_rule_bytes(f, label: str) -> bytes:
    from .fsutil import read_bytes

    try:
        return read_bytes(f) if isinstance(f, Path) else f.read_bytes()  # a FIFO named *.yaml is refused
    except OSError as exc:
        raise RuleError(f"{label}: cannot be read ({exc.strerror or exc}).") from None


def load_rules(extra_dirs: Sequence[str | Path] = ()) -> list[Rule]:
    """Load the built-in rules plus the rules in ``extra_dirs`` (``--rules DIR``), sorted by id."""
    rules: list[Rule] = []
    sources = [(builtin_rules_dir(), True)] + [(Path(d), False) for d in extra_dirs]
    for folder, builtin in sources:
        for f in _iter_rule_files(folder):
            label = str(f) if not builtin else f"rules/{f.name}"
            raw = _read_rule_bytes(f, label)
            key = (label, builtin, raw)
            if key in _PARSED:  # the same file text parsed before in this process (a fix per model)
                rules.append(_PARSED[key])
                continue
            data = read_yaml(f if isinstance(f, Path) else f.read_text(encoding="utf-8"), label, RuleError)
            try:
                rule = parse_rule(data, label, builtin=builtin)
            except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
                raise RuleError(f"{label}: a field has the wrong type or shape ({type(exc).__name__}: {exc}).") from None
            _PARSED[key] = rule
            rules.append(rule)
    seen: dict[str, str] = {}
    for r in rules:
        if r.id in seen:
            raise RuleError(f"{r.path}: id {r.id} is already used by {seen[r.id]}.")
        seen[r.id] = r.path
    return sorted(rules, key=lambda r: r.id)


def select_rules(rules: Sequence[Rule], *, select: Sequence[str] = (), ignore: Sequence[str] = (),
                 extend: Sequence[str] = ()) -> list[Rule]:
    """Apply ``--select`` / ``--extend-select`` / ``--ignore`` (ids or names). ``select`` replaces the
    default rules (every rule not opt-in) by the ones named; ``extend`` adds the ones named to
    whichever set that gives (ruff's spelling); ``ignore`` removes rules last. Opt-in rules run only
    when selected or added."""
    by_key = {r.id: r for r in rules} | {r.name: r for r in rules}
    for k in list(select) + list(ignore) + list(extend):
        if k not in by_key and k.upper() not in by_key:
            raise UsageError(f"unknown rule '{k}'{_suggest(k, by_key)} (see nafix rules).")
    sel = {by_key.get(k, by_key.get(k.upper())).id for k in select}
    ign = {by_key.get(k, by_key.get(k.upper())).id for k in ignore}
    ext = {by_key.get(k, by_key.get(k.upper())).id for k in extend}
    out = []
    for r in rules:
        if r.id in ign:
            continue
        if r.id in ext or (r.id in sel if sel else not r.opt_in):
            out.append(r)
    return out
