"""The result types nafix's API returns and its report renders: one model's analysis, an audit,
a fix, a compile comparison. Shared by :mod:`fixer.api`, :mod:`fixer.report_data` and the quantization
modules, so none of them imports another just for a type."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from .graph import GraphView
from .model_io import LoadedModel
from .npu.estimate import EpochEstimate
from .npu.memory import MemoryEstimate
from .npu.placement import SW, Placement, Reason
from .npu.profile import TargetProfile


@dataclass
class ModelAnalysis:
    """Everything nafix knows about one model without rewriting it."""

    path: Path
    loaded: LoadedModel
    view: GraphView | None  # None in an audit's rows (see :meth:`released`)
    placement: Placement
    estimate: EpochEstimate
    memory: MemoryEstimate
    findings: list[Reason]
    profile: TargetProfile

    def released(self) -> "ModelAnalysis":
        """This analysis without the model itself: the graph view is freed and ``loaded.model`` is
        None; what a report row shows (placement, estimate, memory, findings, load warnings) stays.
        An audit keeps one of these per model, so its memory does not grow with the folder."""
        if self.view is not None:
            self.view.release()
        return replace(self, view=None, loaded=replace(self.loaded, model=None))

    def sw_nodes(self) -> list[dict]:
        """The estimate's SW and hybrid epochs, by model node: one entry per SW node, and one per op the
        compiler inserts (its lowering) into a HW node. It is the one account the header totals, the
        per-node rows and the grouped reasons are all read from: every SW/hybrid epoch of the estimate
        belongs to exactly one entry, the one of the node it came from (the epoch's first node).
        ``epochs`` lists the indices of an entry's epochs, ``sw_epochs``/``hybrid_epochs`` count them: a
        node that makes several epochs (a MatMul with one Conv per head, a re-quantize per reader) counts
        each, a SW node run inside the SW epoch of another (the float prologue of a graph input) counts
        none and names that epoch in ``in_epoch``. ``from_nodes`` names the model node(s) of its
        epoch(s), ``reported_as`` the name(s) the report prints, ``unit`` SW or hybrid (per core
        version: the unit of its first epoch)."""
        own: dict[str, list] = {}  # SW node -> the SW/hybrid epochs it accounts for
        inside: dict[str, object] = {}  # SW node -> the epoch of another node it runs in
        inserted: dict[tuple[str, str], list] = {}  # (HW node, inserted op) -> its epochs
        by_name = self.placement.by_name
        for g in self.estimate.groups:
            if g.unit == "HW":
                continue
            first = g.nodes[0]
            p = by_name.get(first)
            if p is not None and p.unit == SW:
                own.setdefault(first, []).append(g)
            else:
                inserted.setdefault((first, g.reported_as), []).append(g)
            if not g.inserted:
                for other in g.nodes[1:]:
                    inside.setdefault(other, g)

        def counts(gs_) -> dict:
            return {"epochs": [g.index for g in gs_],
                    "sw_epochs": sum(1 for g in gs_ if g.unit == SW),
                    "hybrid_epochs": sum(1 for g in gs_ if g.unit != SW)}

        out = []
        for n in self.placement.nodes:
            if n.unit != SW:
                continue
            gs_ = own.get(n.name, [])  # its own epochs, or the ones its lowering made (nearest Resize)
            host = inside.get(n.name) if not gs_ else None
            out.append({
                "name": n.name,
                "op_type": n.op_type,
                "kernel": n.kernel,
                "role": n.role or None,
                "reasons": [r.text() for r in n.reasons],
                "constraints": [r.constraint for r in n.reasons],
                "tags": sorted({r.tag for r in n.reasons}),
                "unit": gs_[0].unit if gs_ else (host.unit if host is not None else SW),
                "reported_as": [g.reported_as for g in gs_],
                "from_nodes": sorted({m for g in (gs_ or ([host] if host is not None else [])) for m in g.nodes})
                or [n.name],
                **counts(gs_),
                **({"in_epoch": host.index} if host is not None else {}),
            })
        lows = self.profile.lowerings
        for (node, op), gs_ in inserted.items():
            g = gs_[0]
            low = lows.get(g.lowering)
            out.append({
                "name": f"{node}/{op}",
                "op_type": op,
                "kernel": None,
                "role": "inserted by stedgeai when lowering the node",
                "reasons": [f"stedgeai lowers '{node}' with an inserted {op} epoch ({low.source.strip() if low else ''}) "
                            f"[{low.tag if low else 'INF'}]"],
                "constraints": [f"lowering:{low.name}" if low else "lowering"],
                "tags": [low.tag if low else "INF"],
                "unit": g.unit,
                "reported_as": [x.reported_as for x in gs_],
                "from_nodes": [node],
                **counts(gs_),
            })
        return out

    def notes(self) -> list[dict]:
        return [
            {"name": n.name, "op_type": n.op_type, "note": r.text(), "constraint": r.constraint, "severity": r.severity}
            for n in self.placement.nodes for r in n.notes
        ]


@dataclass
class ModelAudit:
    """One model of an audit: its analysis (released: no graph view, no ModelProto) or an error."""

    path: Path
    analysis: ModelAnalysis | None = None
    error: str | None = None
    #: what ``--quantize`` is estimated to remove (:func:`fixer.quantize.gain.quantize_gain`), or None
    quantize: dict | None = None


@dataclass
class AuditResult:
    models: list[ModelAudit]

    @property
    def errors(self) -> list[ModelAudit]:
        return [m for m in self.models if m.error]

    @property
    def any_sw(self) -> bool:
        return any(m.analysis is not None and m.analysis.estimate.sw_epochs > 0 for m in self.models)


@dataclass
class FixResult:
    input: Path
    output: Path | None
    report_path: Path | None
    header_path: Path | None
    before: ModelAnalysis
    after: ModelAnalysis | None
    engine: "EngineResult"
    verification: "Verification | None"
    written: bool
    rules_run: list[str]
    warnings: list[str] = field(default_factory=list)
    compiled: "CompileComparison | None" = None
    quantization: dict | None = None  # what --quantize did and the accuracy it cost
    pre_engine: "EngineResult | None" = None  # rewrites applied before quantization (float models)
    advice: list[str] = field(default_factory=list)  # said once, before the details (float model: --quantize)
    #: A model imported from TFLite: the fixed model's outputs against the TFLite interpreter's on the
    #: import check's seeded inputs (None for ONNX input, or when the interface differs).
    source_check: list | None = None
    #: Why the fixed model was not written (or was, marked, with --keep-failed): its estimate is worse
    #: than the input's (the never-worse promise over the whole run); None when it is not worse.
    regression: str | None = None
    #: --quantize: why the quantized model's accuracy is refused (an output's cosine against the
    #: original below --min-cosine), a sentence; None when it is not (or nothing was quantized).
    accuracy_failure: str | None = None
    dry_run: bool = False  # nothing was meant to be written (--dry-run)
    #: what ``--quantize`` is estimated to remove from the model left (fixer.quantize.gain), or None
    quantize_estimate: dict | None = None
    #: the static input shape of --input-shape, written as a change of its own (its gate check), or None
    static_shape: dict | None = None

    @property
    def changed(self) -> bool:
        return bool(self.engine.changes) or self.quantization is not None or self.static_shape is not None

    @property
    def verified(self) -> bool:
        return self.verification is None or self.verification.ok

    @property
    def final(self) -> ModelAnalysis:
        return self.after or self.before

    @property
    def compile_errors(self) -> list:
        """Findings of the model nafix leaves (the written one, else the input) that make stedgeai fail."""
        return [r for r in self.final.findings if r.severity == "compile_error"]


@dataclass
class CompiledModel:
    label: str  # "before" | "after" | the model name
    model: Path
    result: "CompileResult"
    disagreements: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        r = self.result
        rep = r.report
        out: dict = {"ok": r.ok, "returncode": r.returncode, "duration_s": round(r.duration_s, 2),
                     "known_errors": [{"code": k.code, "cause": k.cause, "fix": k.fix, "evidence": k.evidence_line}
                                      for k in r.known_errors],
                     "problems": list(r.problems)}
        if rep is not None:
            out.update({"epochs": rep.epochs, "sw_epochs": rep.sw_epochs, "hybrid_epochs": rep.hybrid_epochs,
                        "hw_ratio": round(rep.hw_ratio, 4), "sw_ops": list(rep.sw_ops),
                        "memory": [{"pool": p.name, "used_bytes": p.used_bytes, "total_bytes": p.total_bytes,
                                    "weights_bytes": p.weights_bytes, "activations_bytes": p.activations_bytes}
                                   for p in rep.memory]})
        out["estimate_vs_real"] = self.disagreements
        return out


@dataclass
class CompileComparison:
    tool: Path
    version: str
    before: CompiledModel
    after: CompiledModel | None = None

    @property
    def improved(self) -> bool:
        """True when the real HW-epoch ratio increased, or was already 100 %."""
        b = self.before.result.report
        a = self.after.result.report if self.after is not None else None
        if b is not None and b.sw_epochs == 0 and not b.hybrid_epochs:
            return True
        if a is None:
            return False
        if b is None:
            return a is not None
        return a.hw_ratio > b.hw_ratio or (a.sw_epochs == 0 and not a.hybrid_epochs)

    def as_dict(self) -> dict:
        d = {"tool": str(self.tool), "version": self.version, "before": self.before.summary(),
             "improved": self.improved}
        if self.after is not None:
            d["after"] = self.after.summary()
        return d
