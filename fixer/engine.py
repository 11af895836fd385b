"""The rule engine: apply rules to a fixed point, resolve overlaps, report changes and near-misses.

One round: place the current model, then for each rule (in id order) and each node of the rule's
anchor ops, evaluate ``match.when``. The first condition is the trigger (the problem the rule fixes);
if it holds and a later precondition fails, the rule is a near-miss on that node. When all hold, the
rewriter rebuilds the node through an :class:`~fixer.graph.Editor`. A node, its producers and its
consumers are claimed by the first rule that rewrites there, so two rewrites never overlap within a
round. After the round the graph is cleaned up and sorted once, exported, and shape-inferred (not
inferred where the rewriters provably typed every value they made as inference would:
:func:`typed_export`); rounds repeat until no rule applies (or ``max_rounds``). The engine is an
:class:`Engine` (rules, profile, options, memory pools and the banned changes); :func:`run_engine`
makes one and runs it.

The guard (on by default): the model a round produces is placed and estimated once; when it has
more estimated SW epochs than before the round, or as many and more epochs, the round is not kept.
The changes responsible are found by bisection over the round's changes (each trial re-runs the
round restricted to a subset, so a round that does not get worse costs one estimate and the search
only runs when one does), reported as near-misses with the reason, and the round is redone without
them. Rules that fix a compile error or a board hang are exempt. A whole-model rewriter (uint8 ->
int8) runs first in its round and alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import onnx
from . import ir

from .graph import Editor, GraphView, is_quantized, node_label
from .npu.estimate import EpochEstimate, estimate_epochs
from .npu.placement import place
from .npu.profile import TargetProfile
from .predicates import PREDICATES
from .predicates import fails_constraint as _FAILS_CONSTRAINT
from .rewriters import REWRITERS, IoChange, Match, NearMiss, RewriteResult
from .rules import Rule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    rule: str
    node: str
    op_type: str
    detail: str
    new_nodes: tuple[str, ...] = ()
    # int8 tensors right after the rewritten node (its QuantizeLinear outputs) that keep their names:
    # the gate checks the rule's contract there, where the rewrite's own error is visible
    boundary: tuple[str, ...] = ()
    contract: str | None = None  # a rewriter's per-change override of the rule's contract
    # the tensors the rewritten region reads (int8 tensors behind a DequantizeLinear where there is
    # one): the gate feeds them from the original model to check the rewrite on its own
    region_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class NearMissReport:
    rule: str
    node: str
    op_type: str
    reason: str
    # the estimated time (ms, nafix's cost model) of the model before and with the change, where the
    # guard measured both (a change it did not keep); else None
    ms_before: float | None = None
    ms_after: float | None = None
    # the estimated ms of the node's SW and hybrid epochs: at most what the rule could save there, for
    # a rule whose precondition failed; None where not estimated
    node_ms: float | None = None

    @property
    def ms_saved(self) -> float | None:
        """Estimated ms the change would save (negative: cost), where the guard measured it; else the
        node's estimated ms (the most a rewrite there could save); None when not estimated."""
        if self.ms_before is not None and self.ms_after is not None:
            return self.ms_before - self.ms_after
        return self.node_ms


@dataclass
class EngineResult:
    model: onnx.ModelProto
    changes: list[Change] = field(default_factory=list)
    near_misses: list[NearMissReport] = field(default_factory=list)
    io_changes: list[IoChange] = field(default_factory=list)
    provenance: dict[str, str] = field(default_factory=dict)
    rounds: int = 0
    # the placement and (with the guard) the estimate of ``model`` as the engine last placed it, before
    # :func:`stamp_provenance` marked the nodes it created
    placement: Any = None
    estimate: EpochEstimate | None = None
    # a graph view of ``model`` that no rewriter touched after it was made (else None)
    view: GraphView | None = None
    # estimated ms saved per rule that changed the model (the guard's estimates; empty without them)
    ms_saved: dict[str, float] = field(default_factory=dict)

    @property
    def rules_applied(self) -> list[str]:
        return sorted({c.rule for c in self.changes})

    @property
    def rules_ranked(self) -> list[tuple[str, float | None]]:
        """The rules that changed the model with their estimated ms saved, most saved first (rules
        without an estimate last, by id)."""
        return [(r, self.ms_saved.get(r)) for r in sorted(self.rules_applied, key=lambda r: _rank_key(
            self.ms_saved.get(r), r))]

    def changes_ranked(self) -> list[Change]:
        """The changes, the rules that saved the most estimated ms first (in order within a rule)."""
        order = {r: i for i, (r, _) in enumerate(self.rules_ranked)}
        return sorted(self.changes, key=lambda c: order.get(c.rule, len(order)))


def _rank_key(ms: float | None, rule: str) -> tuple:
    return (ms is None, -(ms or 0.0), rule)


