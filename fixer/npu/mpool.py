"""Memory pools of the Neural-ART NPU: ``.mpool`` files, Neural-ART profile JSON, a greedy fit.

* :func:`load_mpool` reads an ST ``.mpool`` file (JSON; ``//`` comments and trailing commas are
  tolerated here, see :func:`strip_json_comments`) in either key style: the hand-written
  snake_case (``mem_file_prefix``, ``read_power``) or the compiler-saved camelCase
  (``memFilePrefix``, ``readPower``).
* :func:`load_neural_art_profile` reads ``NAME@FILE.json`` (``user_neuralart.json``) and the
  ``.mpool`` file its profile names.
* :func:`default_stm32n6_pools` is the STM32N6 memory map nafix assumes when no ``.mpool`` is
  given, each pool with the provenance tag of the fact behind it.
* :func:`fit_activations` splits activation and weight bytes across pools (on-chip first) and
  reports what is left unallocated; the memory estimate calls it.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import ProfileError, UsageError

__all__ = [
    "MemoryPool",
    "MemoryPoolFile",
    "NeuralArtProfile",
    "PoolAllocation",
    "PoolFit",
    "default_stm32n6_pools",
    "fit_activations",
    "load_mpool",
    "load_neural_art_profile",
    "parse_mpool",
    "parse_neural_art_profiles",
    "strip_json_comments",
]

log = logging.getLogger(__name__)

_MAGNITUDES: Mapping[str, int] = {"BYTES": 1, "KBYTES": 1024, "MBYTES": 1024 * 1024}
_MODES = ("USEMODE_RELATIVE", "USEMODE_ABSOLUTE")
_RIGHTS = ("ACC_READ", "ACC_WRITE")

#: Pool names and file names that denote on-chip SRAM, and external memories. This is an
#: inference (INF) from ST's stm32n6 memory map (AXISRAMx and AXIFLEXMEM are on-chip SRAM,
#: xSPIx are external PSRAM/flash); a pool that matches neither is classified by address.
_ON_CHIP_NAMES = re.compile(r"^(npuRAM|cpuRAM|flexMEM)", re.I)
_ON_CHIP_FNAMES = re.compile(r"(^|\.)(AXISRAM\d*|AXIFLEXMEM)(\.|$)", re.I)
_EXTERNAL_NAMES = re.compile(r"^(hyperRAM|octoFlash|extRAM|extFlash)", re.I)
_EXTERNAL_FNAMES = re.compile(r"(^|\.)(xSPI\d*|FMC\w*)(\.|$)", re.I)
#: STM32N6 AXI SRAM address range (non-secure 0x24000000 and secure 0x34000000 aliases).
_ON_CHIP_RANGES = ((0x24000000, 0x24400000), (0x34000000, 0x34400000))


# ---------------------------------------------------------------------------------------------
# JSON with comments
# ---------------------------------------------------------------------------------------------


def strip_json_comments(text: str) -> str:
    """Return ``text`` with ``//`` and ``/* */`` comments and trailing commas blanked out.

    Strings are left alone, so a path or URL containing ``//`` survives. Removed characters are
    replaced by spaces (newlines are kept), so JSON error positions still point at the original
    line and column. Trailing commas (``,}`` / ``,]``) are tolerated because ST's own tooling
    sanitises them in .mpool files.
    """
    out = list(text)
    i = 0
    n = len(text)
    last_comma: int | None = None
    while i < n:
        char = text[i]
        if char == '"':
            last_comma = None
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            continue
        if char == "/" and i + 1 < n and text[i + 1] == "/":
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
            continue
        if char == "/" and i + 1 < n and text[i + 1] == "*":
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            for j in range(i, end):
                if out[j] != "\n":
                    out[j] = " "
            i = end
            continue
        if char == ",":
            last_comma = i
        elif char in "}]":
            if last_comma is not None:
                out[last_comma] = " "
            last_comma = None
        elif not char.isspace():
            last_comma = None
        i += 1
    return "".join(out)


def _load_json(path: Path, what: str) -> tuple[Any, bool]:
    """Read ``path`` as JSON with comments; return (data, whether comments/commas were removed)."""
    from ..fsutil import NotRegularFileError, read_text

    try:
        text = read_text(path, encoding="utf-8-sig")  # a FIFO would block the read for ever: refused
    except NotRegularFileError as exc:
        raise ProfileError(f"The {what} {path} {exc.strerror} (a FIFO, socket, device or folder).") from None
    except FileNotFoundError:
        raise ProfileError(f"The {what} {path} does not exist.") from None
    except OSError as exc:
        raise ProfileError(f"The {what} {path} cannot be read: {exc.strerror or exc}.") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"The {what} {path} is not UTF-8 text (byte {exc.start}).") from None
    cleaned = strip_json_comments(text)
    try:
        return json.loads(cleaned), cleaned != text
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"The {what} {path} is not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}."
        ) from None
    except RecursionError:  # a few KB of '[' would otherwise be an internal error
        raise ProfileError(f"The {what} {path} is nested too deeply to be a {what}.") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise ProfileError(f"The {what} {path} is not valid JSON: {str(exc)[:200]}.") from None


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _get(data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``data[key]`` under its snake_case or camelCase spelling."""
    if key in data:
        return data[key]
    camel = _camel(key)
    if camel in data:
        return data[camel]
    return default


