"""Known compiler errors: :func:`explain` recognises the failures listed in ``KNOWN_ERROR_PATTERNS``
and says what to do about each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KnownError:
    """A compiler failure (or warning) nafix recognises in a stedgeai/atonn log.

    ``details`` carries what was captured (tensor names, node, bytes) and, where one applies,
    the nafix ``rule`` and command-line ``option`` that address it. ``tag`` is the provenance of
    the explanation (OBS, 3P, INF as in NPU_FACTS.md#how-sure). Because ``details`` is a dict, a
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
        # the name cannot run over the next "WARNING:": each warning is scanned once (linear time)
        regex=re.compile(r"WARNING:[ \t]*(?P<tensor>(?:(?!WARNING:)\S)+)[ \t]+is not quantized", re.I),
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
