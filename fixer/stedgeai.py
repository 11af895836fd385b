"""Find and run ST Edge AI Core (``stedgeai``), and read what it writes.

ST Edge AI Core is proprietary and may not be installed; everything here that does not start a
process is a pure function on text or JSON, so reports produced elsewhere can be read too.

* Discovery: :func:`find_stedgeai` and :func:`stedgeai_version`.
* Running: :func:`run_generate` starts ``stedgeai generate --target stm32n6 --st-neural-art``
  without a shell, streams every log line, enforces a timeout, and parses the results.
* Parsers: :func:`parse_report` (both report formats), :func:`parse_c_info`
  (``network_c_info.json``), :func:`parse_epoch_csv` (atonn's per-epoch CSV).
* Known errors: :func:`explain` recognises the compiler failures listed in ``KNOWN_ERROR_PATTERNS``
  and says what to do about each.

ST says the report format "is subject to changes", so the parsers read values by their labels
(``Total number of epochs``, ``>> pure software (SW) epochs``, table headers), never by column
position.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import InputError, ToolError, UsageError

__all__ = [
    "CInfo",
    "CInfoBuffer",
    "CInfoEpoch",
    "CInfoPool",
    "CompileResult",
    "EpochCsv",
    "EpochRow",
    "IoInfo",
    "KNOWN_ERROR_PATTERNS",
    "KnownError",
    "KnownErrorPattern",
    "PoolUsage",
    "StedgeaiReport",
    "explain",
    "find_stedgeai",
    "load_c_info",
    "load_report",
    "parse_c_info",
    "parse_epoch_csv",
    "parse_report",
    "parse_version",
    "run_generate",
    "stedgeai_version",
]

log = logging.getLogger(__name__)

EpochKind = Literal["HW", "SW", "EC", "HYBRID", "UNKNOWN"]
"""Where an epoch runs: ``HW`` NPU, ``EC`` NPU driven by the epoch controller, ``SW`` Cortex-M55,
``HYBRID`` both, ``UNKNOWN`` a row the report marks ``??`` (seen in core 2.2.0 reports)."""

CInfoKind = Literal["HW", "SW", "EC", "HYBRID", "NO_X", "UNKNOWN"]
"""Kind of a ``network_c_info.json`` epoch; ``NO_X`` is ``NODE_NO_X`` (not executed)."""

# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------

#: ``sys.platform`` prefix -> (folder under ``$STEDGEAI_CORE_DIR/Utilities``, executable name),
#: as ST Edge AI Core lays out its installation (``Utilities/windows/stedgeai.exe`` is OBS in a
#: published log; ``linux`` OBS in published paths; ``mac`` DOC).
_UTILITIES_FOLDERS: tuple[tuple[str, str, str], ...] = (
    ("linux", "linux", "stedgeai"),
    ("win32", "windows", "stedgeai.exe"),
    ("cygwin", "windows", "stedgeai.exe"),
    ("darwin", "mac", "stedgeai"),
)

_VERSION_RE = re.compile(r"ST Edge AI Core\s+v?(?P<version>\d+\.\d+\.\d+(?:-\d+)?)")


def _utilities_folder(platform: str) -> tuple[str, str]:
    for prefix, folder, exe in _UTILITIES_FOLDERS:
        if platform.startswith(prefix):
            return folder, exe
    return "linux", "stedgeai"


def find_stedgeai(
    explicit: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    platform: str | None = None,
) -> Path | None:
    """Locate the ``stedgeai`` executable, or return None when it is not installed.

    The search order is: the ``explicit`` path when given (it must exist: a missing explicit
    path is an error, not a reason to look elsewhere), then
    ``$STEDGEAI_CORE_DIR/Utilities/<os>/stedgeai`` (``<os>`` is ``linux``, ``windows`` with
    ``stedgeai.exe``, or ``mac``), then ``stedgeai`` on ``PATH``. ``env`` replaces ``os.environ``
    for the last two steps (``PATH`` included); ``platform`` replaces ``sys.platform``.
    """
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.exists():
            raise ToolError(f"The stedgeai executable given as '{explicit}' does not exist.")
        if path.is_dir():
            raise ToolError(
                f"The stedgeai path '{explicit}' is a folder; give the executable itself, e.g. "
                f"'{path / 'Utilities' / _utilities_folder(platform or sys.platform)[0]}"
                f"/{_utilities_folder(platform or sys.platform)[1]}'."
            )
        if os.name == "posix" and not os.access(path, os.X_OK):
            raise ToolError(f"The stedgeai file '{explicit}' exists but is not executable.")
        log.debug("stedgeai: using the explicit path %s", path)
        return path

    environ: Mapping[str, str] = os.environ if env is None else env
    folder, exe = _utilities_folder(platform or sys.platform)
    core_dir = environ.get("STEDGEAI_CORE_DIR")
    if core_dir:
        candidate = Path(core_dir).expanduser() / "Utilities" / folder / exe
        if candidate.is_file():
            log.debug("stedgeai: found %s through STEDGEAI_CORE_DIR", candidate)
            return candidate
        log.warning(
            "STEDGEAI_CORE_DIR is set to '%s' but '%s' does not exist; looking on PATH instead.",
            core_dir,
            candidate,
        )
    found = shutil.which("stedgeai", path=environ.get("PATH", ""))
    if found:
        log.debug("stedgeai: found %s on PATH", found)
        return Path(found)
    return None


def parse_version(text: str) -> str | None:
    """Return the version in a line like ``ST Edge AI Core v2.1.0-20194 329b0e98d``
    (``"2.1.0-20194"``), or None when the text has no such line."""
    match = _VERSION_RE.search(text)
    return match.group("version") if match else None


def stedgeai_version(path: str | Path, *, timeout: float = 60.0) -> str:
    """Run ``stedgeai --version`` and return its version, e.g. ``"2.1.0-20194"``."""
    try:
        done = subprocess.run(
            [str(path), "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ToolError(f"'{path} --version' did not finish within {timeout:g} s.") from exc
    except OSError as exc:
        raise ToolError(f"'{path}' could not be started: {exc.strerror or exc}.") from exc
    text = (done.stdout or "") + (done.stderr or "")
    version = parse_version(text)
    if version is None:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        raise ToolError(
            f"'{path} --version' (exit code {done.returncode}) did not print a line like "
            f"'ST Edge AI Core v2.1.0-20194'; its first line was '{first[:200]}'."
        )
    return version


# ---------------------------------------------------------------------------------------------
# Report (network_generate_report.txt / console summary)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochRow:
    """One epoch of the report's epoch table.

    Format B's epoch-controller ranges (``epochs 1 -> 13 | EC``) are expanded to one row per id.
    ``ops`` holds the report's "Operation"/"Details" text split on top-level commas, verbatim
    (e.g. ``("ReduceSum(float)",)``); HW and EC rows usually have none.
    """

    id: int
    kind: EpochKind
    ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class PoolUsage:
    """A line of the report's "Memory usage information" block (kB and MB there are KiB, MiB).

    Byte values are rebuilt from the printed 3-decimal figures, so they are exact to the byte
    for B, to about 1 byte for kB, and to about 1 KiB for MB.
    """

    name: str
    used_bytes: int
    total_bytes: int
    weights_bytes: int | None = None
    activations_bytes: int | None = None
    start_address: int | None = None
    end_address: int | None = None


@dataclass(frozen=True)
class IoInfo:
    """An ``input i/n`` or ``output i/n`` line of the report summary.

    ``scale`` and ``zero_point`` come from ``QLinear(scale,zero_point,type)``; both are None for
    float tensors. ``shape`` dimensions that are not integers are stored as -1.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    scale: float | None
    zero_point: int | None
    size_bytes: int | None = None


