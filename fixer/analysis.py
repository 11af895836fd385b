"""Analysis of a loaded model without rewriting it: placement, epoch and memory estimates, and the
model-level findings (:func:`analyze_model`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from . import ir
from .graph import GraphView
from .model_io import LoadedModel
from .npu.estimate import EpochEstimate, estimate_epochs
from .npu.latency import estimate_latency
from .npu.memory import MemoryEstimate, estimate_memory
from .npu.placement import Reason, place, quant_domain
from .npu.profile import TargetProfile
from .results import ModelAnalysis


def analyze_model(model_or_loaded, *, profile: TargetProfile, pools=None, path: Path | None = None,
                  placed: tuple | None = None) -> ModelAnalysis:
    """Place, estimate epochs and memory for an already loaded model (``placed``: its graph view (or
    None), placement and estimate under ``profile``, already made, e.g. by the engine that produced it)."""
    loaded = model_or_loaded if isinstance(model_or_loaded, LoadedModel) else LoadedModel(
        path=path or Path("<memory>"), model=model_or_loaded, opset=ir.model_opset(model_or_loaded))
    view = placed[0] if placed is not None and placed[0] is not None else GraphView(loaded.model)
    domain = quant_domain(view, profile)  # one for placement and the memory estimate (it is read-only)
    if placed is not None:
        placement, estimate = placed[1:]
    else:
        placement = place(view, profile, domain=domain)
        estimate = None
    estimate, memory = timed_estimate(view, placement, profile, pools, domain=domain, estimate=estimate)
    findings = list(placement.model_findings) + _model_findings(loaded, profile, memory)
    return ModelAnalysis(loaded.path, loaded, view, placement, estimate, memory, findings, profile)


def timed_estimate(view: GraphView, placement, profile: TargetProfile, pools, *, domain=None,
                   estimate: EpochEstimate | None = None) -> tuple[EpochEstimate, MemoryEstimate]:
    """The epoch estimate (``estimate`` when already made) with its estimated time, and the memory
    estimate under ``pools`` the time is costed with: what the analysis reports, and what the engine's
    never-worse guard compares against it."""
    domain = quant_domain(view, profile) if domain is None else domain
    if estimate is None:
        estimate = estimate_epochs(view, placement, profile, domain=domain)
    memory = estimate_memory(view, placement, domain, pools)
    latency = estimate_latency(view, placement, estimate, memory, profile, pools)
    return (estimate if latency is None else dataclasses.replace(estimate, latency=latency)), memory


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