def rank_near_misses(near: Sequence[NearMissReport]) -> list[NearMissReport]:
    """Near-misses by estimated ms saved (:attr:`NearMissReport.ms_saved`), most first; those without
    an estimate last; the engine's order kept among equals."""
    return sorted(near, key=lambda n: (n.ms_saved is None, -(n.ms_saved or 0.0)))


def _neighbourhood(node: ir.Node) -> set[str]:
    names = {node.name}
    for t in node.inputs:
        for p in t.inputs:
            names.add(p.name)
    for t in node.outputs:
        for c in t.outputs:
            names.add(c.name)
    return names


def export_like(graph: ir.Graph, template: onnx.ModelProto) -> onnx.ModelProto:
    """Export ``graph`` keeping the template model's IR version, opsets, producer and metadata."""
    model = ir.export_onnx(graph)
    model.ir_version = template.ir_version
    del model.opset_import[:]
    model.opset_import.extend(template.opset_import)
    model.producer_name = template.producer_name
    model.producer_version = template.producer_version
    model.domain = template.domain
    model.model_version = template.model_version
    model.doc_string = template.doc_string
    del model.metadata_props[:]
    model.metadata_props.extend(template.metadata_props)
    if template.functions:
        del model.functions[:]
        model.functions.extend(template.functions)
    return model


#: Whether a round whose new and changed values are typed as ONNX shape inference types them skips
#: that inference (:func:`typed_export`); False makes every round infer (tests compare the two).
SKIP_TYPED_INFERENCE = True


def typed_export(att: "_Attempt", template: onnx.ModelProto, inferred: dict | None = None) -> onnx.ModelProto:
    """The model of a round's edited graph, with the value_info ONNX shape inference gives it.

    Shape inference (:func:`reinfer`: it re-types every tensor) is skipped where the result is
    provably what it would give (:func:`_as_inferred`): the template's value_info is inference's own
    (every node output, in node order, each fully static), and every node the round created or
    changed has outputs whose dtype and shape the rewriter gave and inference gives alike (inferred
    on those nodes alone). ``inferred``: the templates already judged, ``{id: (template, verdict)}``
    (the caller's cache while the templates live)."""
    model = export_like(att.view.graph, template)
    if (SKIP_TYPED_INFERENCE and not att.io_changes and not att.whole_model and not att.view.has_subgraphs
            and att.value_edits == ir.VALUE_EDITS and _as_inferred(model, template, inferred, att.view.graph)):
        return model
    return reinfer(model)


_SHAPE_DATA = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})
_MINI_INIT_BYTES = 4096  # constants up to this size are given to the per-node inference with their values


def _static_type(tp: onnx.TypeProto) -> bool:
    tt = tp.tensor_type
    return (tp.HasField("tensor_type") and tt.elem_type != 0 and tt.HasField("shape")
            and all(d.HasField("dim_value") for d in tt.shape.dim))


def _inference_order(graph: onnx.GraphProto) -> list[str]:
    """The names ONNX shape inference writes value_info for, in its order, when it types them all:
    every node output that is not a graph output, in node order."""
    outs = {o.name for o in graph.output}
    return [o for n in graph.node for o in n.output if o and o not in outs]


def _holds_inferred(model: onnx.ModelProto) -> bool:
    """``model``'s value_info is what shape inference gives on its own: one entry per node output but
    the graph outputs, in node order (what filled a shape inference left unknown, a shape rule or
    an onnxruntime run, is appended after inference's entries). An entry inference typed only in
    part stays as it is: a node the round changed must read and write fully static types
    (:func:`_infers_alike`), and the others are typed as before."""
    g = model.graph
    return [vi.name for vi in g.value_info] == _inference_order(g)


def _as_inferred(model: onnx.ModelProto, template: onnx.ModelProto, inferred: dict | None, graph: ir.Graph) -> bool:
    """Give ``model`` (exported from a round on ``template``) the value_info shape inference would,
    without inferring the whole model, and say so; False (``model`` untouched) where that is not
    proven. Proven when: ``template`` holds inference's value_info (:func:`_holds_inferred`); the
    graph's inputs, outputs and functions are the template's; no constant was edited in place (the
    caller checks :data:`fixer.ir.VALUE_EDITS`); every value written by a node the round did not touch keeps the
    template's value_info; and the nodes that are not the template's node for node (created or
    edited by the round) are in the ONNX domain, write no shape data (int32/int64, which inference
    propagates), and shape inference run on them alone (their inputs typed as in ``model``) gives
    their outputs exactly the types ``model`` states. Every other node reads what it read in
    ``template``, so inference types it as it did there."""
    g, tg = model.graph, template.graph
    if model.functions or len(g.sparse_initializer) or tg.input != g.input or tg.output != g.output:
        return False
    known = inferred.get(id(template)) if inferred is not None else None
    if known is None or known[0] is not template:
        known = (template, _holds_inferred(template))
        if inferred is not None:
            inferred[id(template)] = known
    if not known[1]:
        return False
    before = {n.name: n for n in tg.node}
    changed = [n for n in g.node if before.get(n.name) != n]
    if len(changed) * 2 > len(g.node):
        return False  # (most of the graph: inferring the whole model is as quick)
    vis = {vi.name: vi for vi in g.value_info}
    order = _inference_order(g)
    if any(name not in vis for name in order):
        return False
    made = {o for n in changed for o in n.output}
    old = {vi.name: vi for vi in tg.value_info}
    if any(name not in made and old.get(name) != vis[name] for name in order):
        return False  # a value whose type a rewriter set on a node it left alone
    if changed:
        types = {**vis, **{o.name: o for o in g.output}}
        if not _infers_alike(model, changed, types, graph):
            return False
    if [vi.name for vi in g.value_info] != order:
        typed = [vis[name] for name in order]
        del g.value_info[:]
        g.value_info.extend(typed)
    return True