@dataclass(frozen=True)
class StedgeaiReport:
    """What a stedgeai report says about the compiled network.

    ``format`` is ``"A"`` (core 2.x: ``Total number of epochs: N of which M implemented in
    software``) or ``"B"`` (core 3.x/4.x: ``>> pure software (SW) epochs  N`` counters).

    Counting, as the reports do it:

    * ``epochs`` is the report's total. Format B prints ``epochs = sw + hybrid + hw`` (checked
      on every real report we have); epoch ids may start at 2 and may skip numbers (the
      compiler does not count epochs it elided), so ``epochs`` is not the largest id.
    * ``hw_epochs`` counts HW and EC (epoch-controller) epochs. Format A has no hybrid counter
      (``hybrid_epochs`` is None) and ``hw_epochs = epochs - sw_epochs``, which includes rows
      the report marks ``??``.
    * ``hw_ratio`` counts every epoch that is not pure software as offloaded, hybrid epochs
      included.
    """

    version: str | None
    format: Literal["A", "B"]
    epochs: int
    sw_epochs: int
    hybrid_epochs: int | None
    hw_epochs: int
    epoch_rows: tuple[EpochRow, ...] = ()
    sw_ops: tuple[str, ...] = ()
    memory: tuple[PoolUsage, ...] = ()
    inputs: tuple[IoInfo, ...] = ()
    outputs: tuple[IoInfo, ...] = ()
    ec_blobs: int | None = None
    compiler_version: str | None = None
    command: str | None = None

    @property
    def hw_ratio(self) -> float:
        """Share of epochs that are not pure software: ``(epochs - sw_epochs) / epochs``
        (hybrid epochs count as offloaded); 0.0 for a report with no epochs."""
        if self.epochs <= 0:
            return 0.0
        return (self.epochs - self.sw_epochs) / self.epochs

    @property
    def hybrid_ops(self) -> tuple[str, ...]:
        """Op names of the hybrid epochs, in order (format B, core 4.x)."""
        return tuple(op for row in self.epoch_rows if row.kind == "HYBRID" for op in row.ops)

    def pool(self, name: str) -> PoolUsage | None:
        """The memory line of the pool called ``name``, or None."""
        return next((p for p in self.memory if p.name == name), None)


_UNIT_BYTES: Mapping[str, int] = {
    "B": 1,
    "BYTES": 1,
    "KB": 1024,
    "KBYTES": 1024,
    "KIB": 1024,
    "MB": 1024**2,
    "MBYTES": 1024**2,
    "MIB": 1024**2,
    "GB": 1024**3,
    "GBYTES": 1024**3,
    "GIB": 1024**3,
}

_FORMAT_A_TOTAL = re.compile(
    r"Total number of epochs\s*:\s*(?P<epochs>\d+)\s+of which\s+(?P<sw>\d+)\s+implemented in software",
    re.IGNORECASE,
)
_FORMAT_B_TOTAL = re.compile(r"^\s*Total number of epochs\s+(?P<epochs>\d+)\s*$", re.I | re.M)
_FORMAT_B_COUNTER = re.compile(
    r"^\s*>>\s*(?P<label>.*?\S)\s+(?P<n>\d+)\s*(?:\((?P<note>[^)]*)\))?\s*$", re.M
)
_EC_BLOBS = re.compile(r"implemented in\s+(\d+)\s+epoch controller", re.I)
_FORMAT_A_ROW = re.compile(r"^\s*epoch\s+(?P<id>\d+)\s+(?P<kind>\S+)(?P<rest>.*)$", re.I)
_TABLE_ID_SINGLE = re.compile(r"^epoch[_\s]*(?P<id>\d+)$", re.I)
_TABLE_ID_RANGE = re.compile(r"^epochs?\s*(?P<first>\d+)\s*->\s*(?P<last>\d+)$", re.I)
_MEMORY_LINE = re.compile(
    r"^\s*(?P<name>[A-Za-z_][\w.]*)\s*\[\s*0x(?P<start>[0-9A-Fa-f]+)\s*-\s*0x(?P<end>[0-9A-Fa-f]+)\s*\]\s*:"
    r"\s*(?P<used>[\d.,]+)\s*(?P<used_unit>[kKMG]?B)\s*/\s*(?P<total>[\d.,]+)\s*(?P<total_unit>[kKMG]?B)"
    r"(?P<rest>.*)$"
)
_MEMORY_PART = r"{label}\s*:\s*(?P<value>[\d.,]+)\s*(?P<unit>[kKMG]?B)"
_IO_LINE = re.compile(
    r"^\s*(?P<dir>input|output)\s+(?P<index>\d+)\s*/\s*(?P<count>\d+)\s*:\s*'(?P<name>[^']*)'\s*,"
    r"\s*(?P<dtype>[A-Za-z]\w*)\s*\((?P<shape>[^)]*)\)\s*,\s*(?P<size>[\d.,]+)\s*(?P<unit>[A-Za-z]+)"
    r"(?P<rest>.*)$",
    re.I,
)
_QLINEAR = re.compile(
    r"QLinear\(\s*(?P<scale>[-+\d.eE]+)\s*,\s*(?P<zp>[-+]?\d+)\s*(?:,\s*(?P<qtype>\w+)\s*)?\)", re.I
)
_COMPILER_VERSION = re.compile(r"^\s*Compiler version\s*:\s*(?P<v>\S+)", re.I | re.M)
_PARAMETERS = re.compile(r"^\s*Parameters\s*:\s*(?P<cmd>.+?)\s*$", re.I | re.M)
_COMMAND_LINE = re.compile(
    r"^\s*(?P<cmd>\S*stedgeai(?:\.exe)?\s+(?:generate|analyze|validate)\b.*?)\s*$", re.I | re.M
)


