"""The nafix library API: no printing, no exiting; options in, dataclasses out."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .errors import InputError, NafixError, UsageError
from .graph import GraphView
from .model_io import LoadedModel, load_model
from .npu.estimate import EpochEstimate, estimate_epochs
from .npu.memory import MemoryEstimate, estimate_memory
from .npu.placement import SW, Placement, Reason, place
from .npu.profile import TargetProfile, load_profile

log = logging.getLogger(__name__)

ONNX_SUFFIXES = (".onnx",)


@dataclass(frozen=True)
class AnalysisOptions:
    """How to read and place a model."""

    target_profile: str | None = None  # built-in name or YAML path
    stedgeai_options: frozenset[str] = frozenset()  # e.g. --expand-softmax
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    mpool: str | None = None  # a .mpool file for the memory estimate
    neural_art_profile: str | None = None  # NAME@FILE.json


@dataclass(frozen=True)
class AuditOptions:
    analysis: AnalysisOptions = AnalysisOptions()
    recursive: bool = True


@dataclass
class ModelAnalysis:
    """Everything nafix knows about one model without rewriting it."""

    path: Path
    loaded: LoadedModel
    view: GraphView
    placement: Placement
    estimate: EpochEstimate
    memory: MemoryEstimate
    findings: list[Reason]
    profile: TargetProfile

    def sw_nodes(self) -> list[dict]:
        out = []
        for n in self.placement.nodes:
            if n.unit != SW:
                continue
            out.append({
                "name": n.name,
                "op_type": n.op_type,
                "kernel": n.kernel,
                "role": n.role or None,
                "reasons": [r.text() for r in n.reasons],
                "constraints": [r.constraint for r in n.reasons],
                "tags": sorted({r.tag for r in n.reasons}),
            })
        return out

    def notes(self) -> list[dict]:
        return [
            {"name": n.name, "op_type": n.op_type, "note": r.text(), "constraint": r.constraint, "severity": r.severity}
            for n in self.placement.nodes for r in n.notes
        ]


@dataclass
class ModelAudit:
    path: Path
    analysis: ModelAnalysis | None = None
    error: str | None = None


@dataclass
class AuditResult:
    models: list[ModelAudit]

    @property
    def errors(self) -> list[ModelAudit]:
        return [m for m in self.models if m.error]

    @property
    def any_sw(self) -> bool:
        return any(m.analysis is not None and m.analysis.estimate.sw_epochs > 0 for m in self.models)


def resolve_profile(opts: AnalysisOptions) -> TargetProfile:
    return load_profile(opts.target_profile, options=frozenset(opts.stedgeai_options))


def resolve_pools(opts: AnalysisOptions):
    """Memory pools for the estimate: --mpool, else the pool file of --profile NAME@FILE, else the default."""
    from .npu import mpool as mp

    if opts.mpool and opts.neural_art_profile:
        raise UsageError("--mpool and --profile both name memory pools; give only one of them.")
    if opts.mpool:
        return mp.load_mpool(opts.mpool).pools
    if opts.neural_art_profile:
        prof = mp.load_neural_art_profile(opts.neural_art_profile)
        return prof.pools.pools if prof.pools is not None else None
    return None


def analyze_model(model_or_loaded, *, profile: TargetProfile, pools=None, path: Path | None = None) -> ModelAnalysis:
    """Place, estimate epochs and memory for an already loaded model."""
    loaded = model_or_loaded if isinstance(model_or_loaded, LoadedModel) else LoadedModel(
        path=path or Path("<memory>"), model=model_or_loaded, opset=_opset(model_or_loaded))
    view = GraphView(loaded.model)
    placement = place(view, profile)
    estimate = estimate_epochs(view, placement, profile)
    from .npu.placement import QuantDomain

    memory = estimate_memory(view, placement, QuantDomain(view, profile), pools)
    findings = list(placement.model_findings) + _model_findings(loaded, profile, memory)
    return ModelAnalysis(loaded.path, loaded, view, placement, estimate, memory, findings, profile)


def _opset(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def _model_findings(loaded: LoadedModel, profile: TargetProfile, memory: MemoryEstimate) -> list[Reason]:
    out: list[Reason] = []
    lim = profile.limits.get("max_opset")
    if lim is not None and loaded.opset > lim.value:
        out.append(Reason("max_opset", f"stedgeai reads models up to opset {lim.value}.",
                          f"the model uses opset {loaded.opset}", lim.tag, "compile_error"))
    for d in loaded.unresolved_dims:
        out.append(Reason("static_shape", "stedgeai needs static shapes; pin dynamic inputs with --input-shape NAME=1,3,224,224.",
                          d.describe(), "3P", "compile_error"))
    if not memory.fits_on_chip:
        out.append(Reason(
            "activations_on_chip",
            "Activations should fit the on-chip RAM pools; what spills to external RAM runs 5-20x slower "
            "(FastDepth went from 24.5 ms to 478 ms) and some firmware crashes.",
            f"estimated peak activations {memory.peak_activation_bytes / 1024:.0f} KiB against "
            f"{memory.onchip_bytes / 1024:.0f} KiB on-chip; {memory.external_bytes / 1024:.0f} KiB would spill",
            "OBS", "note"))
    if memory.unallocated_bytes:
        out.append(Reason(
            "memory_pools",
            "Activations and weights must fit the memory pools, or stedgeai aborts with 'Oauto did not find "
            "valid compile options' and 'total bytes left unallocated=N'.",
            f"an estimated {memory.unallocated_bytes:,} bytes fit no pool", "OBS", "compile_error"))
    return out


def analyze_path(path: str | os.PathLike[str], opts: AnalysisOptions, *, profile: TargetProfile | None = None,
                 pools=None) -> ModelAnalysis:
    profile = profile or resolve_profile(opts)
    max_opset = None
    loaded = load_model(path, input_shapes=opts.input_shapes, max_opset=max_opset)
    return analyze_model(loaded, profile=profile, pools=pools)


def collect_models(paths: Sequence[str | os.PathLike[str]], *, recursive: bool = True) -> list[Path]:
    """Expand files and folders into the list of .onnx files to audit (sorted, de-duplicated)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            pattern = "**/*" if recursive else "*"
            found = sorted(q for q in p.glob(pattern) if q.is_file() and q.suffix.lower() in ONNX_SUFFIXES
                           and not q.name.endswith(".nafix.onnx"))
            if not found:
                log.warning("%s: no .onnx files found", p)
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