# ---------------------------------------------------------------------------------------------
# .mpool
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryPool:
    """One memory pool the NPU compiler may place buffers in.

    ``rights`` is ``ACC_READ`` (read-only, e.g. flash: weights only) or ``ACC_WRITE``;
    ``writable`` follows from it. ``size_bytes`` 0 means the pool is disabled. ``on_chip`` is an
    inference (INF) from the pool's name, file name or address: npuRAM*/cpuRAM*/flexMEM and
    AXISRAM*/AXIFLEXMEM are on-chip SRAM, hyperRAM/octoFlash and xSPI* are external.
    ``provenance`` is the tag (DOC, OBS, 3P, INF) of a built-in pool's facts, or None for a pool
    read from a file.
    """

    name: str
    fname: str
    size_bytes: int
    offset: int | None
    rights: str
    throughput: str | None
    latency: str | None
    on_chip: bool
    writable: bool
    mode: str | None = None
    byte_width: int | None = None
    freq_ratio: float | None = None
    constants_preferred: bool = False
    provenance: str | None = None

    @property
    def enabled(self) -> bool:
        """False for a pool of size 0 (ST's way of disabling a pool)."""
        return self.size_bytes > 0


@dataclass(frozen=True)
class MemoryPoolFile:
    """A parsed ``.mpool`` file: its pools in file order and its ``params`` (values in bytes
    where a magnitude is given, else as written)."""

    path: Path | None
    pools: tuple[MemoryPool, ...]
    params: Mapping[str, int | str] = field(default_factory=dict)
    mem_file_prefix: str | None = None

    @property
    def enabled_pools(self) -> tuple[MemoryPool, ...]:
        """The pools whose size is not 0."""
        return tuple(p for p in self.pools if p.enabled)

    def pool(self, name: str) -> MemoryPool | None:
        """The pool called ``name``, or None."""
        return next((p for p in self.pools if p.name == name), None)


def _quantity(value: Any, where: str, source: str, *, default_magnitude: str = "BYTES") -> int:
    """Bytes of a ``{"value": "448", "magnitude": "KBYTES"}`` entry (value may be hex)."""
    if isinstance(value, Mapping):
        raw = _get(value, "value")
        magnitude = str(_get(value, "magnitude", default_magnitude) or default_magnitude).upper()
    else:
        raw, magnitude = value, default_magnitude
    if magnitude not in _MAGNITUDES:
        raise ProfileError(
            f"{source}: {where} has magnitude '{magnitude}'; expected BYTES, KBYTES or MBYTES."
        )
    try:
        if isinstance(raw, str) and raw.strip().lower().startswith("0x"):
            number = float(int(raw.strip(), 16))
        else:
            number = float(raw)
    except (TypeError, ValueError):
        raise ProfileError(f"{source}: {where} has value {raw!r}, which is not a number.") from None
    if number < 0:
        raise ProfileError(f"{source}: {where} is negative ({raw}).")
    return int(round(number * _MAGNITUDES[magnitude]))