def _infers_alike(model: onnx.ModelProto, nodes: list, types: dict, graph: ir.Graph) -> bool:
    """ONNX shape inference on ``nodes`` alone (their other inputs typed as ``types`` states, the
    constants as ``graph`` holds them, small ones and shape data with their values) gives each
    output the type ``types`` holds for it, fully static and not shape data."""
    from onnx import helper, numpy_helper, shape_inference

    made: set[str] = set()
    for n in nodes:
        if n.domain not in ("", "ai.onnx") or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                  for a in n.attribute):
            return False
        for o in n.output:
            if o:
                vi = types.get(o)
                if vi is None or not _static_type(vi.type) or vi.type.tensor_type.elem_type in _SHAPE_DATA:
                    return False
                made.add(o)
    names = {n.name for n in nodes}
    ir_nodes = [n for n in graph.nodes if n.name in names]
    ins, consts, seen = [], [], set()
    for node in ir_nodes:
        for t in node.inputs:
            name = t.name
            if not name or name in made or name in seen:
                continue
            seen.add(name)
            if type(t) is ir.Constant:
                if t._sparse:
                    return False
                code = ir.dtype_to_onnx(t.dtype)
                if code in _SHAPE_DATA or t.nbytes <= _MINI_INIT_BYTES:
                    p = t.proto if not t._dirty else None
                    consts.append(p if p is not None else numpy_helper.from_array(np.asarray(t.values), name))
                else:
                    ins.append(helper.make_tensor_value_info(name, code, list(t.shape)))
                continue
            vi = types.get(name)
            if vi is None:
                vi = next((i for i in model.graph.input if i.name == name), None)
            if vi is None or not _static_type(vi.type):
                return False
            ins.append(vi)
    mini = onnx.ModelProto(ir_version=model.ir_version)
    mini.opset_import.extend(model.opset_import)
    mg = mini.graph
    mg.node.extend(nodes)
    mg.input.extend(ins)
    mg.initializer.extend(consts)
    mg.output.extend(onnx.ValueInfoProto(name=o) for n in nodes for o in n.output if o)
    try:
        out = shape_inference.infer_shapes(mini, strict_mode=True, data_prop=True)
    except Exception:  # noqa: BLE001 - inference that fails here is inference's to do on the whole model
        return False
    return all(o.type == types[o.name].type for o in out.graph.output)


def reinfer(model: onnx.ModelProto) -> onnx.ModelProto:
    """Refresh value_info after a rewrite (shape inference, plus an onnxruntime run where it gives up)."""
    from .shapes import refresh_shapes

    return refresh_shapes(model)


#: The promise the guard keeps, stated in the README, `nafix rules` and docs/RULES.md.
GUARANTEE = ("nafix never makes the estimate worse: a rewrite (or a round of rewrites) that would raise the "
             "estimated SW epochs is not kept, nor one that keeps them and raises the estimated epochs, nor one "
             "that raises the estimated time (ms, nafix's cost model) even while it lowers the SW epochs; it is "
             "reported as a near-miss with the reason. Epochs may go up only where SW epochs go down (a SW "
             "Conv split into HW chunks). Rules that fix a compile error or a board hang are exempt. With --quantize, "
             "the rewrites that only pay off once quantized (LSTM/GRU unrolling) are judged after quantization: "
             "the model is quantized without them too, and they are kept only when not estimated slower. The whole run "
             "is held to it too (the --quantize stage and every rule together, against the model given): a fixed "
             "model estimated worse than its input is not written (exit 1) unless --keep-failed, which marks it.")

#: Near-miss reason of a rewrite the guard dropped on a float model (no Q/DQ at all): there every op
#: runs in SW, so any node a rewrite adds is one more SW epoch until the model is quantized.
FLOAT_GUARD_REASON = "on a float model this rewrite only pays off after quantization: run with --quantize"


