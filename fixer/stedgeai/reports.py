"""Parsers of what stedgeai writes, pure functions on text or JSON: :func:`parse_report` (both report
formats), :func:`parse_c_info` (``network_c_info.json``), :func:`parse_epoch_csv` (atonn's per-epoch CSV).

ST says the report format "is subject to changes", so the parsers read values by their labels
(``Total number of epochs``, ``>> pure software (SW) epochs``, table headers), never by column
position.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import InputError
from .locate import parse_version

log = logging.getLogger(__name__)

EpochKind = Literal["HW", "SW", "EC", "HYBRID", "UNKNOWN"]

"""Where an epoch runs: ``HW`` NPU, ``EC`` NPU driven by the epoch controller, ``SW`` Cortex-M55,
``HYBRID`` both, ``UNKNOWN`` a row the report marks ``??`` (seen in core 2.2.0 reports)."""

CInfoKind = Literal["HW", "SW", "EC", "HYBRID", "NO_X", "UNKNOWN"]

"""Kind of a ``network_c_info.json`` epoch; ``NO_X`` is ``NODE_NO_X`` (not executed)."""


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

#: At most this many epoch rows are read from one report (real networks have a few hundred): an
#: epoch-controller range (``epochs 1 -> 13``) is expanded to one row per id, so a 40-byte row could
#: otherwise ask for a billion.
MAX_EPOCH_ROWS = 100_000


class MalformedReport(InputError):
    """The text is a stedgeai report (it has the epoch counters) but claims what no report can hold
    (an epoch range larger than the report's own total, or than :data:`MAX_EPOCH_ROWS`)."""


def _lines(text: str, start: int = 0) -> Iterable[tuple[int, str]]:
    """``(offset, line)`` of every line of ``text`` from ``start``, in one linear pass (the report
    patterns below are matched per line with str methods: a regex anchored with ``^\\s*`` over the
    whole text, or with ``.*?\\s*$``, takes quadratic time on a long run of spaces or blank lines)."""
    n = len(text)
    while start <= n:
        end = text.find("\n", start)
        if end < 0:
            end = n
        yield start, text[start:end].rstrip("\r")
        start = end + 1


def _from_word(text: str, word: str) -> int | None:
    """Offset of the line holding the first case-insensitive ``word``, or None (a plain literal
    search: the line scans below start there)."""
    hit = re.search(re.escape(word), text, re.I)
    return None if hit is None else text.rfind("\n", 0, hit.start()) + 1


def _labelled(text: str, label: str) -> str | None:
    """The value after ``label :`` on the first line that starts (after blanks) with ``label``
    (case-insensitive), stripped; None when there is none (or its value is empty)."""
    want = label.lower()
    start = _from_word(text, label)
    if start is None:
        return None
    for _, line in _lines(text, start):
        s = line.strip()
        if s[: len(want)].lower() != want:
            continue
        rest = s[len(want):].lstrip()
        if rest.startswith(":") and rest[1:].strip():
            return rest[1:].strip()
    return None


def _format_b_total(text: str) -> tuple[int, int, int] | None:
    """(epochs, start, end) of the first ``Total number of epochs N`` line (format B: no colon)."""
    want = "total number of epochs"
    start = _from_word(text, want)
    if start is None:
        return None
    for offset, line in _lines(text, start):
        s = line.strip()
        if s[: len(want)].lower() != want:
            continue
        rest = s[len(want):]
        if rest[:1].isspace() and rest.strip().isdigit() and rest.strip().isascii():
            return int(rest.strip()), offset, offset + len(line)
    return None


def _format_b_counters(text: str) -> Iterable[tuple[str, int, str | None]]:
    """``(label, n, note)`` of each ``>> label N (note)`` line."""
    for _, line in _lines(text):
        s = line.strip()
        if not s.startswith(">>"):
            continue
        body, note = s[2:].strip(), None
        if body.endswith(")") and "(" in body:
            cut = body.rfind("(")
            inner = body[cut + 1 : -1]
            head = body[:cut].rstrip()
            if ")" not in inner and head.rsplit(None, 1)[-1:] and head.rsplit(None, 1)[-1].isdigit():
                body, note = head, inner
        parts = body.rsplit(None, 1)
        if len(parts) == 2 and parts[1].isdigit() and parts[1].isascii():
            yield parts[0], int(parts[1]), note


def _command_line(text: str) -> str | None:
    """The first ``...stedgeai generate|analyze|validate ...`` line, stripped."""
    start = _from_word(text, "stedgeai")
    if start is None:
        return None
    for _, line in _lines(text, start):
        s = line.strip()
        parts = s.split(None, 2)
        if len(parts) < 2:
            continue
        tool = parts[0].lower()
        verb = parts[1].lower()
        if not (tool.endswith("stedgeai") or tool.endswith("stedgeai.exe")):
            continue
        for word in ("generate", "analyze", "validate"):
            if verb.startswith(word) and not (verb[len(word):len(word) + 1].isalnum() or verb[len(word):len(word) + 1] == "_"):
                return s
    return None


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


def _parse_format_b_rows(lines: Sequence[str], source: str, epochs: int) -> tuple[EpochRow, ...]:
    """Read the ``| epoch ID | Type | Details |`` table by its header names.

    An ``epochs A -> B`` range is one row per id; a range (or the table) with more ids than the
    report's own total of ``epochs`` (a little slack for ids the compiler skipped) or than
    :data:`MAX_EPOCH_ROWS` raises :class:`MalformedReport`: the report cannot hold them."""
    header: dict[str, int] | None = None
    rows: list[EpochRow] = []
    limit = min(MAX_EPOCH_ROWS, 2 * max(epochs, 0) + 64)
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
            if len(rows) >= limit:
                raise MalformedReport(
                    f"{source}: the epoch table has more rows than the report's total of {epochs} epochs can "
                    f"hold (at most {limit} rows are read); not a report nafix can read."
                )
            rows.append(EpochRow(id=int(single.group("id")), kind=kind, ops=ops))
        elif many:
            first, last = int(many.group("first")), int(many.group("last"))
            if last - first + 1 + len(rows) > limit:
                raise MalformedReport(
                    f"{source}: the epoch table row '{ident[:80]}' spans {last - first + 1} epochs, more than the "
                    f"report's total of {epochs} epochs can hold (at most {limit} rows are read); not a report "
                    "nafix can read."
                )
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
        try:
            info = IoInfo(
                name=match.group("name"),
                dtype=match.group("dtype"),
                shape=_parse_shape(match.group("shape")),
                scale=float(q.group("scale")) if q else None,
                zero_point=int(q.group("zp")) if q else None,
                size_bytes=size,
            )
        except ValueError:  # a garbled line (e.g. "1.2.3" as a scale): that I/O line is not read
            continue
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
    compiler = _labelled(text, "Compiler version")
    command = _labelled(text, "Parameters") or _command_line(text)
    memory = _parse_memory(text)
    inputs, outputs = _parse_io(text)

    a_total = _FORMAT_A_TOTAL.search(text)
    b_total = _format_b_total(text)
    hybrid: int | None
    ec_blobs: int | None = None
    if a_total and (not b_total or a_total.start() <= b_total[1]):
        fmt: Literal["A", "B"] = "A"
        epochs = int(a_total.group("epochs"))
        sw = int(a_total.group("sw"))
        hybrid = None
        hw = epochs - sw
        rows = _parse_format_a_rows(text[a_total.end() :].splitlines())
    elif b_total:
        fmt = "B"
        epochs = b_total[0]
        counters: dict[str, int] = {}
        after = text[b_total[2] :]
        for raw_label, n, raw_note in _format_b_counters(after):
            label = raw_label.lower()
            if "hybrid" in label:
                key = "hybrid"
            elif "software" in label or "(sw)" in label:
                key = "sw"
            elif "hardware" in label or "(hw" in label:
                key = "hw"
                note = raw_note or ""
                blobs = _EC_BLOBS.search(note)
                if blobs:
                    ec_blobs = int(blobs.group(1))
            else:
                continue
            counters.setdefault(key, n)
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
        rows = _parse_format_b_rows(after.splitlines(), source, epochs)
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
        compiler_version=compiler.split()[0] if compiler else None,
        command=command,
    )