def _is_on_chip(name: str, fname: str, offset: int | None) -> bool:
    if _ON_CHIP_NAMES.search(name) or _ON_CHIP_FNAMES.search(fname):
        return True
    if _EXTERNAL_NAMES.search(name) or _EXTERNAL_FNAMES.search(fname):
        return False
    if offset is not None:
        return any(lo <= offset < hi for lo, hi in _ON_CHIP_RANGES)
    return False


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value)


def parse_mpool(data: Any, *, source: str = "the .mpool data", path: Path | None = None) -> MemoryPoolFile:
    """Validate decoded ``.mpool`` JSON into a :class:`MemoryPoolFile` (either key style)."""
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source} is not a JSON object with a 'memory' section.")
    memory = _get(data, "memory")
    if not isinstance(memory, Mapping):
        raise ProfileError(f"{source} has no 'memory' object (expected memory.mempools[]).")
    entries = _get(memory, "mempools")
    if not isinstance(entries, list):
        raise ProfileError(f"{source}: 'memory.mempools' is missing or not a list.")

    pools: list[MemoryPool] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"memory.mempools[{index}]"
        if not isinstance(entry, Mapping):
            raise ProfileError(f"{source}: {where} is not a JSON object.")
        name = _get(entry, "name")
        if not isinstance(name, str) or not name:
            raise ProfileError(f"{source}: {where} has no 'name'.")
        where = f"memory pool '{name}' ({where})"
        if name in seen:
            raise ProfileError(f"{source}: {where} repeats a pool name.")
        seen.add(name)
        fname = str(_get(entry, "fname", "") or "")
        prop = _get(entry, "prop", {}) or {}
        if not isinstance(prop, Mapping):
            raise ProfileError(f"{source}: {where} has a 'prop' that is not an object.")
        rights = _get(prop, "rights")
        if not isinstance(rights, str) or rights.upper() not in _RIGHTS:
            raise ProfileError(
                f"{source}: {where} has prop.rights {rights!r}; expected ACC_READ or ACC_WRITE."
            )
        rights = rights.upper()
        if _get(entry, "size") is None:
            raise ProfileError(f"{source}: {where} has no 'size'.")
        size = _quantity(_get(entry, "size"), f"{where} size", source, default_magnitude="BYTES")
        raw_offset = _get(entry, "offset")
        offset = _quantity(raw_offset, f"{where} offset", source) if raw_offset is not None else None
        mode = _get(entry, "mode")
        if mode is not None and str(mode).upper() not in _MODES:
            raise ProfileError(
                f"{source}: {where} has mode '{mode}'; expected USEMODE_RELATIVE or USEMODE_ABSOLUTE."
            )
        byte_width = _get(prop, "byte_width")
        freq_ratio = _get(prop, "freq_ratio")
        pools.append(
            MemoryPool(
                name=name,
                fname=fname,
                size_bytes=size,
                offset=offset,
                rights=rights,
                throughput=_get(prop, "throughput"),
                latency=_get(prop, "latency"),
                on_chip=_is_on_chip(name, fname, offset),
                writable=rights == "ACC_WRITE",
                mode=str(mode).upper() if mode is not None else None,
                byte_width=int(byte_width) if byte_width is not None else None,
                freq_ratio=float(freq_ratio) if freq_ratio is not None else None,
                constants_preferred=_truthy(_get(prop, "constants_preferred", False)),
            )
        )

    params: dict[str, int | str] = {}
    block = _get(data, "params", {}) or {}
    items = _get(block, "param", []) if isinstance(block, Mapping) else []
    for index, item in enumerate(items or []):
        if not isinstance(item, Mapping) or not _get(item, "paramname"):
            continue
        key = str(_get(item, "paramname"))
        if _get(item, "magnitude") is not None:
            params[key] = _quantity(item, f"params.param[{index}] '{key}'", source)
        else:
            params[key] = str(_get(item, "value", ""))
    prefix = _get(memory, "mem_file_prefix")
    return MemoryPoolFile(path=path, pools=tuple(pools), params=params,
                          mem_file_prefix=str(prefix) if prefix is not None else None)