@dataclass
class _Attempt:
    """One engine round applied to a copy of the current model (kept or dropped as a whole)."""

    view: GraphView
    changes: list[Change] = field(default_factory=list)
    near: list[tuple[Rule, ir.Node, str]] = field(default_factory=list)
    io_changes: list[IoChange] = field(default_factory=list)
    provenance: dict[str, str] = field(default_factory=dict)
    touched: bool = False  # a rewriter ran on the view (and may have edited it, even if it gave up)
    created: list = field(default_factory=list)  # the nodes the round's rewriters created
    # ir.VALUE_EDITS when the round began: a constant edited in place makes it infer shapes anew
    value_edits: int = field(default_factory=lambda: ir.VALUE_EDITS)
    whole_model: bool = False  # a whole-model rewriter changed the model

    @property
    def keys(self) -> list[tuple[str, str]]:
        return [(c.rule, c.node) for c in self.changes]


def guard_exempt(rule: Rule) -> bool:
    """A rule that fixes a board hang or a compile error trades epochs for a model that runs at all
    (NAF008 adds a subsampling op to avoid the stride-2 depthwise hang): the guard does not hold it
    back."""
    from .npu.constraints import HAZARDS, REGISTRY

    return any(f in HAZARDS or (f in REGISTRY and REGISTRY[f].severity == "compile_error") for f in rule.fixes)


#: Relative tolerance on the estimated time: two estimates of the same work may differ by float
#: rounding (summing the epochs in another order), which is not a slower model.
MS_TOLERANCE = 1e-6


def _worse_counts(new, old) -> bool:
    """More estimated SW epochs, or as many and more epochs. Fewer SW epochs for more epochs in total
    is progress (one SW Conv of 257 channels becomes two HW chunks: a HW epoch costs a fraction of
    a SW epoch on the Cortex-M55)."""
    return new.sw_epochs > old.sw_epochs or (new.sw_epochs == old.sw_epochs and new.epochs > old.epochs)


def _ms(e) -> float | None:
    return getattr(e, "latency_ms", None)


def _slower(new, old) -> bool:
    """A higher estimated time (nafix's cost model, :mod:`fixer.npu.latency`) beyond float noise;
    False when either side was not estimated (a profile without latency data)."""
    a, b = _ms(new), _ms(old)
    return a is not None and b is not None and a > b * (1 + MS_TOLERANCE) + 1e-9


def _worse(new: EpochEstimate, old: EpochEstimate) -> bool:
    """Worse in epochs (:func:`_worse_counts`) or in estimated time (:func:`_slower`): a round that
    lowers the SW epochs but raises the estimated ms is not progress."""
    return _worse_counts(new, old) or _slower(new, old)


def _figures(before, after) -> str:
    """The estimated figures the guard compares, before -> after, as a phrase."""
    out = (f"estimated SW epochs {before.sw_epochs} -> {after.sw_epochs}, estimated epochs {before.epochs} -> "
           f"{after.epochs}")
    if _ms(before) is not None and _ms(after) is not None:
        out += f", estimated time {_ms(before):.3f} ms -> {_ms(after):.3f} ms"
    return out


def worse_than_input(before: EpochEstimate, after: EpochEstimate) -> str | None:
    """The guard's test (:func:`_worse`) applied to a whole fix, the quantize stage and every rule
    round together, against the model the user gave: None when ``after`` is not worse than
    ``before``, else what got worse, as a phrase with the estimated figures."""
    if not _worse(after, before):
        return None
    return _figures(before, after)


class Candidate(NamedTuple):
    """The model a round produced (cleaned up, sorted, exported, typed), its graph view, placement
    and (with the guard) estimate: the next round starts from it when the round is kept."""

    model: onnx.ModelProto
    view: GraphView
    placement: Any
    estimate: EpochEstimate | None


