"""The rule engine: apply rules to a fixed point, resolve overlaps, report changes and near-misses.

One round: place the current model, then for each rule (in id order) and each node of the rule's
anchor ops, evaluate ``match.when``. The first condition is the trigger (the problem the rule fixes);
if it holds and a later precondition fails, the rule is a near-miss on that node. When all hold, the
rewriter rebuilds the node through an :class:`~fixer.graph.Editor`. A node, its producers and its
consumers are claimed by the first rule that rewrites there, so two rewrites never overlap within a
round. After the round the graph is cleaned up and sorted once, exported, and shape-inferred; rounds
repeat until no rule applies (or ``max_rounds``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import onnx
import onnx_graphsurgeon as gs

from .graph import Editor, GraphView, node_label
from .npu.placement import place
from .npu.profile import TargetProfile
from .predicates import PREDICATES
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

    @property
    def rules_applied(self) -> list[str]:
        return sorted({c.rule for c in self.changes})


def _neighbourhood(node: gs.Node) -> set[str]:
    names = {node.name}
    for t in node.inputs:
        for p in t.inputs:
            names.add(p.name)
    for t in node.outputs:
        for c in t.outputs:
            names.add(c.name)
    return names


def export_like(graph: gs.Graph, template: onnx.ModelProto) -> onnx.ModelProto:
    """Export ``graph`` keeping the template model's IR version, opsets, producer and metadata."""
    model = gs.export_onnx(graph, do_type_check=False)
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
    from .model_io import refresh_shapes

    return refresh_shapes(model)


def run_engine(
    model: onnx.ModelProto,
    rules: Sequence[Rule],
    *,
    profile: TargetProfile,
    options: Mapping[str, Any] | None = None,
    max_rounds: int = 8,
    on_round: Callable[[int, int], None] | None = None,
) -> EngineResult:
    """Apply ``rules`` to ``model`` until nothing changes; never mutates ``model``."""
    current = onnx.ModelProto()
    current.CopyFrom(model)
    result = EngineResult(model=current)
    seen_near: set[tuple[str, str]] = set()
    options = dict(options or {})
    for rnd in range(1, max_rounds + 1):
        view = GraphView(current)
        placement = place(view, profile)
        claimed: set[str] = set()
        changed = 0
        for rule in rules:
            rw = REWRITERS[rule.rewriter]
            for node in list(view.nodes):
                if node.op not in rule.ops or node.name in claimed or not node.outputs:
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
                    _near(result, seen_near, rule, node, verdicts[-1].detail)
                    continue
                boundary = tuple(c.outputs[0].name for t in node.outputs for c in t.outputs
                                 if c.op == "QuantizeLinear" and c.outputs)
                region_in = []
                for t in node.inputs:
                    if not t.name or view.is_const_like(t):
                        continue
                    p = view.producer(t)
                    region_in.append(p.inputs[0].name if p is not None and p.op == "DequantizeLinear" else t.name)
                ed = Editor(view.graph, rule_id=rule.id, anchor=node, provenance=result.provenance,
                            taken=view.names_taken)  # one name set per round, not per change
                neighbourhood = _neighbourhood(node)  # before the rewriter disconnects the anchor
                try:
                    res: RewriteResult = rw.func(match, ed)
                except NearMiss as exc:
                    _near(result, seen_near, rule, node, str(exc))
                    continue
                claimed |= neighbourhood | {n.name for n in ed.created}
                result.changes.append(Change(rule.id, node.name, node.op, res.detail,
                                             tuple(n.name for n in ed.created),
                                             boundary if res.boundary else (), res.contract,
                                             tuple(region_in)))
                result.io_changes.extend(res.io_changes)
                changed += 1
        result.rounds = rnd
        if on_round:
            on_round(rnd, changed)
        if not changed:
            break
        view.graph.cleanup(remove_unused_graph_inputs=False).toposort()
        current = reinfer(export_like(view.graph, current))
        result.model = current
    result.model = stamp_provenance(result.model, result.provenance)
    # one interface change per edge: a later rewrite of the same edge (NAF012 after NAF004) wins
    last: dict[tuple[str, str], IoChange] = {}
    for ch in result.io_changes:
        last.pop((ch.kind, ch.name), None)
        last[(ch.kind, ch.name)] = ch
    result.io_changes = list(last.values())
    return result


def _near(result: EngineResult, seen: set, rule: Rule, node: gs.Node, reason: str) -> None:
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
            entry = node.metadata_props.add()
            entry.key = "nafix.rule"
            entry.value = rule
    return model
