"""What the reports say about the rules (id, name, opt-in, the constraints each fixes), read from the
built-in rule files without the rule engine: an audit answered from the result cache, its zoo
summary and its SARIF help need no rewriter, predicate or onnx import. :mod:`fixer.rules` parses and
checks the same files in full; a test keeps the two readings the same."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class RuleRef:
    id: str
    name: str
    summary: str
    fixes: tuple[str, ...]
    opt_in: bool


def builtin_rules_dir():
    """The rules shipped with nafix: inside the wheel (fixer/_rules), or rules/ in a source checkout."""
    res = resources.files("fixer") / "_rules"
    if res.is_dir():
        return res
    return Path(__file__).resolve().parent.parent / "rules"


@lru_cache(maxsize=1)
def builtin_rule_refs() -> tuple[RuleRef, ...]:
    """The built-in rules, sorted by id (a file that does not read is left out: `nafix rules` and
    `nafix fix` report it, with the full check)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out = []
    for f in sorted(builtin_rules_dir().iterdir(), key=lambda p: p.name):
        if not f.name.endswith((".yaml", ".yml")):
            continue
        try:
            data = yaml.load(f.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a safe loader
            fixes = data["fixes"]
            out.append(RuleRef(str(data["id"]), str(data["name"]), str(data.get("summary", "")),
                               tuple([fixes] if isinstance(fixes, str) else fixes), bool(data.get("opt_in", False))))
        except Exception:  # noqa: BLE001 - see the docstring
            continue
    return tuple(sorted(out, key=lambda r: r.id))


def rules_fixing(constraint: str) -> list[RuleRef]:
    """The built-in rules whose ``fixes`` name ``constraint`` (a constraint id or ``sw_op:OP``)."""
    return [r for r in builtin_rule_refs() if constraint in r.fixes]