def _to_bytes(value: str, unit: str) -> int:
    number = float(value.replace(",", ""))
    factor = _UNIT_BYTES.get(unit.upper())
    if factor is None:
        raise ValueError(unit)
    return int(round(number * factor))


def _split_ops(text: str) -> tuple[str, ...]:
    """Split ``"Conv, Add"`` into ops, ignoring commas inside parentheses."""
    text = text.strip()
    if not text:
        return ()
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return tuple(p for p in parts if p)


def _kind_from_token(token: str) -> EpochKind:
    word = token.strip().strip("-").strip().upper()
    if word in ("HW", "EC", "SW"):
        return word  # type: ignore[return-value]
    if word.startswith("HYB"):
        return "HYBRID"
    return "UNKNOWN"


def _parse_format_a_rows(lines: Sequence[str]) -> tuple[EpochRow, ...]:
    rows: list[EpochRow] = []
    for line in lines:
        match = _FORMAT_A_ROW.match(line)
        if not match:
            continue
        kind = _kind_from_token(match.group("kind"))
        ops: tuple[str, ...] = ()
        rest = match.group("rest")
        if "(" in rest:
            inner = rest[rest.index("(") + 1 : rest.rindex(")") if ")" in rest else len(rest)]
            ops = _split_ops(inner)
        rows.append(EpochRow(id=int(match.group("id")), kind=kind, ops=ops))
    return tuple(rows)


def _table_cells(line: str) -> list[str] | None:
    stripped = line.strip()
    if not (stripped.startswith("|") and stripped.endswith("|")):
        return None
    return [cell.strip() for cell in stripped[1:-1].split("|")]


def _parse_format_b_rows(lines: Sequence[str], source: str) -> tuple[EpochRow, ...]:
    """Read the ``| epoch ID | Type | Details |`` table by its header names."""
    header: dict[str, int] | None = None
    rows: list[EpochRow] = []
    for line in lines:
        cells = _table_cells(line)
        if cells is None:
            if header is not None and rows and not line.strip().startswith("+"):
                break  # the table has ended
            continue
        lowered = [c.lower() for c in cells]
        if header is None:
            if any(c.startswith("epoch") and "id" in c for c in lowered) and "type" in lowered:
                header = {name: index for index, name in enumerate(lowered)}
            continue
        id_col = next(i for name, i in header.items() if name.startswith("epoch"))
        type_col = header["type"]
        details_col = next((i for name, i in header.items() if name.startswith("detail")), None)
        if max(id_col, type_col) >= len(cells):
            continue
        ident = cells[id_col]
        kind = _kind_from_token(cells[type_col])
        ops = _split_ops(cells[details_col]) if details_col is not None and details_col < len(cells) else ()
        single = _TABLE_ID_SINGLE.match(ident)
        many = _TABLE_ID_RANGE.match(ident)
        if single:
            rows.append(EpochRow(id=int(single.group("id")), kind=kind, ops=ops))
        elif many:
            first, last = int(many.group("first")), int(many.group("last"))
            rows.extend(EpochRow(id=i, kind=kind, ops=ops) for i in range(first, last + 1))
        else:
            # "<no executed epochs>": an epoch-controller blob that runs nothing.
            log.debug("%s: epoch table row '%s' has no epoch id; skipped.", source, ident)
    return tuple(rows)


def _parse_memory(text: str) -> tuple[PoolUsage, ...]:
    pools: dict[str, PoolUsage] = {}
    for line in text.splitlines():
        match = _MEMORY_LINE.match(line)
        if not match or match.group("name") in pools:
            continue
        rest = match.group("rest")
        weights = re.search(_MEMORY_PART.format(label="weights"), rest, re.I)
        activations = re.search(_MEMORY_PART.format(label="activations"), rest, re.I)
        try:
            pools[match.group("name")] = PoolUsage(
                name=match.group("name"),
                used_bytes=_to_bytes(match.group("used"), match.group("used_unit")),
                total_bytes=_to_bytes(match.group("total"), match.group("total_unit")),
                weights_bytes=_to_bytes(weights["value"], weights["unit"]) if weights else None,
                activations_bytes=(
                    _to_bytes(activations["value"], activations["unit"]) if activations else None
                ),
                start_address=int(match.group("start"), 16),
                end_address=int(match.group("end"), 16),
            )
        except ValueError:
            log.debug("memory line with an unknown unit skipped: %s", line.strip())
    return tuple(pools.values())


def _parse_shape(text: str) -> tuple[int, ...]:
    dims: list[int] = []
    for part in re.split(r"[x,]", text):
        part = part.strip()
        if not part:
            continue
        dims.append(int(part) if part.isdigit() else -1)
    return tuple(dims)


def _parse_io(text: str) -> tuple[tuple[IoInfo, ...], tuple[IoInfo, ...]]:
    inputs: dict[int, IoInfo] = {}
    outputs: dict[int, IoInfo] = {}
    for line in text.splitlines():
        match = _IO_LINE.match(line)
        if not match:
            continue
        q = _QLINEAR.search(match.group("rest"))
        try:
            size: int | None = _to_bytes(match.group("size"), match.group("unit"))
        except ValueError:
            size = None
        info = IoInfo(
            name=match.group("name"),
            dtype=match.group("dtype"),
            shape=_parse_shape(match.group("shape")),
            scale=float(q.group("scale")) if q else None,
            zero_point=int(q.group("zp")) if q else None,
            size_bytes=size,
        )
        target = inputs if match.group("dir").lower() == "input" else outputs
        target.setdefault(int(match.group("index")), info)
    return (
        tuple(inputs[k] for k in sorted(inputs)),
        tuple(outputs[k] for k in sorted(outputs)),
    )