class Engine:
    """The rule engine for one set of rules on one target: the rules, the profile, the options the
    rewriters read, the memory pools of the estimated time, and, while a model is fixed, the banned
    changes (those the guard refused). :meth:`run` applies the rules to a fixed point; a round is
    :meth:`_round`, the model it produces :meth:`_commit`, a guard trial :meth:`_trial`.

    ``guard`` (the default): no round is kept that raises the estimated SW epochs or epochs, or the
    estimated time, of the model (:func:`_worse`); ``guard=False`` is for rewrites that prepare a
    float model for quantization. ``pools``: the memory pools of the estimated time (as the
    analysis's; default: the STM32N6's)."""

    def __init__(self, rules: Sequence[Rule], *, profile: TargetProfile, options: Mapping[str, Any] | None = None,
                 max_rounds: int = 8, guard: bool = True, pools=None,
                 on_round: Callable[[int, int], None] | None = None):
        self.rules = list(rules)
        self.profile = profile
        self.options = dict(options or {})
        self.max_rounds = max_rounds
        self.guard = guard
        self.pools = pools
        self.on_round = on_round
        self.exempt = {r.id for r in self.rules if guard_exempt(r)}
        # a whole-model rewriter (uint8 -> int8) runs first and, when it applies, alone in its round
        self._ordered = sorted(self.rules, key=lambda r: not REWRITERS[r.rewriter].whole_model)
        self.banned: set[tuple[str, str]] = set()
        # estimates of trial rounds on the current model, by the changes they were allowed to make
        # (:meth:`_trial`); emptied when a round is kept
        self._trials: dict[frozenset, EpochEstimate] = {}
        # the templates of this run judged to hold shape inference's value_info (typed_export)
        self._inferred: dict[int, tuple] = {}

    # -- a whole fix ---------------------------------------------------------------------------
    def run(self, model: onnx.ModelProto, *, start: tuple | None = None) -> EngineResult:
        """Apply the rules to ``model`` until nothing changes (or ``max_rounds``); never mutates ``model``.

        With the guard, when a round would get worse the changes responsible are found by bisection
        (rounds that do not get worse cost one estimate), reported as near-misses with the reason,
        and the round is redone without them.

        ``start``: (view, placement, estimate) of ``model`` already made (the analysis before the fix), so
        the engine does not import and place the same model again; the engine edits that view."""
        current = onnx.ModelProto()
        current.CopyFrom(model)
        result = EngineResult(model=current)
        seen_near: set[tuple[str, str]] = set()
        self.banned = set()
        self._inferred = {}
        float_model = not is_quantized(current)
        guard = self.guard
        if start is not None:
            view, placement, est = start[0], start[1], (start[2] if guard else None)
            view.model = current  # the engine's own copy: nothing it does reaches ``model``
        else:
            view = GraphView(current)
            placement = place(view, self.profile)
            est = self._estimate(view, placement) if guard else None
        rnd = 0
        att = None
        while rnd < self.max_rounds:
            rnd += 1
            att = self._round(view, placement)
            self._trials = {}
            if att.changes and guard:
                cand = self._commit(att, current)
                while _worse(cand.estimate, est) and (judged := [k for k in att.keys if k[0] not in self.exempt]):
                    self._ban_worst(att, judged, result, seen_near, current, placement, est, cand, float_model)
                    view = GraphView(current)  # a fresh view: the round edited the previous one
                    att = self._round(view, placement)
                    if not att.changes:
                        break
                    cand = self._commit(att, current)
                if att.changes:
                    self._credit(att, result, current, placement, est, cand.estimate)
            elif att.changes:
                cand = self._commit(att, current, estimate=False)
            advisable = _advisable(placement, est)
            for rule, node, reason in att.near:
                # advice follows the estimate: a near-miss only where the node has SW or hybrid epochs, or for
                # a rule that is not about SW epochs (a board hang, a compile error, a performance note)
                if node.name in advisable or not addresses_sw_epochs(rule):
                    _near(result, seen_near, rule, node, reason, _node_ms(est, node.name))
            result.rounds = rnd
            if self.on_round:
                self.on_round(rnd, len(att.changes))
            if not att.changes:
                break
            result.changes.extend(att.changes)
            result.io_changes.extend(att.io_changes)
            result.provenance.update(att.provenance)
            done = view
            current, view, placement, est = cand
            done.release()  # the round's edited view: its node/tensor cycles freed now, not by the collector
            result.model = current
        self._trials, self._inferred = {}, {}
        result.placement, result.estimate = placement, est
        # the last round ran on ``view`` (or, after the last round of ``max_rounds``, ``view`` is fresh)
        result.view = view if (att is None or att.view is not view or not att.touched) else None
        result.model = stamp_provenance(result.model, result.provenance)
        # one interface change per edge: a later rewrite of the same edge (NAF012 after NAF004) wins
        last: dict[tuple[str, str], IoChange] = {}
        for ch in result.io_changes:
            last.pop((ch.kind, ch.name), None)
            last[(ch.kind, ch.name)] = ch
        result.io_changes = list(last.values())
        result.near_misses = rank_near_misses(result.near_misses)
        return result

    # -- the guard -----------------------------------------------------------------------------
    def _ban_worst(self, att: "_Attempt", judged, result: EngineResult, seen_near: set, current, cur_place,
                   est: EpochEstimate, cand: Candidate, float_model: bool) -> None:
        """Find, by bisection, the changes of ``att`` that made the estimate worse than ``est``; ban
        them and report each as a near-miss with the estimated figures."""
        # a float model whose estimate shows each change's epochs directly: the bisection's
        # verdicts follow from them, without a trial round per half
        # (only when the round is worse in epochs: the deltas do not tell the estimated time)
        deltas = (_float_deltas(att, est, cand.estimate, cur_place, cand.placement)
                  if float_model and _worse_counts(cand.estimate, est) else None)
        if deltas is not None:
            def worse(half):
                d = sum(deltas[k] for k in half)
                return _worse_counts(_Counted(est.sw_epochs + d, est.epochs + d), est)
        else:
            def worse(half):
                return _worse(self._trial(current, cur_place, set(half)), est)
        for key in _find_bad(judged, worse):
            self.banned.add(key)
            ch = next(c for c in att.changes if (c.rule, c.node) == key)
            t_ms = None
            if float_model:
                reason = FLOAT_GUARD_REASON
            else:
                t_est = self._trial(current, cur_place, {key}, banned=self.banned - {key})
                t_ms = _ms(t_est)
                reason = (f"not kept: it would take the estimated SW epochs from {est.sw_epochs} to "
                          f"{t_est.sw_epochs} and the estimated epochs from {est.epochs} to {t_est.epochs}"
                          + (f" and the estimated time from {_ms(est):.3f} ms to {t_ms:.3f} ms"
                             if _ms(est) is not None and t_ms is not None else "")
                          + " (nafix never makes the estimate worse)")
            _near_named(result, seen_near, ch.rule, ch.node, ch.op_type, reason,
                        ms_before=_ms(est) if t_ms is not None else None, ms_after=t_ms)

    def _credit(self, att: "_Attempt", result: EngineResult, current, cur_place, est, cest) -> None:
        """The estimated ms a kept round saved (``est`` -> ``cest``), credited to its rules: the whole
        difference where one rule made every change, else each rule's trial round on its own (the
        rules of one round may share epochs: the shares need not add up to the round's)."""
        if _ms(est) is None or _ms(cest) is None:
            return
        by_rule: dict[str, set] = {}
        for k in att.keys:
            by_rule.setdefault(k[0], set()).add(k)
        for rule_id, keys in by_rule.items():
            after = cest if len(by_rule) == 1 else self._trial(current, cur_place, keys)
            result.ms_saved[rule_id] = result.ms_saved.get(rule_id, 0.0) + _ms(est) - _ms(after)

    def _trial(self, current: onnx.ModelProto, placement, only: set, *, banned: set | None = None) -> EpochEstimate:
        """The estimate of the round on ``current`` (``placement``: its placement) restricted to the
        changes ``only``, less ``banned`` (default: the engine's). A round with ``only`` skips every
        other change before it can claim a node, so its result depends on ``only`` less ``banned``
        alone: :attr:`_trials` remembers it by that set."""
        banned = self.banned if banned is None else banned
        key = frozenset(set(only) - banned)
        if key not in self._trials:
            att = self._round(GraphView(current), placement, only=only, banned=banned)
            self._trials[key] = self._commit(att, current).estimate
        return self._trials[key]

    def _estimate(self, view: GraphView, placement) -> EpochEstimate:
        """The guard's estimate: epochs and, where the profile has a cost model, the estimated time with
        the memory estimate under ``pools``, as the analysis before the fix makes it (like with like)."""
        from .analysis import timed_estimate
        from .npu.latency import latency_model

        if latency_model(self.profile) is None:
            return estimate_epochs(view, placement, self.profile)
        return timed_estimate(view, placement, self.profile, self.pools)[0]

    # -- one round -----------------------------------------------------------------------------
    def _commit(self, att: "_Attempt", current: onnx.ModelProto, *, estimate: bool = True) -> Candidate:
        """The model an attempt produced: cleaned up, sorted, exported, typed (:func:`typed_export`),
        placed (and estimated with ``estimate``); the placement serves the next round."""
        att.view.graph.cleanup(remove_unused_graph_inputs=False).toposort()
        cand = typed_export(att, current, self._inferred)
        cview = GraphView(cand)
        cplace = place(cview, self.profile)
        return Candidate(cand, cview, cplace, self._estimate(cview, cplace) if estimate else None)

    def _round(self, view: GraphView, placement, *, only: set[tuple[str, str]] | None = None,
               banned: set[tuple[str, str]] | None = None) -> "_Attempt":
        """One pass of every rule over ``view`` (whose graph it edits in place), skipping the banned
        changes (default: the engine's) and, with ``only``, every change not in it."""
        banned = self.banned if banned is None else banned
        profile, options = self.profile, self.options
        att = _Attempt(view)
        claimed: set[str] = set()
        failing = _FailingIndex(placement)
        for rule in self._ordered:
            rw = REWRITERS[rule.rewriter]
            if rw.whole_model and att.changes:
                break
            # a rule triggered by a failed constraint: only the nodes the placement fails on it can match
            trigger = failing.names(rule)
            if trigger is not None and not trigger:
                continue
            for node in list(view.nodes):
                if trigger is not None and node.name not in trigger:
                    continue
                if node.op not in rule.ops or node.name in claimed or not node.outputs:
                    continue
                key = (rule.id, node.name)
                if key in banned or (only is not None and key not in only):
                    continue
                match = Match(rule.id, node, view, placement, profile, rule.params, options)
                verdicts = []
                for cond in rule.when:
                    v = PREDICATES[cond.predicate].func(node, match, **cond.params)
                    verdicts.append(v)
                    if not v.ok:
                        break
                if verdicts and not verdicts[0].ok:
                    continue
                if not all(v.ok for v in verdicts):
                    att.near.append((rule, node, verdicts[-1].detail))
                    continue
                boundary = _boundary(view, node)
                region_in = []
                for t in node.inputs:
                    if not t.name or view.is_const_like(t):
                        continue
                    p = view.producer(t)
                    region_in.append(p.inputs[0].name if p is not None and p.op == "DequantizeLinear" else t.name)
                att.touched = True
                ed = Editor(view.graph, rule_id=rule.id, anchor=node, provenance=att.provenance,
                            taken=view.names_taken)  # one name set per view, not one graph walk per change
                neighbourhood = _neighbourhood(node)  # before the rewriter disconnects the anchor
                label, op = node.name, node.op
                try:
                    res: RewriteResult = rw.func(match, ed)
                except NearMiss as exc:
                    att.near.append((rule, node, str(exc)))
                    if rw.whole_model:
                        break  # the same whole-model rewrite from another anchor would fail the same way
                    continue
                claimed |= neighbourhood | {n.name for n in ed.created}
                att.created.extend(ed.created)
                att.changes.append(Change(rule.id, label, op, res.detail, tuple(n.name for n in ed.created),
                                          boundary if res.boundary else (), res.contract, tuple(region_in)))
                att.io_changes.extend(res.io_changes)
                if rw.whole_model:
                    att.whole_model = True
                    return att
        return att


