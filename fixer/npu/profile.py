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
    reported_as: str = ""  # the name the report prints for this op's SW epochs (default: the op type)


@dataclass(frozen=True)
class CoreFacts:
    """What differs between ST Edge AI Core versions (the profile's ``cores`` section)."""

    version: str  # "2.2"
    hybrid_ops: frozenset[str] = frozenset()  # SW ops that this core runs as hybrid (SW + HW) epochs
    float_suffix: bool = False  # the report names float SW kernels "Op(float)"
    sw_lowered: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # a SW op run as these SW epochs
    limits: Mapping[str, float] = field(default_factory=dict)  # limit values this core changes
    constraints_off: frozenset[str] = frozenset()  # constraints this core no longer has
    fuse_ops: frozenset[str] = frozenset()  # HW ops this core fuses into the epoch before them (epoch: fuse)
    tag: str = "OBS"
    source: str = ""

    def key(self) -> tuple[int, ...]:
        return version_key(self.version)


@dataclass(frozen=True)
class Lowering:
    """An op stedgeai inserts when it lowers a pattern (e.g. DepthToSpace for nearest upsampling)."""

    name: str
    inserts: tuple[str, ...]
    tag: str
    source: str


def version_key(text: str) -> tuple[int, ...]:
    """``"4.0.1-20581"`` -> ``(4, 0, 1)``."""
    out = []
    for part in text.strip().lstrip("vV").split("-")[0].split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


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
    core: "CoreFacts | None" = None
    cores: tuple["CoreFacts", ...] = ()
    lowerings: Mapping[str, "Lowering"] = field(default_factory=dict)
    base_limits: Mapping[str, Limit] | None = None  # the limits before a core's own values were applied
    latency: Mapping[str, Any] = field(default_factory=dict)  # the cost model's data (fixer.npu.latency)

    def option_value(self, name: str) -> str | None:
        """The value given to a stedgeai option that takes one (``--input-data-type float32`` ->
        ``float32``), or None when the option was not given."""
        for opt in self.options:
            key, _, value = opt.partition(" ")
            if key == name and value:
                return value
        return None

    @property
    def core_version(self) -> str:
        return self.core.version if self.core is not None else ""

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


# -- the structure of a profile ----------------------------------------------------------------------
# One description of what every key holds, checked once before the profile is read (a wrong type is
# one sentence naming the file, the key and the type expected, not an exception from deep inside).
# Containers may be empty (``null``); keys not listed are ignored.

_TEXT = "text"  # a string (or a number YAML read from unquoted text: a version 2.2, a source 3)
_NUMBER = "number"
_INT = "integer"
_BOOL = "bool"
_LIST_OF_TEXT = ("list", _TEXT)


def _mapping_of(entry) -> tuple:
    return ("map", entry)


_PROFILE_SCHEMA: dict = {
    "name": _TEXT,
    "description": _TEXT,
    "limits": _mapping_of({"value": _NUMBER, "tag": _TEXT, "source": _TEXT}),
    "operators": _mapping_of({"tier": _TEXT, "epoch": _TEXT, "tag": _TEXT, "constraints": _LIST_OF_TEXT, "why": _TEXT,
                              "extra_epochs": _INT, "reported_as": _TEXT}),
    "sw_int8_kernels": {"ops": _LIST_OF_TEXT, "tag": _TEXT, "source": _TEXT},
    "cores": {"default": _TEXT,
              "versions": _mapping_of({"tag": _TEXT, "hybrid_ops": _LIST_OF_TEXT, "float_suffix": _BOOL,
                                       "sw_lowered": _mapping_of(_LIST_OF_TEXT), "limits": _mapping_of(_NUMBER),
                                       "constraints_off": _LIST_OF_TEXT, "fuse_ops": _LIST_OF_TEXT,
                                       "source": _TEXT})},
    "lowerings": _mapping_of({"inserts": ("one-or-list", _TEXT), "tag": _TEXT, "source": _TEXT}),
}

_EXPECTED = {_TEXT: "text", _NUMBER: "a number", _INT: "a whole number", _BOOL: "true or false"}


def _expected(schema) -> str:
    if isinstance(schema, str):
        return _EXPECTED[schema]
    if isinstance(schema, dict):
        return f"a mapping (with {', '.join(schema)})"
    kind, inner = schema
    if kind == "map":
        return f"a mapping of names to {_expected(inner)}"
    if kind == "list":
        return f"a list of {_expected(inner)}"
    return f"{_expected(inner)} or a list of {_expected(inner)}"


def _found(value) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return f"{str(value).lower()} (true/false)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return type(value).__name__


