"""The options of an analysis and the files an audit reads: light (no onnx, no numpy), so an audit
answered from the result cache imports no analysis stack. :mod:`fixer.api` re-exports them."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from .errors import UsageError

if TYPE_CHECKING:
    from .npu.profile import TargetProfile

log = logging.getLogger("fixer.api")

#: Model files audit collects from folders (a file named on the command line is read by content).
MODEL_SUFFIXES = (".onnx", ".tflite")


@dataclass(frozen=True)
class AnalysisOptions:
    """How to read and place a model."""

    target_profile: str | None = None  # built-in name or YAML path
    stedgeai_options: frozenset[str] = frozenset()  # e.g. --expand-softmax
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    mpool: str | None = None  # a .mpool file for the memory estimate
    neural_art_profile: str | None = None  # NAME@FILE.json
    core: str | None = None  # stedgeai core version X.Y (default: the newest in the profile data)


@dataclass(frozen=True)
class AuditOptions:
    analysis: AnalysisOptions = AnalysisOptions()
    recursive: bool = True


def resolve_profile(opts: AnalysisOptions) -> TargetProfile:
    from .npu.profile import load_profile

    return load_profile(opts.target_profile, options=frozenset(opts.stedgeai_options), core=opts.core)


def resolve_pools(opts: AnalysisOptions):
    """Memory pools for the estimate: --mpool, else the pool file of --profile NAME@FILE, else the default."""
    if opts.mpool and opts.neural_art_profile:
        raise UsageError("--mpool and --profile both name memory pools; give only one of them.")
    if not (opts.mpool or opts.neural_art_profile):
        return None
    from .npu import mpool as mp

    if opts.mpool:
        return mp.load_mpool(opts.mpool).pools
    if opts.neural_art_profile:
        prof = mp.load_neural_art_profile(opts.neural_art_profile)
        return prof.pools.pools if prof.pools is not None else None
    return None


def collect_models(paths: Sequence[str | os.PathLike[str]], *, recursive: bool = True) -> list[Path]:
    """Expand files and folders into the list of .onnx and .tflite files to audit (sorted, de-duplicated)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            pattern = "**/*" if recursive else "*"
            found = sorted(q for q in p.glob(pattern) if q.is_file() and q.suffix.lower() in MODEL_SUFFIXES)
            if not found:
                # info, not warning: with no model at all audit() raises the one 'error:' line on its own
                log.info("%s: no .onnx or .tflite files found", p)
            out.extend(found)
        else:
            out.append(p)
    seen: set[Path] = set()
    unique = []
    for p in out:
        key = p.resolve() if p.exists() else p
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def parse_input_shapes(specs: list[str] | tuple[str, ...] | None) -> dict[str, tuple[int, ...]]:
    """Parse ``NAME=1,3,224,224`` options into a mapping; a bad spec is a UsageError sentence."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or ():
        name, sep, dims = spec.rpartition("=")
        if not sep or not name:
            raise UsageError(f"--input-shape '{spec}' is not of the form NAME=1,3,224,224.")
        try:
            values = tuple(int(v) for v in dims.replace("x", ",").split(",") if v.strip())
        except ValueError:
            raise UsageError(f"--input-shape '{spec}': '{dims}' is not a comma-separated list of integers.") from None
        if not values or any(v <= 0 for v in values):
            raise UsageError(f"--input-shape '{spec}': every dimension must be a positive integer.")
        shapes[name] = values
    return shapes