def run_engine(
    model: onnx.ModelProto,
    rules: Sequence[Rule],
    *,
    profile: TargetProfile,
    options: Mapping[str, Any] | None = None,
    max_rounds: int = 8,
    on_round: Callable[[int, int], None] | None = None,
    guard: bool = True,
    start: tuple | None = None,
    pools=None,
) -> EngineResult:
    """``Engine(rules, ...).run(model, start=start)``: apply ``rules`` to ``model`` until nothing
    changes; never mutates ``model`` (see :class:`Engine`)."""
    return Engine(rules, profile=profile, options=options, max_rounds=max_rounds, guard=guard, pools=pools,
                  on_round=on_round).run(model, start=start)


def addresses_sw_epochs(rule: Rule) -> bool:
    """The rule fixes SW (or hybrid) epochs: some constraint it fixes puts a node in SW (an ``sw_op``,
    a graph-edge conversion, a requirement of severity ``sw``). The others fix a board hang, a compile
    error or a performance note of a node that runs on the NPU (NAF002, NAF008, NAF009, NAF011,
    NAF014, NAF015), so they may name a HW node."""
    from .npu.constraints import REGISTRY

    return any(f not in REGISTRY or REGISTRY[f].severity == "sw" for f in rule.fixes)


def _advisable(placement, est: EpochEstimate | None) -> set[str]:
    """The nodes a rule's advice may name: the SW nodes of ``placement`` and, with its estimate, the
    HW nodes the compiler lowers with SW or hybrid epochs of its own (a dilated Conv's SpaceToDepth
    and DepthToSpace). A node whose epochs are all HW (a Resize that already runs on the NPU, a
    Conv with only a performance note) is not one."""
    names = {n.name for n in placement.nodes if n.unit == "SW"}
    if est is not None:
        names.update(g.nodes[0] for g in est.groups if g.unit != "HW" and g.nodes)
    return names


