"""What the reports say about the rules (id, name, opt-in, the constraints each fixes), read from the
built-in rule files without the rule engine: an audit answered from the result cache, its zoo
summary and its SARIF help need no rewriter, predicate or onnx import. :mod:`fixer.rules` parses and
checks the same files in full; a test keeps the two readings the same."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class RuleRef:
    id: str
    name: str
    fixes: tuple[str, ...]
    opt_in: bool


def builtin_rules_dir():
    """The rules shipped with nafix: inside the wheel (fixer/_rules), or rules/ in a source checkout."""
    res = resources.files("fixer") / "_rules"
    if res.is_dir():
        return res
    return Path(__file__).resolve().parent.parent / "rules"


_KEYS = ("id", "name", "fixes", "opt_in")
_SCALAR = re.compile(r"^(id|name|opt_in):[ \t]*(?P<v>[A-Za-z0-9_.:-]+)[ \t]*(#.*)?$")
_FLOW = re.compile(r"^fixes:[ \t]*\[(?P<v>[^\]\[#]*)\][ \t]*(#.*)?$")
_ITEM = re.compile(r"^[ \t]*[\"']?(?P<v>[A-Za-z0-9_.:-]+)[\"']?[ \t]*$")


def _quick(text: str) -> dict | None:
    """The four keys when the file writes them the plain way the built-in rules do (``id: NAF003``,
    ``fixes: [a, "sw_op:B"]``, ``opt_in: true`` or none), else None: the caller reads the YAML then. No YAML
    import: an audit answered from the cache reads the rules this way."""
    found: dict = {}
    for line in text.splitlines():
        m = _SCALAR.match(line)
        if m:
            found[m.group(1)] = m.group("v")
            continue
        m = _FLOW.match(line)
        if m:
            items = [i for i in m.group("v").split(",") if i.strip()]
            parsed = [_ITEM.match(i) for i in items]
            if not all(parsed):
                return None
            found["fixes"] = [p.group("v") for p in parsed]
        elif line.startswith(_KEYS) and line.split(":", 1)[0] in _KEYS:
            return None  # one of the keys written another way (a block list, a quoted id): read the YAML
    found.setdefault("opt_in", "false")  # the default of a rule file
    if set(found) != set(_KEYS) or found["opt_in"] not in ("true", "false"):
        return None
    return dict(found, opt_in=found["opt_in"] == "true")


@lru_cache(maxsize=1)
def builtin_rule_refs() -> tuple[RuleRef, ...]:
    """The built-in rules, sorted by id (a file that does not read is left out: `nafix rules` and
    `nafix fix` report it, with the full check)."""
    out = []
    for f in sorted(builtin_rules_dir().iterdir(), key=lambda p: p.name):
        if not f.name.endswith((".yaml", ".yml")):
            continue
        try:
            text = f.read_text(encoding="utf-8")
            data = _quick(text)
            if data is None:
                import yaml

                data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
            fixes = data["fixes"]
            out.append(RuleRef(str(data["id"]), str(data["name"]), tuple([fixes] if isinstance(fixes, str) else fixes),
                               bool(data.get("opt_in", False))))
        except Exception:  # noqa: BLE001 - see the docstring
            continue
    return tuple(sorted(out, key=lambda r: r.id))


def rules_fixing(constraint: str) -> list[RuleRef]:
    """The built-in rules whose ``fixes`` name ``constraint`` (a constraint id or ``sw_op:OP``)."""
    return [r for r in builtin_rule_refs() if constraint in r.fixes]