def _check_structure(value, schema, key: str, path: str) -> None:
    """Raise a ProfileError naming ``path``, the key path ``key`` and the type expected where
    ``value`` does not have the structure ``schema`` describes."""
    def wrong():
        return ProfileError(f"{path}: '{key}' must be {_expected(schema)}, not {_found(value)}.")

    if isinstance(schema, str):
        if schema == _BOOL:
            ok = isinstance(value, bool)
        elif schema == _INT:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif schema == _NUMBER:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
        if not ok:
            raise wrong()
        return
    if value is None:  # an empty container
        return
    if isinstance(schema, dict):
        if not isinstance(value, Mapping):
            raise wrong()
        for k, sub in schema.items():
            if value.get(k) is not None:  # (an empty key: as if not given; the reader says if it is needed)
                _check_structure(value[k], sub, f"{key}.{k}" if key else k, path)
        return
    kind, inner = schema
    if kind == "map":
        if not isinstance(value, Mapping):
            raise wrong()
        for k, v in value.items():
            _check_structure(v, inner, f"{key}.{k}", path)
    elif kind == "list" or (kind == "one-or-list" and isinstance(value, list)):
        if not isinstance(value, list):
            raise wrong()
        for i, v in enumerate(value):
            _check_structure(v, inner, f"{key}[{i}]", path)
    else:
        try:
            _check_structure(value, inner, key, path)
        except ProfileError:
            raise wrong() from None