def load_report(path: str | Path) -> StedgeaiReport:
    """Read and parse a report file (see :func:`parse_report`)."""
    from ..fsutil import NotRegularFileError, read_text

    path = Path(path)
    try:
        text = read_text(path, errors="replace")  # a folder or a FIFO is never read (a FIFO would block)
    except NotRegularFileError:
        raise InputError(f"The stedgeai report {path} is not a regular file.") from None
    except OSError as exc:
        raise InputError(f"The stedgeai report {path} cannot be read: {exc.strerror or exc}.") from exc
    return parse_report(text, source=str(path))


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
    from ..fsutil import NotRegularFileError, read_text

    path = Path(path)
    try:
        data = json.loads(read_text(path, errors="replace"))
    except NotRegularFileError:
        raise InputError(f"The c_info file {path} is not a regular file.") from None
    except RecursionError:
        raise InputError(f"The c_info file {path} is nested too deeply to read.") from None
    except OSError as exc:
        raise InputError(f"The c_info file {path} cannot be read: {exc.strerror or exc}.") from exc
    except json.JSONDecodeError as exc:
        raise InputError(
            f"The c_info file {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from exc
    except RecursionError:  # a few KB of '[' would otherwise be an internal error
        raise InputError(f"The c_info file {path} is nested too deeply to be a c_info file.") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise InputError(f"The c_info file {path} is not valid JSON: {str(exc)[:200]}.") from None
    return parse_c_info(data, source=str(path))


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


_SNIFF_CHARS = 4096


def parse_epoch_csv(text: str, *, source: str = "the epoch CSV") -> EpochCsv:
    """Parse a per-epoch CSV (comma, semicolon or tab separated) by its header row."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise InputError(f"{source} is empty; expected a header row and one row per epoch.")
    # csv.Sniffer's patterns take super-linear time on long lines (",\"" repeated: minutes for 200 KB):
    # it sees at most the first 4 KiB, whole lines where it can
    sample = "\n".join(lines[:20])
    if len(sample) > _SNIFF_CHARS:
        cut = sample.rfind("\n", 0, _SNIFF_CHARS)
        sample = sample[: cut if cut > 0 else _SNIFF_CHARS]
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