def load_mpool(path: str | Path) -> MemoryPoolFile:
    """Read an ST ``.mpool`` file.

    ``//`` comments and trailing commas are accepted here but logged as a warning: atonn itself
    has been reported (3P) to read .mpool files with a strict JSON parser that rejects them.
    """
    path = Path(path)
    data, cleaned = _load_json(path, ".mpool file")
    if cleaned:
        log.warning(
            "%s contains comments or trailing commas; nafix accepts them but atonn may reject the "
            "file ('memory pool JSON ERROR').", path,
        )
    return parse_mpool(data, source=str(path), path=path)


# ---------------------------------------------------------------------------------------------
# Neural-ART profile JSON (user_neuralart.json)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NeuralArtProfile:
    """One profile of a Neural-ART profile file, with its paths resolved relative to that file.

    ``options`` is the atonn option string as written; ``option_args`` the same split into
    arguments. ``pools`` is the parsed ``memory_pool`` file when it was loaded.
    """

    name: str
    path: Path
    memory_pool: Path | None
    machine_desc: Path | None
    options: str
    option_args: tuple[str, ...]
    globals: Mapping[str, Any] = field(default_factory=dict)
    pools: MemoryPoolFile | None = None

    @property
    def spec(self) -> str:
        """The ``NAME@FILE.json`` string stedgeai's ``--st-neural-art`` takes."""
        return f"{self.name}@{self.path}"


def _top(data: Mapping[str, Any], key: str) -> Any:
    for candidate, value in data.items():
        if candidate.lower() == key.lower():
            return value
    return None


def parse_neural_art_profiles(data: Any, *, path: Path) -> dict[str, NeuralArtProfile]:
    """Validate decoded profile-file JSON; return every profile by name (pools not loaded)."""
    source = str(path)
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source} is not a JSON object with a 'Profiles' section.")
    profiles = _top(data, "Profiles")
    if not isinstance(profiles, Mapping) or not profiles:
        raise ProfileError(
            f"{source} has no 'Profiles' object (expected {{\"Profiles\": {{NAME: {{...}}}}}})."
        )
    globals_ = _top(data, "Globals") or {}
    if not isinstance(globals_, Mapping):
        raise ProfileError(f"{source}: 'Globals' is not an object.")
    base = path.parent
    result: dict[str, NeuralArtProfile] = {}
    for name, entry in profiles.items():
        where = f"{source}: profile '{name}'"
        if not isinstance(entry, Mapping):
            raise ProfileError(f"{where} is not an object.")
        if "memory_desc" in entry:
            raise ProfileError(
                f"{where} uses the old key 'memory_desc'; rename it to 'machine_desc' (ST Edge AI "
                "Core no longer reads memory_desc and silently ignores it)."
            )
        options = entry.get("options", "")
        if not isinstance(options, str):
            raise ProfileError(f"{where} has 'options' that is not a string.")
        try:
            option_args = tuple(shlex.split(options))
        except ValueError as exc:
            raise ProfileError(f"{where} has 'options' that cannot be split into arguments: {exc}.") from None
        paths: dict[str, Path | None] = {}
        for key in ("memory_pool", "machine_desc"):
            value = entry.get(key)
            if value is None:
                paths[key] = None
            elif not isinstance(value, str) or not value.strip():
                raise ProfileError(f"{where} has a '{key}' that is not a file name.")
            else:
                candidate = Path(value).expanduser()
                paths[key] = candidate if candidate.is_absolute() else base / candidate
        result[str(name)] = NeuralArtProfile(
            name=str(name),
            path=path,
            memory_pool=paths["memory_pool"],
            machine_desc=paths["machine_desc"],
            options=options,
            option_args=option_args,
            globals=dict(globals_),
        )
    return result