def audit(paths: Sequence[str | os.PathLike[str]], opts: AuditOptions = AuditOptions(), *,
          progress: Callable[[int, int, Path], None] | None = None) -> AuditResult:
    """Audit every model under ``paths``; an unreadable model becomes an error row, not an abort."""
    if not paths:
        raise UsageError("give at least one model file or folder to audit.")
    profile = resolve_profile(opts.analysis)
    pools = resolve_pools(opts.analysis)
    files = collect_models(paths, recursive=opts.recursive)
    if not files:
        raise InputError(f"no .onnx model found under {', '.join(str(p) for p in paths)}.")
    rows: list[ModelAudit] = []
    for i, f in enumerate(files):
        if progress:
            progress(i, len(files), f)
        try:
            rows.append(ModelAudit(f, analysis=analyze_path(f, opts.analysis, profile=profile, pools=pools)))
        except NafixError as exc:
            rows.append(ModelAudit(f, error=exc.message))
        except Exception as exc:  # noqa: BLE001 - one broken model must not abort a zoo audit
            log.debug("unexpected error on %s", f, exc_info=True)
            rows.append(ModelAudit(f, error=f"{f}: nafix could not analyse this model ({type(exc).__name__}: {exc})."))
    if progress:
        progress(len(files), len(files), files[-1])
    return AuditResult(rows)