def _find_bad(keys, worse) -> list[tuple[str, str]]:
    """The changes of a round that made the estimate worse, by bisection (``worse(half)``: whether
    the round with only the changes of ``half`` is worse than before it: a trial round, or on a float
    model the sum of each change's SW epochs, :func:`_float_deltas`): a half that is not worse on its
    own is kept, a worse half is split again. When neither half is worse on its own (the halves only
    get worse together), the whole group is dropped."""
    if len(keys) == 1:
        return list(keys)
    mid = len(keys) // 2
    out: list[tuple[str, str]] = []
    worse_halves = 0
    for half in (keys[:mid], keys[mid:]):
        if worse(half):
            worse_halves += 1
            out += _find_bad(half, worse)
    return out if worse_halves else list(keys)


def _float_deltas(att: _Attempt, est: EpochEstimate, cest: EpochEstimate, cur_place, cand_place) -> dict | None:
    """On a float model, the SW epochs each change of ``att`` adds (negative: removes), read off the
    estimates before (``est``, placement ``cur_place``) and after the whole round (``cest``,
    ``cand_place``); None unless they show it directly. They do when every epoch of both is the SW
    epoch of one node (nothing in HW, no hybrid, no epoch the compiler inserts, none shared by two
    nodes), every node of both models keeps its unit and epoch, every epoch that appeared is of a
    node one change created, every epoch that went is of a node one change rewrote, and the
    counts add up to the round's. Then a trial of any subset of the changes costs the epochs
    before plus the subset's: one SW epoch per SW node, nothing shared between changes."""
    from .npu.placement import SW

    for e in (est, cest):
        if e.hybrid_epochs or e.epochs != e.sw_epochs:
            return None
        if any(g.inserted or len(g.nodes) != 1 or g.unit != SW for g in e.groups):
            return None
    cur = {p.name: p.unit for p in cur_place.nodes}
    cand = {p.name: p.unit for p in cand_place.nodes}
    g_cur = [g.nodes[0] for g in est.groups]
    g_cand = [g.nodes[0] for g in cest.groups]
    if len(set(g_cur)) != len(g_cur) or len(set(g_cand)) != len(g_cand):
        return None
    in_cur, in_cand = set(g_cur), set(g_cand)
    if any(cur[n] != cand[n] or (n in in_cur) != (n in in_cand) for n in cur.keys() & cand.keys()):
        return None
    owner: dict[str, tuple[str, str]] = {}
    for c in att.changes:
        for n in c.new_nodes:
            owner[n] = (c.rule, c.node)
    anchor = {c.node: (c.rule, c.node) for c in att.changes}
    delta = {(c.rule, c.node): 0 for c in att.changes}
    for n in in_cand - cur.keys():
        if n not in owner:
            return None
        delta[owner[n]] += 1
    for n in in_cur - cand.keys():
        if n not in anchor:
            return None
        delta[anchor[n]] -= 1
    if sum(delta.values()) != cest.sw_epochs - est.sw_epochs:
        return None
    return delta