def load_neural_art_profile(spec: str, *, load_pools: bool = True) -> NeuralArtProfile:
    """Load profile ``NAME`` from ``NAME@FILE.json``, as stedgeai's ``--st-neural-art`` takes it.

    With ``load_pools`` the profile's ``memory_pool`` file is read too (it must exist).
    """
    name, sep, file_part = spec.partition("@")
    if not sep or not name.strip() or not file_part.strip():
        raise ProfileError(
            f"The Neural-ART profile '{spec}' is not of the form NAME@FILE.json "
            "(e.g. n6-allmems-O3@user_neuralart.json)."
        )
    name = name.strip()
    path = Path(file_part.strip()).expanduser()
    data, _ = _load_json(path, "Neural-ART profile file")
    profiles = parse_neural_art_profiles(data, path=path)
    if name not in profiles:
        close = difflib.get_close_matches(name, list(profiles), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ProfileError(
            f"{path} has no profile named '{name}'; available profiles: "
            f"{', '.join(sorted(profiles))}.{hint}"
        )
    profile = profiles[name]
    if load_pools:
        if profile.memory_pool is None:
            raise ProfileError(f"{path}: profile '{name}' has no 'memory_pool' file.")
        if not profile.memory_pool.is_file():
            raise ProfileError(
                f"{path}: profile '{name}' names the memory pool file {profile.memory_pool}, "
                "which does not exist (paths are relative to the profile file)."
            )
        profile = NeuralArtProfile(
            name=profile.name, path=profile.path, memory_pool=profile.memory_pool,
            machine_desc=profile.machine_desc, options=profile.options,
            option_args=profile.option_args, globals=profile.globals,
            pools=load_mpool(profile.memory_pool),
        )
    return profile


# ---------------------------------------------------------------------------------------------
# Built-in STM32N6 pools
# ---------------------------------------------------------------------------------------------

_KIB = 1024
_MIB = 1024 * 1024


def default_stm32n6_pools() -> tuple[MemoryPool, ...]:
    """The STM32N6 pools nafix assumes without an .mpool file (NPU_FACTS.md#memory-pools).

    cpuRAM2 (AXISRAM2, 1 MiB at 0x34100000) and npuRAM3..6 (AXISRAM3..6, 448 KiB each from
    0x34200000) are on-chip (DOC/OBS); hyperRAM (xSPI1 PSRAM, 16 MiB at 0x90000000) is external
    writable RAM (3P: 16-32 MB, 5-20x slower for activations); octoFlash (xSPI2, read-only at
    0x71000000) holds weights, sized 112 MiB as in ST's n6-allmems-O3 profile in real reports
    (OBS).
    """
    npu = tuple(
        MemoryPool(
            name=f"npuRAM{index}", fname=f"AXISRAM{index}", size_bytes=448 * _KIB,
            offset=0x34200000 + (index - 3) * 448 * _KIB, rights="ACC_WRITE", throughput="HIGH",
            latency="LOW", on_chip=True, writable=True, byte_width=8, freq_ratio=1.25,
            provenance="OBS",
        )
        for index in (3, 4, 5, 6)
    )
    return (
        MemoryPool(
            name="cpuRAM2", fname="AXISRAM2", size_bytes=1 * _MIB, offset=0x34100000,
            rights="ACC_WRITE", throughput="MID", latency="MID", on_chip=True, writable=True,
            byte_width=8, freq_ratio=2.5, provenance="OBS",
        ),
        *npu,
        MemoryPool(
            name="hyperRAM", fname="xSPI1", size_bytes=16 * _MIB, offset=0x90000000,
            rights="ACC_WRITE", throughput="MID", latency="HIGH", on_chip=False, writable=True,
            provenance="3P",
        ),
        MemoryPool(
            name="octoFlash", fname="xSPI2", size_bytes=112 * _MIB, offset=0x71000000,
            rights="ACC_READ", throughput="MID", latency="HIGH", on_chip=False, writable=False,
            byte_width=1, freq_ratio=6.0, constants_preferred=True, provenance="OBS",
        ),
    )


# ---------------------------------------------------------------------------------------------
# Greedy fit
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolAllocation:
    """Bytes of one kind (activations or weights) placed in one pool."""

    pool: str
    kind: Literal["activations", "weights"]
    bytes: int
    on_chip: bool


@dataclass(frozen=True)
class PoolFit:
    """How activations and weights spread over the pools (see :func:`fit_activations`)."""

    allocations: tuple[PoolAllocation, ...]
    activations_on_chip: int
    activations_external: int
    weights_on_chip: int
    weights_external: int
    unallocated_activation_bytes: int
    unallocated_weight_bytes: int

    @property
    def unallocated_bytes(self) -> int:
        """Bytes that fit nowhere (activations and weights)."""
        return self.unallocated_activation_bytes + self.unallocated_weight_bytes

    @property
    def fits(self) -> bool:
        """True when everything found a pool."""
        return self.unallocated_bytes == 0

    @property
    def spills_activations(self) -> bool:
        """True when some activations live in external memory (slow on this chip)."""
        return self.activations_external > 0


def fit_activations(
    pools: Iterable[MemoryPool], activation_bytes: int, weights_bytes: int
) -> PoolFit:
    """Greedily place ``activation_bytes`` and ``weights_bytes`` into ``pools`` (in their order).

    Activations go into writable on-chip pools first, then writable external ones. Weights go
    into read-only pools first (flash), then into what writable pools have left (on-chip first).
    Disabled pools (size 0) are skipped. This is a capacity bound (INF), not an allocation:
    atonn places individual buffers with lifetimes and alignment, and a buffer cannot straddle
    pools unless they form a virtual pool, so a model that fits here may still fail to
    allocate, but one that does not fit here will not fit on the chip.
    """
    if activation_bytes < 0 or weights_bytes < 0:
        raise UsageError(
            f"fit_activations needs non-negative byte counts, got activations={activation_bytes} "
            f"and weights={weights_bytes}."
        )
    enabled = [p for p in pools if p.enabled]
    free = {p.name: p.size_bytes for p in enabled}
    allocations: list[PoolAllocation] = []

    def place(amount: int, kind: Literal["activations", "weights"], order: Sequence[MemoryPool]) -> int:
        for pool in order:
            if amount == 0:
                break
            take = min(amount, free[pool.name])
            if take > 0:
                free[pool.name] -= take
                amount -= take
                allocations.append(
                    PoolAllocation(pool=pool.name, kind=kind, bytes=take, on_chip=pool.on_chip)
                )
        return amount

    writable_on_chip = [p for p in enabled if p.writable and p.on_chip]
    writable_external = [p for p in enabled if p.writable and not p.on_chip]
    read_only = [p for p in enabled if not p.writable]
    left_activations = place(activation_bytes, "activations", writable_on_chip + writable_external)
    left_weights = place(weights_bytes, "weights", read_only + writable_on_chip + writable_external)

    def total(kind: str, on_chip: bool) -> int:
        return sum(a.bytes for a in allocations if a.kind == kind and a.on_chip == on_chip)

    return PoolFit(
        allocations=tuple(allocations),
        activations_on_chip=total("activations", True),
        activations_external=total("activations", False),
        weights_on_chip=total("weights", True),
        weights_external=total("weights", False),
        unallocated_activation_bytes=left_activations,
        unallocated_weight_bytes=left_weights,
    )