def parse_profile(data: Any, path: str, *, options: frozenset[str] = frozenset()) -> TargetProfile:
    """Validate a profile mapping (as read from YAML) into a :class:`TargetProfile`."""
    if not isinstance(data, Mapping):
        raise ProfileError(f"{path}: a target profile must be a mapping with 'name', 'limits' and 'operators'.")
    _check_structure(data, _PROFILE_SCHEMA, "", path)
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
        operators[str(op)] = OpRule(str(op), tier, epoch, tag, cons, str(entry.get("why", "")), extra,
                                    str(entry.get("reported_as", "") or ""))
    k = data.get("sw_int8_kernels") or {}
    cores, default_core = _parse_cores(data.get("cores"), path)
    lowerings = _parse_lowerings(data.get("lowerings"), path)
    return TargetProfile(
        name=name,
        description=str(data.get("description", "")),
        path=path,
        limits=limits,
        operators=operators,
        sw_int8_kernels=frozenset(k.get("ops", ())),
        sw_int8_tag=str(k.get("tag", "INF")),
        options=options,
        core=default_core,
        cores=cores,
        lowerings=lowerings,
        latency=data.get("latency") or {},
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


def _parse_cores(data: Any, path: str) -> tuple[tuple[CoreFacts, ...], CoreFacts | None]:
    if not data:
        return (), None
    if not isinstance(data, Mapping) or not isinstance(data.get("versions"), Mapping):
        raise ProfileError(f"{path}: 'cores' must be a mapping with 'default' and 'versions'.")
    out = []
    for ver, entry in data["versions"].items():
        where = f"cores.versions.{ver}"
        entry = entry or {}
        if not isinstance(entry, Mapping) or not version_key(str(ver)):
            raise ProfileError(f"{path}: '{where}' must be a version X.Y mapping to its facts.")
        tag = _choice(entry, "tag", where, path, TAGS, "OBS")
        lowered = {str(k): tuple(str(x) for x in v) for k, v in (entry.get("sw_lowered") or {}).items()}
        lims = dict(entry.get("limits") or {})
        out.append(CoreFacts(str(ver), frozenset(entry.get("hybrid_ops", ()) or ()), bool(entry.get("float_suffix", False)),
                             lowered, lims, frozenset(entry.get("constraints_off", ()) or ()),
                             frozenset(entry.get("fuse_ops", ()) or ()), tag, str(entry.get("source", ""))))
    out.sort(key=CoreFacts.key)
    default = str(data.get("default", out[-1].version))
    chosen = next((c for c in out if c.version == default), None)
    if chosen is None:
        raise ProfileError(f"{path}: 'cores.default' is {default}, which is not one of the listed versions.")
    return tuple(out), chosen


def _parse_lowerings(data: Any, path: str) -> dict[str, Lowering]:
    out: dict[str, Lowering] = {}
    for name, entry in (data or {}).items():
        where = f"lowerings.{name}"
        if not isinstance(entry, Mapping) or "inserts" not in entry:
            raise ProfileError(f"{path}: '{where}' must be a mapping with inserts, tag and source.")
        ins = entry["inserts"]
        ins = (ins,) if isinstance(ins, str) else tuple(str(x) for x in ins)
        out[str(name)] = Lowering(str(name), ins, _choice(entry, "tag", where, path, TAGS), str(entry.get("source", "")))
    return out


def select_core(profile: TargetProfile, core: str | None) -> TargetProfile:
    """The profile with the facts of stedgeai core ``core`` (``X.Y`` or ``X.Y.Z``): the newest listed
    version not newer than it. ``None`` keeps the default (the newest core in the profile data)."""
    if core is None or not profile.cores:
        return profile
    want = version_key(core)
    if not want:
        raise ProfileError(f"--core '{core}' is not a version; give X.Y (e.g. 2.2 or 4.0).")
    padded = want + (10**6,) * max(0, 2 - len(want))  # "--core 4": the newest 4.x
    fits = [c for c in profile.cores if c.key() <= padded]
    same_major = [c for c in fits if c.key()[0] == want[0]]
    if not same_major:
        known = ", ".join(c.version for c in profile.cores)
        raise ProfileError(f"--core {core}: target profile '{profile.name}' knows stedgeai core {known}.")
    return with_core(profile, same_major[-1])


def with_core(profile: TargetProfile, core: CoreFacts) -> TargetProfile:
    """``profile`` with ``core`` selected and the limits that core changes applied."""
    from dataclasses import replace

    base = profile.base_limits if profile.base_limits is not None else profile.limits
    limits = dict(base)
    for key, value in core.limits.items():
        if key in limits:
            limits[key] = Limit(key, value, core.tag, f"core {core.version}: {core.source}")
    return replace(profile, core=core, limits=limits, base_limits=base)


def normalize_options(raw) -> frozenset[str]:
    """stedgeai options as given to --stedgeai-option, one option with its value per entry
    (``'--input-data-type float32'``, ``--input-data-type=float32``), normalized to ``'--opt value'``."""
    import shlex

    out: set[str] = set()
    for item in raw or ():
        try:
            tokens = shlex.split(str(item).replace("=", " ", 1) if str(item).startswith("--") and "=" in str(item) else str(item))
        except ValueError as exc:
            raise ProfileError(f"--stedgeai-option {item!r} cannot be read: {exc}.") from None
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok in VALUE_OPTIONS:
                if i + 1 >= len(tokens):
                    raise ProfileError(
                        f"--stedgeai-option {tok} needs its value in the same argument, e.g. "
                        f"--stedgeai-option='{tok} {VALUE_OPTIONS[tok][0]}'.")
                val = tokens[i + 1]
                if val.lower() not in VALUE_OPTIONS[tok]:
                    raise ProfileError(f"--stedgeai-option {tok} {val}: use one of {', '.join(VALUE_OPTIONS[tok])}.")
                out.add(f"{tok} {val.lower()}")
                i += 2
                continue
            out.add(tok)
            i += 1
    return frozenset(out)


def option_args(options) -> list[str]:
    """The options as stedgeai command-line arguments (values split off), in a stable order."""
    args: list[str] = []
    for opt in sorted(options):
        args.extend(opt.split(" ", 1))
    return args


def load_profile(spec: str | Path | None = None, *, options: frozenset[str] = frozenset(),
                 core: str | None = None) -> TargetProfile:
    """Load a target profile by built-in name (``stm32n6``) or from a YAML file path.

    ``options`` are stedgeai options that change placement (``--expand-softmax``,
    ``--input-data-type float32``, ...); ``core`` the stedgeai core version (default: the newest in
    the profile data).
    """
    options = normalize_options(options)
    spec = spec or "stm32n6"
    p = Path(spec)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if p.is_dir():
            raise ProfileError(f"{p}: is a folder, not a target profile YAML file.")
        if not p.is_file():
            raise ProfileError(f"{p}: target profile file not found.")
        where = str(p)
        try:
            from ..fsutil import read_bytes

            text: str | bytes | None = read_bytes(p)  # a FIFO is refused, never read
        except OSError:
            text = None  # read_yaml says why, in one sentence
        src = p
    else:
        res = resources.files("fixer.npu") / "profiles" / f"{spec}.yaml"
        if not res.is_file():
            raise ProfileError(f"unknown target profile '{spec}' (built in: stm32n6); pass a YAML file path instead.")
        where = f"<built-in {spec}.yaml>"
        text = src = res.read_text(encoding="utf-8")
    key = (where, text, options, core)
    if text is not None and key in _LOADED:  # the same profile text loaded before in this process
        return _LOADED[key]
    data = read_yaml(src, where, ProfileError)
    unknown = {o for o in options if o.split(" ", 1)[0] not in KNOWN_OPTIONS}
    if unknown:
        raise ProfileError(
            f"unknown stedgeai option(s) {', '.join(sorted(unknown))}; nafix models {', '.join(sorted(KNOWN_OPTIONS))}."
        )
    try:
        prof = parse_profile(data, where, options=options)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise ProfileError(f"{where}: a value has the wrong type or shape ({type(exc).__name__}: {exc}).") from None
    if prof.core is not None:
        prof = with_core(prof, prof.core)
    prof = select_core(prof, core)
    if text is not None:
        _LOADED[key] = prof
    return prof


#: Profiles loaded in this process, by (where, YAML text, options, core): a library caller fixing a
#: folder of models parses the profile once (a TargetProfile is frozen); changed text is parsed again.
_LOADED: dict[tuple, TargetProfile] = {}


#: stedgeai options that take a value, with the values nafix models (NPU_FACTS.md#real-reports, OBS).
VALUE_OPTIONS = {
    "--input-data-type": ("float32", "int8", "uint8"),
    "--output-data-type": ("float32", "int8", "uint8"),
    "--inputs-ch-position": ("chfirst", "chlast"),
    "--outputs-ch-position": ("chfirst", "chlast"),
}
#: stedgeai/atonn options that change where ops run (NPU_FACTS.md#toolchain, #real-reports).
KNOWN_OPTIONS = frozenset({"--expand-softmax", "--GELU-recognition", "--SWISH-recognition", "--no-inputs-allocation",
                           "--no-outputs-allocation"}) | frozenset(VALUE_OPTIONS)