@dataclass(frozen=True)
class _Counted:
    """An estimate known by its two counts (what :func:`_worse` compares)."""

    sw_epochs: int
    epochs: int


class _FailingIndex:
    """The names of the nodes a placement fails on each constraint (or reason id), for the rules
    whose trigger (first condition) is ``fails_constraint``: that predicate holds on a node exactly
    when the placement has a reason or note of that constraint under the node's name (a node a
    rewrite created in the round is not placed; one that took a placed node's name reads that
    node's placement, in both). Read off the placement once per round, on first use, instead of
    one predicate call per node and rule."""

    def __init__(self, placement):
        self.placement = placement
        self._by_constraint: dict[str, set[str]] | None = None

    def names(self, rule: Rule) -> set[str] | None:
        """The node names ``rule``'s trigger can hold on, or None (its trigger is another predicate)."""
        if not rule.when or rule.when[0].predicate != "fails_constraint" \
                or PREDICATES["fails_constraint"].func is not _FAILS_CONSTRAINT:
            return None
        constraint = rule.when[0].params.get("constraint")
        if self._by_constraint is None:
            index: dict[str, set[str]] = {}
            for name, p in self.placement.by_name.items():
                for r in p.reasons + p.notes:
                    index.setdefault(r.constraint, set()).add(name)
            self._by_constraint = index
        return self._by_constraint.get(constraint, set())


def _boundary(view: GraphView, node: ir.Node) -> tuple[str, ...]:
    """The int8 tensors right after ``node``: its QuantizeLinear outputs, looking through one
    activation that alone reads its output (Conv -> Relu -> QuantizeLinear)."""
    from .npu.placement import ACTIVATIONS

    out: list[str] = []
    for t in node.outputs:
        cons = list(t.outputs)
        if len(cons) == 1 and cons[0].op in ACTIVATIONS and cons[0].outputs and not view.is_graph_output(t):
            cons = list(cons[0].outputs[0].outputs)
        out += [c.outputs[0].name for c in cons if c.op == "QuantizeLinear" and c.outputs]
    return tuple(out)


def _near_named(result: EngineResult, seen: set, rule_id: str, node: str, op: str, reason: str, *,
                ms_before: float | None = None, ms_after: float | None = None) -> None:
    key = (rule_id, node)
    if key in seen:
        return
    seen.add(key)
    result.near_misses.append(NearMissReport(rule_id, node, op, reason, ms_before, ms_after))


def _near(result: EngineResult, seen: set, rule: Rule, node: ir.Node, reason: str, node_ms: float | None = None) -> None:
    key = (rule.id, node.name)
    if key in seen:
        return
    seen.add(key)
    result.near_misses.append(NearMissReport(rule.id, node_label(node), node.op, reason, node_ms=node_ms))


def _node_ms(est: EpochEstimate | None, name: str) -> float | None:
    """The estimated ms of the SW and hybrid epochs of node ``name`` in ``est`` (None without a time)."""
    lat = getattr(est, "latency", None)
    if lat is None:
        return None
    ms = [lat.epoch_ms[i] for i, g in enumerate(est.groups) if g.unit != "HW" and name in g.nodes
          and i < len(lat.epoch_ms)]
    return sum(ms) if ms else None


def stamp_provenance(model: onnx.ModelProto, provenance: Mapping[str, str]) -> onnx.ModelProto:
    """Mark every node nafix created with its rule: ``doc_string`` (any IR) and, from IR 10, a
    ``nafix.rule`` metadata entry on the node."""
    if not provenance:
        return model
    for node in model.graph.node:
        rule = provenance.get(node.name)
        if rule is None:
            continue
        node.doc_string = f"nafix.rule={rule}"
        if model.ir_version >= 10 and hasattr(node, "metadata_props"):
            entry = next((p for p in node.metadata_props if p.key == "nafix.rule"), None)  # (one key once)
            if entry is None:
                entry = node.metadata_props.add()
                entry.key = "nafix.rule"
            entry.value = rule
    return model