def parse_report(text: str, *, source: str = "the report text") -> StedgeaiReport:
    """Parse a stedgeai report (``network_generate_report.txt``, ``*_analyze_report.txt``, or the
    console log of ``generate``/``analyze``) in either format.

    ``source`` names the text in error messages (e.g. the file path). Raises InputError when the
    text has no ``Epochs details`` counters, i.e. is not a Neural-ART stedgeai report.
    """
    version = parse_version(text)
    compiler = _COMPILER_VERSION.search(text)
    command_match = _PARAMETERS.search(text) or _COMMAND_LINE.search(text)
    memory = _parse_memory(text)
    inputs, outputs = _parse_io(text)

    a_total = _FORMAT_A_TOTAL.search(text)
    b_total = _FORMAT_B_TOTAL.search(text)
    hybrid: int | None
    ec_blobs: int | None = None
    if a_total and (not b_total or a_total.start() <= b_total.start()):
        fmt: Literal["A", "B"] = "A"
        epochs = int(a_total.group("epochs"))
        sw = int(a_total.group("sw"))
        hybrid = None
        hw = epochs - sw
        rows = _parse_format_a_rows(text[a_total.end() :].splitlines())
    elif b_total:
        fmt = "B"
        epochs = int(b_total.group("epochs"))
        counters: dict[str, int] = {}
        after = text[b_total.end() :]
        for match in _FORMAT_B_COUNTER.finditer(after):
            label = match.group("label").lower()
            if "hybrid" in label:
                key = "hybrid"
            elif "software" in label or "(sw)" in label:
                key = "sw"
            elif "hardware" in label or "(hw" in label:
                key = "hw"
                note = match.group("note") or ""
                blobs = _EC_BLOBS.search(note)
                if blobs:
                    ec_blobs = int(blobs.group(1))
            else:
                continue
            counters.setdefault(key, int(match.group("n")))
            if len(counters) == 3:
                break
        missing = [label for label in ("sw", "hybrid", "hw") if label not in counters]
        if missing:
            names = {"sw": "'>> pure software (SW) epochs'", "hybrid": "'>> hybrid epochs'",
                     "hw": "'>> pure hardware (HW or EC) epochs'"}
            raise InputError(
                f"{source} has a 'Total number of epochs' line but no "
                f"{' or '.join(names[m] for m in missing)} counter after it."
            )
        sw, hybrid, hw = counters["sw"], counters["hybrid"], counters["hw"]
        if sw + hybrid + hw != epochs:
            log.warning(
                "%s: the epoch counters do not add up (%d SW + %d hybrid + %d HW != %d total).",
                source, sw, hybrid, hw, epochs,
            )
        rows = _parse_format_b_rows(after.splitlines(), source)
    else:
        raise InputError(
            f"{source} is not a stedgeai Neural-ART report: it has no 'Total number of epochs' "
            "line (expected the 'Epochs details' section that ST Edge AI Core prints for "
            "--target stm32n6 --st-neural-art)."
        )

    sw_rows = [row for row in rows if row.kind == "SW"]
    if rows and len(sw_rows) != sw:
        log.info(
            "%s: the epoch table lists %d SW epochs but the counter says %d (truncated table?).",
            source, len(sw_rows), sw,
        )
    return StedgeaiReport(
        version=version,
        format=fmt,
        epochs=epochs,
        sw_epochs=sw,
        hybrid_epochs=hybrid,
        hw_epochs=hw,
        epoch_rows=rows,
        sw_ops=tuple(op for row in sw_rows for op in row.ops),
        memory=memory,
        inputs=inputs,
        outputs=outputs,
        ec_blobs=ec_blobs,
        compiler_version=compiler.group("v") if compiler else None,
        command=command_match.group("cmd") if command_match else None,
    )


