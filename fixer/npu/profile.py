"""Target profiles: the NPU's limits and operator table as data, each entry with its provenance tag."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping


from ..errors import ProfileError, read_yaml

TAGS = {
    "DOC": "ST documentation",
    "OBS": "seen in real stedgeai output",
    "3P": "third-party report, unverified",
    "INF": "nafix inference, overridable",
}
TIERS = ("hw", "sw", "movement")
EPOCH_KINDS = ("compute", "fuse", "none")


@dataclass(frozen=True)
class Limit:
    name: str
    value: float | int
    tag: str
    source: str


@dataclass(frozen=True)
class OpRule:
    op_type: str
    tier: str
    epoch: str
    tag: str
    constraints: tuple[str, ...] = ()
    why: str = ""
    extra_epochs: int = 0


@dataclass(frozen=True)
class TargetProfile:
    name: str
    description: str
    path: str
    limits: Mapping[str, Limit]
    operators: Mapping[str, OpRule]
    sw_int8_kernels: frozenset[str]
    sw_int8_tag: str
    options: frozenset[str] = field(default_factory=frozenset)

    def limit(self, name: str) -> float | int:
        try:
            return self.limits[name].value
        except KeyError:
            raise ProfileError(f"target profile '{self.name}' ({self.path}) has no limit '{name}'.") from None

    def values(self) -> dict[str, Any]:
        """The limits as a flat dict, for formatting requirement sentences."""
        out: dict[str, Any] = {k: v.value for k, v in self.limits.items()}
        out["max_dim_exclusive"] = int(out.get("max_dim", 65535)) + 1
        return out


def _require(data: Mapping[str, Any], key: str, where: str, path: str) -> Any:
    if key not in data:
        raise ProfileError(f"{path}: '{where}' is missing the key '{key}'.")
    return data[key]


def _choice(entry: Mapping[str, Any], key: str, where: str, path: str, choices, default: str | None = None) -> str:
    """``entry[key]`` (or ``default``), which must be one of ``choices``."""
    value = str(entry[key]) if key in entry else (default if default is not None else str(_require(entry, key, where, path)))
    if value not in choices:
        raise ProfileError(f"{path}: '{where}.{key}' is '{value}'; use one of {', '.join(choices)}.")
    return value


def parse_profile(data: Any, path: str, *, options: frozenset[str] = frozenset()) -> TargetProfile:
    """Validate a profile mapping (as read from YAML) into a :class:`TargetProfile`."""
    if not isinstance(data, Mapping):
        raise ProfileError(f"{path}: a target profile must be a mapping with 'name', 'limits' and 'operators'.")
    name = str(_require(data, "name", "<top>", path))
    limits: dict[str, Limit] = {}
    for key, entry in (_require(data, "limits", "<top>", path) or {}).items():
        where = f"limits.{key}"
        if not isinstance(entry, Mapping):
            raise ProfileError(f"{path}: '{where}' must be a mapping with value, tag and source.")
        tag = _choice(entry, "tag", where, path, TAGS)
        value = _require(entry, "value", where, path)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ProfileError(f"{path}: '{where}.value' must be a number, not {value!r}.")
        limits[key] = Limit(key, value, tag, str(entry.get("source", "")))
    operators: dict[str, OpRule] = {}
    for op, entry in (_require(data, "operators", "<top>", path) or {}).items():
        where = f"operators.{op}"
        if not isinstance(entry, Mapping):
            raise ProfileError(f"{path}: '{where}' must be a mapping with tier and tag.")
        tier = _choice(entry, "tier", where, path, TIERS)
        epoch = _choice(entry, "epoch", where, path, EPOCH_KINDS, "compute" if tier != "movement" else "none")
        tag = _choice(entry, "tag", where, path, TAGS)
        cons = tuple(entry.get("constraints", ()) or ())
        _check_constraint_names(cons, where, path)
        extra = entry.get("extra_epochs", 0)
        if not isinstance(extra, int) or extra < 0:
            raise ProfileError(f"{path}: '{where}.extra_epochs' must be a non-negative integer.")
        operators[str(op)] = OpRule(str(op), tier, epoch, tag, cons, str(entry.get("why", "")), extra)
    k = data.get("sw_int8_kernels") or {}
    return TargetProfile(
        name=name,
        description=str(data.get("description", "")),
        path=path,
        limits=limits,
        operators=operators,
        sw_int8_kernels=frozenset(k.get("ops", ())),
        sw_int8_tag=str(k.get("tag", "INF")),
        options=options,
    )


def _check_constraint_names(cons: tuple, where: str, path: str) -> None:
    """Every constraint an operator lists must be a registered one (a typo would fail mid-placement)."""
    from . import constraints  # noqa: F401 - registers every constraint

    known = constraints.REGISTRY
    for c in cons:
        if not isinstance(c, str) or c not in known:
            import difflib

            near = difflib.get_close_matches(str(c), list(known), n=1)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            raise ProfileError(f"{path}: '{where}.constraints' names {c!r}, which is not a known constraint{hint}")


def load_profile(spec: str | Path | None = None, *, options: frozenset[str] = frozenset()) -> TargetProfile:
    """Load a target profile by built-in name (``stm32n6``) or from a YAML file path.

    ``options`` are stedgeai options that change placement (``--expand-softmax``, ...).
    """
    spec = spec or "stm32n6"
    p = Path(spec)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if p.is_dir():
            raise ProfileError(f"{p}: is a folder, not a target profile YAML file.")
        if not p.is_file():
            raise ProfileError(f"{p}: target profile file not found.")
        where = str(p)
        data = read_yaml(p, where, ProfileError)
    else:
        res = resources.files("fixer.npu") / "profiles" / f"{spec}.yaml"
        if not res.is_file():
            raise ProfileError(f"unknown target profile '{spec}' (built in: stm32n6); pass a YAML file path instead.")
        where = f"<built-in {spec}.yaml>"
        data = read_yaml(res.read_text(encoding="utf-8"), where, ProfileError)
    unknown = set(options) - KNOWN_OPTIONS
    if unknown:
        raise ProfileError(
            f"unknown stedgeai option(s) {', '.join(sorted(unknown))}; nafix models {', '.join(sorted(KNOWN_OPTIONS))}."
        )
    try:
        return parse_profile(data, where, options=options)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise ProfileError(f"{where}: a value has the wrong type or shape ({type(exc).__name__}: {exc}).") from None


#: stedgeai/atonn options that change where ops run (NEURAL_ART.md s1, 3P).
KNOWN_OPTIONS = frozenset({"--expand-softmax", "--GELU-recognition", "--SWISH-recognition"})
