"""The rule engine: apply rules to a fixed point, resolve overlaps, report changes and near-misses.

One round: place the current model, then for each rule (in id order) and each node of the rule's
anchor ops, evaluate ``match.when``. The first condition is the trigger (the problem the rule fixes);
if it holds and a later precondition fails, the rule is a near-miss on that node. When all hold, the
rewriter rebuilds the node through an :class:`~fixer.graph.Editor`. A node, its producers and its
consumers are claimed by the first rule that rewrites there, so two rewrites never overlap within a
round. After the round the graph is cleaned up and sorted once, exported, and shape-inferred; rounds
repeat until no rule applies (or ``max_rounds``).

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
from typing import Any, Callable, Mapping, Sequence

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

    @property
    def rules_applied(self) -> list[str]:
        return sorted({c.rule for c in self.changes})


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


def reinfer(model: onnx.ModelProto) -> onnx.ModelProto:
    """Refresh value_info after a rewrite (shape inference, plus an onnxruntime run where it gives up)."""
    from .shapes import refresh_shapes

    return refresh_shapes(model)


#: The promise the guard keeps, stated in the README, `nafix rules` and docs/RULES.md.
GUARANTEE = ("nafix never makes the estimate worse: a rewrite (or a round of rewrites) that would raise the "
             "estimated SW epochs is not kept, nor one that keeps them and raises the estimated epochs, nor one "
             "that raises the estimated time (ms, nafix's cost model) even while it lowers the SW epochs; it is "
             "reported as a near-miss with the reason. Epochs may go up only where SW epochs go down (a SW "
             "Conv split into HW chunks). Rules that fix a compile error or a board hang are exempt. The whole run "
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
    """Apply ``rules`` to ``model`` until nothing changes; never mutates ``model``.

    With ``guard`` (the default) no round is kept that raises the estimated SW epochs or epochs of the
    model: when a round would, the changes responsible are found by bisection (rounds that do not
    get worse cost one estimate), reported as near-misses with the reason, and the round is redone
    without them. ``guard=False`` is for rewrites that prepare a float model for quantization.

    ``start``: (view, placement, estimate) of ``model`` already made (the analysis before the fix), so
    the engine does not import and place the same model again; the engine edits that view.
    ``pools``: the memory pools of the estimated time (as the analysis's; default: the STM32N6's)."""
    current = onnx.ModelProto()
    current.CopyFrom(model)
    result = EngineResult(model=current)
    seen_near: set[tuple[str, str]] = set()
    options = dict(options or {})
    float_model = not is_quantized(current)
    banned: set[tuple[str, str]] = set()
    exempt = {r.id for r in rules if guard_exempt(r)}
    if start is not None:
        view, placement, est = start[0], start[1], (start[2] if guard else None)
        view.model = current  # the engine's own copy: nothing it does reaches ``model``
    else:
        view = GraphView(current)
        placement = place(view, profile)
        est = _estimate(view, placement, profile, pools) if guard else None
    rnd = 0
    att = None
    while rnd < max_rounds:
        rnd += 1
        att = _round(view, placement, rules, profile, options, banned=banned)
        if att.changes and guard:
            cand, cview, cplace, cest = _commit_candidate(att, current, profile, guard=True, pools=pools)
            # estimates of trial rounds on ``current``, by the changes they were allowed to make: the
            # bisection's single-change trials serve the near-miss reasons, and a retried round does
            # not estimate again a subset it already estimated
            trials: dict[frozenset, EpochEstimate] = {}
            cur_place = placement  # the placement of ``current`` (the round only edited its view)
            while _worse(cest, est) and (judged := [k for k in att.keys if k[0] not in exempt]):
                # a float model whose estimate shows each change's epochs directly: the bisection's
                # verdicts follow from them, without a trial round per half
                # (only when the round is worse in epochs: the deltas do not tell the estimated time)
                deltas = (_float_deltas(att, est, cest, cur_place, cplace)
                          if float_model and _worse_counts(cest, est) else None)
                if deltas is not None:
                    def worse(half, deltas=deltas):
                        d = sum(deltas[k] for k in half)
                        return _worse_counts(_Counted(est.sw_epochs + d, est.epochs + d), est)
                else:
                    def worse(half, cur_place=cur_place):
                        return _worse(_trial(current, rules, profile, options, banned, set(half), cur_place, trials, pools), est)
                bad = _find_bad(judged, worse)
                for key in bad:
                    banned.add(key)
                    ch = next(c for c in att.changes if (c.rule, c.node) == key)
                    if float_model:
                        reason = FLOAT_GUARD_REASON
                    else:
                        t_est = _trial(current, rules, profile, options, banned - {key}, {key}, cur_place, trials, pools)
                        reason = (f"not kept: it would take the estimated SW epochs from {est.sw_epochs} to "
                                  f"{t_est.sw_epochs} and the estimated epochs from {est.epochs} to {t_est.epochs}"
                                  + (f" and the estimated time from {_ms(est):.3f} ms to {_ms(t_est):.3f} ms"
                                     if _ms(est) is not None and _ms(t_est) is not None else "")
                                  + " (nafix never makes the estimate worse)")
                    _near_named(result, seen_near, ch.rule, ch.node, ch.op_type, reason)
                view = GraphView(current)  # a fresh view: the round edited the previous one
                att = _round(view, cur_place, rules, profile, options, banned=banned)
                if not att.changes:
                    break
                cand, cview, cplace, cest = _commit_candidate(att, current, profile, guard=True, pools=pools)
        elif att.changes:
            cand, cview, cplace, cest = _commit_candidate(att, current, profile, guard=False)
        advisable = _advisable(placement, est)
        for rule, node, reason in att.near:
            # advice follows the estimate: a near-miss only where the node has SW or hybrid epochs, or for
            # a rule that is not about SW epochs (a board hang, a compile error, a performance note)
            if node.name in advisable or not addresses_sw_epochs(rule):
                _near(result, seen_near, rule, node, reason)
        result.rounds = rnd
        if on_round:
            on_round(rnd, len(att.changes))
        if not att.changes:
            break
        result.changes.extend(att.changes)
        result.io_changes.extend(att.io_changes)
        result.provenance.update(att.provenance)
        done, (current, view, placement, est) = view, (cand, cview, cplace, cest)
        done.release()  # the round's edited view: its node/tensor cycles freed now, not by the collector
        result.model = current
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
    return result


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


def _estimate(view: GraphView, placement, profile: TargetProfile, pools) -> EpochEstimate:
    """The guard's estimate: epochs and, where the profile has a cost model, the estimated time with
    the memory estimate under ``pools``, as the analysis before the fix makes it (like with like)."""
    from .analysis import timed_estimate
    from .npu.latency import latency_model

    if latency_model(profile) is None:
        return estimate_epochs(view, placement, profile)
    return timed_estimate(view, placement, profile, pools)[0]


def _commit_candidate(att: _Attempt, current: onnx.ModelProto, profile: TargetProfile, *, guard: bool, pools=None):
    """The model an attempt produced: cleaned up, sorted, exported, shape-inferred, placed (and
    estimated with ``guard``); the placement serves the next round."""
    att.view.graph.cleanup(remove_unused_graph_inputs=False).toposort()
    cand = reinfer(export_like(att.view.graph, current))
    cview = GraphView(cand)
    cplace = place(cview, profile)
    cest = _estimate(cview, cplace, profile, pools) if guard else None
    return cand, cview, cplace, cest


def _trial(current, rules, profile, options, banned, only, placement, trials, pools=None) -> EpochEstimate:
    """The estimate of the round restricted to the changes ``only`` (``placement``: that of
    ``current``). A round with ``only`` skips every other change before it can claim a node, so its
    result depends on ``only`` less ``banned`` alone: ``trials`` remembers it by that set."""
    key = frozenset(set(only) - banned)
    if key not in trials:
        att = _round(GraphView(current), placement, rules, profile, options, banned=banned, only=only)
        trials[key] = _commit_candidate(att, current, profile, guard=True, pools=pools)[3]
    return trials[key]


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


def _round(view: GraphView, placement, rules: Sequence[Rule], profile: TargetProfile, options: Mapping[str, Any],
           *, banned: set[tuple[str, str]], only: set[tuple[str, str]] | None = None) -> _Attempt:
    """One pass of every rule over ``view`` (whose graph it edits in place)."""
    att = _Attempt(view)
    claimed: set[str] = set()
    failing = _FailingIndex(placement)
    # a whole-model rewriter (uint8 -> int8) runs first and, when it applies, alone in its round
    ordered = sorted(rules, key=lambda r: not REWRITERS[r.rewriter].whole_model)
    for rule in ordered:
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
            att.changes.append(Change(rule.id, label, op, res.detail, tuple(n.name for n in ed.created),
                                      boundary if res.boundary else (), res.contract, tuple(region_in)))
            att.io_changes.extend(res.io_changes)
            if rw.whole_model:
                return att
    return att


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


def _near_named(result: EngineResult, seen: set, rule_id: str, node: str, op: str, reason: str) -> None:
    key = (rule_id, node)
    if key in seen:
        return
    seen.add(key)
    result.near_misses.append(NearMissReport(rule_id, node, op, reason))


def _near(result: EngineResult, seen: set, rule: Rule, node: ir.Node, reason: str) -> None:
    key = (rule.id, node.name)
    if key in seen:
        return
    seen.add(key)
    result.near_misses.append(NearMissReport(rule.id, node_label(node), node.op, reason))


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