def load_report(path: str | Path) -> StedgeaiReport:
    """Read and parse a report file (see :func:`parse_report`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"The stedgeai report {path} cannot be read: {exc.strerror or exc}.") from exc
    return parse_report(text, source=str(path))


# ---------------------------------------------------------------------------------------------
# network_c_info.json
# ---------------------------------------------------------------------------------------------

_MAPPING_KINDS: Mapping[str, CInfoKind] = {
    "NODE_HW": "HW",
    "NODE_SW": "SW",
    "NODE_EC": "EC",
    "NODE_SW_HW": "HYBRID",
    "NODE_HW_SW": "HYBRID",
    "NODE_HYBRID": "HYBRID",
    "NODE_NO_X": "NO_X",
    "NODE_UNDEF": "UNKNOWN",
}

_NODE_KIND_DESCRIPTION = re.compile(r"Node kind\s*=\s*(?P<kind>\w+)", re.I)
_EC_BLOB_DESCRIPTION = re.compile(r"Epoch Controller\s+(?P<blob>\S+)", re.I)
_EPOCH_NAME = re.compile(r"epoch_(?P<id>\d+)$")
_BOOKKEEPING_OPS = frozenset({"Param", "Return"})


@dataclass(frozen=True)
class CInfoEpoch:
    """One entry of ``graphs[0].nodes[]``: an epoch and the ONNX-level ops behind it.

    ``ops`` are the subgraph nodes' ``type`` (older files have none; then the ``Node kind=X``
    description, then the node name is used), without ``Param`` and ``Return`` bookkeeping
    nodes. ``counted`` says whether the text report counts this epoch: ``NODE_NO_X`` epochs,
    the leading parameters-only epoch (``epoch_0``) and the trailing ``__NN__RETURN__`` epoch
    are not counted.
    """

    id: int
    name: str
    mapping: str
    kind: CInfoKind
    ops: tuple[str, ...]
    node_names: tuple[str, ...]
    counted: bool
    ec_blob: str | None = None


@dataclass(frozen=True)
class CInfoPool:
    """An entry of ``memory_pools[]``; ``subpools`` lists member pool ids of a virtual pool
    (``--enable-virtual-mem-pools`` joins contiguous RAMs into one)."""

    id: int | None
    name: str
    fname: str
    size_bytes: int
    used_size_bytes: int
    rights: str | None = None
    address: int | None = None
    subpools: tuple[int, ...] = ()

    @property
    def virtual(self) -> bool:
        """True for a pool made of other pools."""
        return bool(self.subpools)


@dataclass(frozen=True)
class CInfoBuffer:
    """An entry of ``buffers[]`` (format like ``STAI_FORMAT_S8``; per-channel scales/offsets)."""

    id: int | None
    name: str
    format: str
    shape: tuple[int, ...]
    scales: tuple[float, ...]
    offsets: tuple[int, ...]
    mpool_id: int | None
    mpool_name: str | None
    size_bytes: int
    is_param: bool = False


@dataclass(frozen=True)
class CInfo:
    """What ``network_c_info.json`` says about the compiled network."""

    schema_version: str | None
    epochs: tuple[CInfoEpoch, ...]
    memory_pools: tuple[CInfoPool, ...]
    buffers: tuple[CInfoBuffer, ...]
    weights_bytes: int | None = None
    activations_bytes: int | None = None

    @property
    def counted_epochs(self) -> tuple[CInfoEpoch, ...]:
        """The epochs the text report counts, in order."""
        return tuple(e for e in self.epochs if e.counted)

    @property
    def epoch_count(self) -> int:
        """Number of epochs as the text report counts them."""
        return len(self.counted_epochs)

    @property
    def sw_epochs(self) -> int:
        """Counted pure-software epochs."""
        return sum(1 for e in self.counted_epochs if e.kind == "SW")

    @property
    def hybrid_epochs(self) -> int:
        """Counted hybrid (``NODE_SW_HW``) epochs."""
        return sum(1 for e in self.counted_epochs if e.kind == "HYBRID")

    @property
    def hw_epochs(self) -> int:
        """Counted HW and EC epochs."""
        return sum(1 for e in self.counted_epochs if e.kind in ("HW", "EC"))

    @property
    def sw_ops(self) -> tuple[str, ...]:
        """Ops of the counted SW epochs, in order."""
        return tuple(op for e in self.counted_epochs if e.kind == "SW" for op in e.ops)

    def pool(self, name: str) -> CInfoPool | None:
        """The memory pool called ``name``, or None."""
        return next((p for p in self.memory_pools if p.name == name), None)


def _leaves(node: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    children = node.get("subgraph_nodes") or []
    if not children:
        yield node
        return
    for child in children:
        if isinstance(child, Mapping):
            yield from _leaves(child)


def _op_type(node: Mapping[str, Any]) -> str:
    kind = node.get("type")
    if isinstance(kind, str) and kind.strip():
        return kind.strip()
    described = _NODE_KIND_DESCRIPTION.search(str(node.get("description") or ""))
    if described:
        return described.group("kind")
    return str(node.get("name") or "?")


def _int_or_none(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        return None


def parse_c_info(data: Mapping[str, Any], *, source: str = "the c_info data") -> CInfo:
    """Parse the decoded JSON of ``network_c_info.json`` (schema 2.0, core 2.x to 4.x).

    Raises InputError when ``graphs[0].nodes`` is missing.
    """
    if not isinstance(data, Mapping):
        raise InputError(f"{source} is not a JSON object; expected network_c_info.json content.")
    graphs = data.get("graphs")
    if not isinstance(graphs, list) or not graphs or not isinstance(graphs[0], Mapping):
        raise InputError(f"{source} has no 'graphs' list; expected network_c_info.json content.")
    nodes = graphs[0].get("nodes")
    if not isinstance(nodes, list):
        raise InputError(f"{source} has no 'graphs[0].nodes' list of epochs.")

    epochs: list[CInfoEpoch] = []
    for index, node in enumerate(nodes):
        if not isinstance(node, Mapping):
            raise InputError(f"{source}: graphs[0].nodes[{index}] is not a JSON object.")
        mapping = str(node.get("mapping") or "NODE_UNDEF")
        kind = _MAPPING_KINDS.get(mapping, "UNKNOWN")
        leaves = [leaf for leaf in _leaves(node) if leaf is not node]
        all_types = [_op_type(leaf) for leaf in leaves]
        ops = tuple(t for t in all_types if t not in _BOOKKEEPING_OPS)
        name = str(node.get("name") or f"node_{index}")
        id_match = _EPOCH_NAME.search(name)
        blob = _EC_BLOB_DESCRIPTION.search(str(node.get("description") or ""))
        counted = kind not in ("NO_X", "UNKNOWN") and bool(ops)
        epochs.append(
            CInfoEpoch(
                id=int(id_match.group("id")) if id_match else index,
                name=name,
                mapping=mapping,
                kind=kind,
                ops=ops,
                node_names=tuple(
                    str(leaf.get("name") or "") for leaf, t in zip(leaves, all_types)
                    if t not in _BOOKKEEPING_OPS
                ),
                counted=counted,
                ec_blob=blob.group("blob") if blob else None,
            )
        )

    pools: list[CInfoPool] = []
    for entry in data.get("memory_pools") or []:
        if not isinstance(entry, Mapping):
            continue
        pools.append(
            CInfoPool(
                id=_int_or_none(entry.get("id")),
                name=str(entry.get("name") or ""),
                fname=str(entry.get("fname") or ""),
                size_bytes=_int_or_none(entry.get("size_bytes")) or 0,
                used_size_bytes=_int_or_none(entry.get("used_size_bytes")) or 0,
                rights=entry.get("rights"),
                address=_int_or_none(entry.get("address")),
                subpools=tuple(int(s) for s in entry.get("subpools") or [] if _int_or_none(s) is not None),
            )
        )
    pool_names = {p.id: p.name for p in pools if p.id is not None}

    buffers: list[CInfoBuffer] = []
    for entry in data.get("buffers") or []:
        if not isinstance(entry, Mapping):
            continue
        intq = entry.get("intq") if isinstance(entry.get("intq"), Mapping) else {}
        fmt = entry.get("format")
        if isinstance(fmt, Mapping):  # some writers nest the quantization under "format"
            intq = fmt.get("intq") or intq
            fmt = fmt.get("type") or fmt.get("name") or ""
        mpool_id = _int_or_none(entry.get("mpool_id"))
        buffers.append(
            CInfoBuffer(
                id=_int_or_none(entry.get("id")),
                name=str(entry.get("name") or ""),
                format=str(fmt or ""),
                shape=tuple(int(d) for d in entry.get("shape") or []),
                scales=tuple(float(s) for s in intq.get("scales") or []),
                offsets=tuple(int(o) for o in intq.get("offsets") or []),
                mpool_id=mpool_id,
                mpool_name=pool_names.get(mpool_id) if mpool_id is not None else None,
                size_bytes=_int_or_none(entry.get("size_bytes")) or 0,
                is_param=bool(entry.get("is_param", False)),
            )
        )

    footprint = data.get("memory_footprint") if isinstance(data.get("memory_footprint"), Mapping) else {}
    return CInfo(
        schema_version=str(data["json_schema_version"]) if "json_schema_version" in data else None,
        epochs=tuple(epochs),
        memory_pools=tuple(pools),
        buffers=tuple(buffers),
        weights_bytes=_int_or_none(footprint.get("weights")),
        activations_bytes=_int_or_none(footprint.get("activations")),
    )


def load_c_info(path: str | Path) -> CInfo:
    """Read and parse a ``network_c_info.json`` file (see :func:`parse_c_info`)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        raise InputError(f"The c_info file {path} cannot be read: {exc.strerror or exc}.") from exc
    except json.JSONDecodeError as exc:
        raise InputError(
            f"The c_info file {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from exc
    return parse_c_info(data, source=str(path))


# ---------------------------------------------------------------------------------------------
# Per-epoch CSV (atonn --csv-file)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochCsv:
    """A per-epoch CSV read by its header names.

    No verbatim sample of atonn's ``--csv-file`` output was available when this was written, so
    the columns are kept as named in the file; :meth:`column` finds one by name
    (case-insensitive, spaces and underscores ignored) and :attr:`epoch_ids` reads the first
    column whose name starts with ``epoch``.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def column(self, *names: str) -> str | None:
        """The first header matching any of ``names`` exactly (normalised), else the first one
        that contains it; None when there is none."""
        normalised = {self._norm(c): c for c in self.columns}
        for name in names:
            if self._norm(name) in normalised:
                return normalised[self._norm(name)]
        for name in names:
            for key, original in normalised.items():
                if self._norm(name) in key:
                    return original
        return None

    def values(self, name: str) -> tuple[str, ...]:
        """All values of the column whose header matches ``name`` (see :meth:`column`)."""
        header = self.column(name)
        if header is None:
            raise KeyError(name)
        index = self.columns.index(header)
        return tuple(row[index] if index < len(row) else "" for row in self.rows)

    def records(self) -> list[dict[str, str]]:
        """The rows as dicts keyed by header."""
        return [dict(zip(self.columns, row)) for row in self.rows]

    @property
    def epoch_ids(self) -> tuple[int | None, ...]:
        """The epoch number of each row (digits of the epoch column), None where there is none."""
        header = next((c for c in self.columns if self._norm(c).startswith("epoch")), None)
        if header is None:
            return tuple(None for _ in self.rows)
        out: list[int | None] = []
        for value in self.values(header):
            digits = re.search(r"\d+", value)
            out.append(int(digits.group()) if digits else None)
        return tuple(out)

    @staticmethod
    def _norm(name: str) -> str:
        return re.sub(r"[\s_\-]+", "", name.strip().lower())


def parse_epoch_csv(text: str, *, source: str = "the epoch CSV") -> EpochCsv:
    """Parse a per-epoch CSV (comma, semicolon or tab separated) by its header row."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise InputError(f"{source} is empty; expected a header row and one row per epoch.")
    sample = "\n".join(lines[:20])
    try:
        dialect: type[csv.Dialect] | csv.Dialect = csv.Sniffer().sniff(sample, delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    reader = csv.reader(io.StringIO("\n".join(lines)), dialect)
    table = [[cell.strip() for cell in row] for row in reader]
    header = tuple(table[0])
    if not any(header) or all(re.fullmatch(r"[-+\d.eE]*", h) for h in header):
        raise InputError(f"{source} has no header row (its first row is {', '.join(header)[:120]}).")
    return EpochCsv(columns=header, rows=tuple(tuple(row) for row in table[1:] if any(row)))


# ---------------------------------------------------------------------------------------------
# Known errors
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownError:
    """A compiler failure (or warning) nafix recognises in a stedgeai/atonn log.

    ``details`` carries what was captured (tensor names, node, bytes) and, where one applies,
    the nafix ``rule`` and command-line ``option`` that address it. ``tag`` is the provenance of
    the explanation (OBS, 3P, INF as in NEURAL_ART.md). Because ``details`` is a dict, a
    KnownError compares by value but cannot be hashed.
    """

    code: str
    cause: str
    fix: str
    evidence_line: str
    details: Mapping[str, Any] = field(default_factory=dict)
    tag: str = "3P"


@dataclass(frozen=True)
class KnownErrorPattern:
    """One entry of the known-error table: how to spot it and what to say."""

    code: str
    regex: re.Pattern[str]
    cause: str
    fix: str
    tag: str
    rule: str | None = None
    option: str | None = None
    per_match: bool = False
    """True: one KnownError per distinct match (e.g. per node); False: one for the whole log."""


KNOWN_ERROR_PATTERNS: tuple[KnownErrorPattern, ...] = (
    KnownErrorPattern(
        code="mpool-json-error",
        regex=re.compile(r"memory pool JSON ERROR", re.I),
        cause="atonn could not parse the .mpool memory-pool file; it reads it with a strict JSON "
        "parser that rejects // comments and non-ASCII text, and any 'total bytes left "
        "unallocated' figure printed after this is meaningless",
        fix="remove comments and trailing commas from the .mpool file (nafix's own loader accepts "
        "them; atonn does not)",
        tag="3P",
    ),
    KnownErrorPattern(
        code="uint8-activations",
        regex=re.compile(r"quantized unsigned integer format is not supported", re.I),
        cause="the model has uint8 (QUInt8) activations; the Neural-ART NPU accepts signed int8 "
        "only",
        fix="re-quantize activations to int8 (QDQ, activation_type=QInt8, per-channel int8 "
        "weights)",
        tag="3P",
        option="--quantize",
    ),
    KnownErrorPattern(
        code="gemm-dynamic-bias",
        regex=re.compile(r"TOOL ERROR:\s*list index out of range", re.I),
        cause="a Gemm has a bias C that is not a constant, which the importer cannot lower",
        fix="unfuse the Gemm into MatMul + Add",
        tag="3P",
        rule="NAF011",
    ),
    KnownErrorPattern(
        code="shape-computation",
        regex=re.compile(
            r"TOOL ERROR:\s*Error in computation of shapes(?:\s+for node\s+(?P<node>\S+))?", re.I
        ),
        cause="a tensor has a dynamic or unsupported shape (symbolic dimensions, or rank > 4)",
        fix="pin every input shape with --input-shape NAME=1x3x224x224 and keep tensors at rank 4 "
        "or less",
        tag="3P",
        option="--input-shape",
    ),
    KnownErrorPattern(
        code="channel-position",
        regex=re.compile(r"INTERNAL ERROR:\s*Mismatch in channel position", re.I),
        cause="the front end could not agree on channel-first vs channel-last for an I/O tensor "
        "(also seen with a Transpose of a runtime tensor)",
        fix="state the layout with stedgeai --inputs-ch-position / --outputs-ch-position "
        "(chfirst or chlast), or remove the runtime Transpose",
        tag="3P",
    ),
    KnownErrorPattern(
        code="atonn-crash",
        regex=re.compile(r"signo\s*=\s*11\b", re.I),
        cause="the NPU compiler atonn crashed (segmentation fault); known causes include rank-5 "
        "tensors",
        fix="reshape rank-5 tensors to rank 4 or less and re-run; report the model to ST if the "
        "crash remains",
        tag="3P",
    ),
    KnownErrorPattern(
        code="memory-overflow",
        regex=re.compile(
            r"Oauto did not find valid compile options:\s*aborting|total bytes left unallocated\s*=\s*\d+",
            re.I,
        ),
        cause="the activations do not fit the memory pools of the Neural-ART profile",
        fix="use a profile with external RAM (e.g. hyperRAM), or reduce the input size or the "
        "largest activation",
        tag="3P",
    ),
    KnownErrorPattern(
        code="not-quantized",
        regex=re.compile(r"WARNING:\s*(?P<tensor>\S+)\s+is not quantized", re.I),
        cause="tensors without quantization parameters stay float, so the ops around them run in "
        "SW as DequantizeLinear -> op -> QuantizeLinear",
        fix="quantize the float island (QDQ around the op)",
        tag="OBS",
        option="--quantize",
    ),
    KnownErrorPattern(
        code="scale-offset-sw",
        regex=re.compile(
            r"HW lowering not done for\s+(?P<op>\w+)\s+node\s*=\s*(?P<node>[^\s,]+)\s+because output "
            r"tensor\s*\(id\s*=\s*(?P<tensor_id>\d+)\)\s*has scale-offset format",
            re.I,
        ),
        cause="the op's output has a non-zero zero-point ('scale-offset format') and the compiler "
        "lowered it to SW; the exact trigger is unknown (seen on 1x1 Conv/Gemm with 257 channels)",
        fix="re-quantize that output with zero-point 0 (NAF013) or split its channel count (NAF001)",
        tag="OBS",
        rule="NAF013",
        per_match=True,
    ),
)
"""The known-error table: the one place these strings and their advice live."""

_UNALLOCATED = re.compile(r"total bytes left unallocated\s*=\s*(?P<n>\d+)", re.I)


def _line_at(text: str, position: int) -> str:
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    return text[start : end if end >= 0 else len(text)].strip()


def explain(text: str) -> tuple[KnownError, ...]:
    """Recognise known compiler failures in a stedgeai/atonn log, in order of first appearance.

    Each pattern of :data:`KNOWN_ERROR_PATTERNS` yields one KnownError for the whole log (the
    'not quantized' warning collects every tensor name), except per-node ones such as
    ``scale-offset-sw`` (one per node). When an .mpool parse error is present, the
    memory-overflow entry is dropped: atonn prints it as a rollback, not about the layout.
    """
    found: list[tuple[int, KnownError]] = []
    mpool_broken = any(p.code == "mpool-json-error" and p.regex.search(text) for p in KNOWN_ERROR_PATTERNS)
    for pattern in KNOWN_ERROR_PATTERNS:
        matches = list(pattern.regex.finditer(text))
        if not matches:
            continue
        if pattern.code == "memory-overflow" and mpool_broken:
            continue
        base: dict[str, Any] = {}
        if pattern.rule:
            base["rule"] = pattern.rule
        if pattern.option:
            base["option"] = pattern.option
        if pattern.per_match:
            seen: set[tuple[str, ...]] = set()
            for match in matches:
                captured = {k: v for k, v in match.groupdict().items() if v is not None}
                key = tuple(sorted(captured.items()))  # type: ignore[arg-type]
                if key in seen:
                    continue
                seen.add(key)
                details = {**base, **captured}
                if "tensor_id" in details:
                    details["tensor_id"] = int(details["tensor_id"])
                if pattern.code == "scale-offset-sw":
                    details["alternative_rule"] = "NAF001"
                found.append((match.start(), KnownError(
                    code=pattern.code, cause=pattern.cause, fix=pattern.fix,
                    evidence_line=_line_at(text, match.start()), details=details, tag=pattern.tag,
                )))
            continue
        first = matches[0]
        details = dict(base)
        evidence = _line_at(text, first.start())
        if pattern.code == "not-quantized":
            tensors = tuple(dict.fromkeys(m.group("tensor") for m in matches))
            details["tensors"] = tensors
            details["count"] = len(tensors)
        elif pattern.code == "memory-overflow":
            unallocated = _UNALLOCATED.search(text)
            if unallocated:
                details["unallocated_bytes"] = int(unallocated.group("n"))
                evidence = _line_at(text, unallocated.start())
        elif pattern.code == "shape-computation":
            nodes = tuple(dict.fromkeys(m.group("node") for m in matches if m.group("node")))
            if nodes:
                details["nodes"] = nodes
        found.append((first.start(), KnownError(
            code=pattern.code, cause=pattern.cause, fix=pattern.fix,
            evidence_line=evidence, details=details, tag=pattern.tag,
        )))
    found.sort(key=lambda item: item[0])
    return tuple(error for _, error in found)


# ---------------------------------------------------------------------------------------------
# Running stedgeai generate
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompileResult:
    """The outcome of one ``stedgeai generate`` run.

    ``ok`` is True when stedgeai exited with code 0. ``known_errors`` is filled on success too
    (warnings such as 'is not quantized' appear in successful logs). ``problems`` lists
    sentences about results that could not be read (a missing report, a malformed c_info).
    """

    ok: bool
    returncode: int
    command: tuple[str, ...]
    log: str
    duration_s: float
    output_dir: Path
    workspace_dir: Path
    report: StedgeaiReport | None = None
    report_path: Path | None = None
    c_info: CInfo | None = None
    c_info_path: Path | None = None
    epoch_csv: EpochCsv | None = None
    epoch_csv_path: Path | None = None
    known_errors: tuple[KnownError, ...] = ()
    problems: tuple[str, ...] = ()


def _generate_command(
    tool: Path, model: Path, output_dir: Path, workspace_dir: Path, profile: str | None,
    extra_args: Sequence[str],
) -> list[str]:
    # Option names as printed on the "Parameters" line of real reports:
    #   generate -m MODEL --target stm32n6 --st-neural-art [NAME@FILE.json] --output DIR --workspace DIR
    # stedgeai itself passes "--output-info-file c_info.json" to atonn and writes
    # network_c_info.json to the output folder, so no option is needed for it.
    command = [str(tool), "generate", "-m", str(model), "--target", "stm32n6", "--st-neural-art"]
    if profile:
        command.append(profile)
    command += ["--output", str(output_dir), "--workspace", str(workspace_dir)]
    command += [str(arg) for arg in extra_args]
    return command


def _kill_process_tree(process: subprocess.Popen[str]) -> None:
    """Stop the process and everything it started (atonn runs as a child of stedgeai)."""
    if process.poll() is not None:
        return
    try:
        if os.name == "posix":
            os.killpg(process.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows
            subprocess.run(
                ["taskkill", "/F", "/T", "/PID", str(process.pid)], capture_output=True, check=False
            )
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.kill()
    except OSError:
        pass


def _pump(stream: io.TextIOBase, lines: queue.Queue[str | None]) -> None:
    try:
        for line in stream:
            lines.put(line.rstrip("\r\n"))
    except (OSError, ValueError):
        pass
    finally:
        lines.put(None)


def _find_first(folders: Sequence[Path], patterns: Sequence[str]) -> Path | None:
    for pattern in patterns:
        for folder in folders:
            if not folder.is_dir():
                continue
            hits = sorted(folder.rglob(pattern), key=lambda p: (len(p.parts), str(p)))
            if hits:
                return hits[0]
    return None


def run_generate(
    *,
    tool: Path,
    model: Path,
    workdir: Path,
    profile: str | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = 900,
    on_line: Callable[[str], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> CompileResult:
    """Compile ``model`` with ``stedgeai generate --target stm32n6 --st-neural-art [profile]``.

    Outputs go to ``workdir/output`` and ``workdir/workspace``; the process runs with ``workdir``
    as its current folder, so nothing is written next to the model. Every stdout/stderr line is
    passed to ``on_line`` as it arrives. ``profile`` is ``NAME@FILE.json`` or None for ST's
    default; ``extra_args`` are appended verbatim; ``env`` replaces the environment.

    Returns a CompileResult; ``ok=False`` with the log and the recognised known errors when
    stedgeai fails. Raises ToolError when stedgeai cannot be started or does not finish within
    ``timeout_s`` seconds (the whole process group is killed first), InputError when the model
    does not exist, and UsageError when ``workdir`` is the model's own folder.
    """
    tool = Path(tool)
    if tool.exists():
        tool = tool.absolute()  # the process runs in workdir, so a relative path would break
    model = Path(model)
    workdir = Path(workdir)
    if not model.is_file():
        raise InputError(f"The model {model} does not exist or is not a file.")
    if workdir.exists() and not workdir.is_dir():
        raise UsageError(f"The work folder {workdir} exists and is not a folder.")
    if workdir.resolve() == model.resolve().parent:
        raise UsageError(
            f"The work folder {workdir} is the model's own folder; give a separate folder so "
            "stedgeai writes nothing next to the model."
        )
    if timeout_s <= 0:
        raise UsageError(f"The stedgeai timeout must be positive, got {timeout_s:g} s.")
    output_dir = workdir / "output"
    workspace_dir = workdir / "workspace"
    output_dir.mkdir(parents=True, exist_ok=True)
    workspace_dir.mkdir(parents=True, exist_ok=True)
    command = _generate_command(
        tool, model.resolve(), output_dir.resolve(), workspace_dir.resolve(), profile, extra_args
    )
    log.info("running: %s", subprocess.list2cmdline(command))

    popen_kwargs: dict[str, Any] = {}
    if os.name == "posix":
        popen_kwargs["start_new_session"] = True
    else:  # pragma: no cover - Windows
        popen_kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            command,
            cwd=str(workdir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            env=dict(env) if env is not None else None,
            **popen_kwargs,
        )
    except OSError as exc:
        raise ToolError(f"stedgeai could not be started from '{tool}': {exc.strerror or exc}.") from exc

    lines: queue.Queue[str | None] = queue.Queue()
    readers = [
        threading.Thread(target=_pump, args=(stream, lines), daemon=True)
        for stream in (process.stdout, process.stderr)
    ]
    for reader in readers:
        reader.start()
    collected: list[str] = []
    open_streams = len(readers)
    deadline = started + timeout_s
    try:
        while open_streams:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                line = lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line is None:
                open_streams -= 1
                continue
            collected.append(line)
            if on_line is not None:
                on_line(line)
        returncode = process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except (TimeoutError, subprocess.TimeoutExpired):
        _kill_process_tree(process)
        process.wait()
        last = next((line for line in reversed(collected) if line.strip()), "")
        raise ToolError(
            f"stedgeai did not finish within {timeout_s:g} s and was stopped; its partial output "
            f"is in {workdir} (last line: '{last[:200]}')."
        ) from None
    except BaseException:
        _kill_process_tree(process)
        process.wait()
        raise
    finally:
        for reader in readers:
            reader.join(timeout=2)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    duration = time.monotonic() - started
    text = "\n".join(collected)
    known = explain(text)

    if returncode != 0:
        log.info("stedgeai exited with code %d after %.1f s", returncode, duration)
        return CompileResult(
            ok=False, returncode=returncode, command=tuple(command), log=text, duration_s=duration,
            output_dir=output_dir, workspace_dir=workspace_dir, known_errors=known,
        )

    problems: list[str] = []
    folders = [output_dir, workspace_dir]
    report: StedgeaiReport | None = None
    report_path = _find_first(folders, ["network_generate_report.txt", "*_generate_report.txt"])
    try:
        if report_path is not None:
            report = load_report(report_path)
        elif "Total number of epochs" in text:
            report = parse_report(text, source="the stedgeai log")
            problems.append(
                f"No *_generate_report.txt was found under {output_dir} or {workspace_dir}; the "
                "epochs were read from the console log."
            )
        else:
            problems.append(f"No *_generate_report.txt was found under {output_dir} or {workspace_dir}.")
    except InputError as exc:
        problems.append(exc.message)

    c_info: CInfo | None = None
    c_info_path = _find_first(folders, ["network_c_info.json", "*_c_info.json", "c_info.json"])
    if c_info_path is not None:
        try:
            c_info = load_c_info(c_info_path)
        except InputError as exc:
            problems.append(exc.message)
    else:
        problems.append(f"No *_c_info.json was found under {output_dir} or {workspace_dir}.")

    epoch_csv: EpochCsv | None = None
    csv_path = _find_first(folders, ["*.csv"])
    if csv_path is not None:
        try:
            epoch_csv = parse_epoch_csv(
                csv_path.read_text(encoding="utf-8", errors="replace"), source=str(csv_path)
            )
        except (InputError, OSError) as exc:
            problems.append(getattr(exc, "message", None) or f"{csv_path} cannot be read: {exc}.")

    if report is not None and c_info is not None and report.epochs != c_info.epoch_count:
        problems.append(
            f"The report counts {report.epochs} epochs but {c_info_path} has {c_info.epoch_count} "
            "counted epochs."
        )
    for problem in problems:
        log.warning("%s", problem)
    return CompileResult(
        ok=True, returncode=returncode, command=tuple(command), log=text, duration_s=duration,
        output_dir=output_dir, workspace_dir=workspace_dir, report=report, report_path=report_path,
        c_info=c_info, c_info_path=c_info_path, epoch_csv=epoch_csv, epoch_csv_path=csv_path,
        known_errors=known, problems=tuple(problems),
    )
