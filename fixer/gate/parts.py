"""The parts of a model the gate runs apart: what is provably equal to the original (:func:`proven_equal`),
the part of the fixed model below it (:func:`fixed_part`), the rewritten nodes alone on the original's values
(:func:`rewritten_part`), the isolated rewritten regions, and the runs of each (:class:`_PartRun`,
:class:`_RewrittenRun`, :class:`_WholeRun`)."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx

from ..rewriters import IoChange
from ..runtime import prepare_for_runtime
from . import runs
from .inputs import NP_TYPES
from .metrics import BoundaryCheck, _as_int8_if_shifted, _edge_in, _same_bits
from .runs import _merged, _renamed, _tensor_names, _with_outputs, session


@dataclass(frozen=True)
class Downstream:
    """The part of a model below some of its tensors: every node that reads them, directly or not,
    as a model of its own whose graph inputs are the tensors that part reads from above (``inputs``)."""

    model: onnx.ModelProto
    tensors: tuple[str, ...]  # the tensors it is below
    inputs: tuple[str, ...]  # what it reads from the rest of the model (graph inputs included)
    produced: frozenset[str]  # the tensors it computes

    def typed(self, examples: Sequence[np.ndarray], outputs: Sequence[str]) -> onnx.ModelProto:
        """The part with its graph inputs declared, typed like ``examples`` (one value per input), and
        ``outputs`` as its graph outputs."""
        from onnx import helper

        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in outputs)
        m.graph.input.extend(helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), None)
                             for t, v in zip(self.inputs, examples))
        if m.ir_version < 4:  # before IR 4 every initializer is also a graph input
            m.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                 for t in m.graph.initializer)
        return m


def _downstream(model: onnx.ModelProto, tensors: Sequence[str]) -> Downstream | None:
    """The :class:`Downstream` part of ``model`` below ``tensors`` (None where a node there holds a
    subgraph, which may read outer tensors by name: the whole model runs instead)."""
    reached = set(tensors)
    part = []
    for node in model.graph.node:  # topologically sorted (ONNX requires it)
        if any(i in reached for i in node.input if i):
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                return None
            part.append(node)
            reached.update(o for o in node.output if o)
    if not part:
        return None
    return _part(model, part, tensors)


def _part(model: onnx.ModelProto, part: Sequence[onnx.NodeProto], tensors: Sequence[str],
          inits: Mapping[str, onnx.TensorProto] | None = None) -> Downstream:
    """``part`` (nodes of ``model``, in its order) as a :class:`Downstream` model of its own: the
    initializers it reads kept, every other tensor it reads from the rest of the model an input
    (``inits``: ``model``'s initializers by name, the last of a name, where the caller has them)."""
    produced = {o for n in part for o in n.output if o}
    if inits is None:
        inits = {t.name: t for t in model.graph.initializer}
    read: dict[str, None] = {}  # in first-read order (a dict: a list's membership test is linear)
    for n in part:
        for i in n.input:
            if i and i not in produced:
                read.setdefault(i)
    inputs = tuple(i for i in read if i not in inits)
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    m.graph.name = model.graph.name
    m.graph.node.extend(part)
    m.graph.initializer.extend(inits[i] for i in read if i in inits)
    return Downstream(m, tuple(tensors), inputs, frozenset(produced))


def _subgraphs(model: onnx.ModelProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for n in model.graph.node for a in n.attribute)


def proven_equal(original: onnx.ModelProto, fixed: onnx.ModelProto, in_changes: Mapping[str, IoChange], *,
                 facts: _Facts | None = None) -> tuple[set[str], list[onnx.NodeProto]] | None:
    """The tensors of ``fixed`` that are provably equal to ``original``'s tensor of the same name
    when both models run on the same feed, and the nodes of ``fixed`` that are not proven (in the
    fixed model's order), in one topological pass. A tensor is proven when it is an initializer
    with the same bytes in both, a graph input declared alike in both whose interface no rule
    changed (not in ``in_changes``: both get the same feed), or an output of a node identical to the
    original's node of that output (op, domain, attributes, input and output names) whose inputs are
    all proven: onnxruntime computes a node from its inputs alone. None where the proof does not
    apply: subgraphs (If/Loop/Scan read outer tensors by name), different opsets or local functions,
    a name both graph input and initializer (a feed may override it). ``facts``: the gate's
    :class:`_Facts` of these models, where the caller has them."""
    if _subgraphs(original) or _subgraphs(fixed):
        return None
    opsets = [{(o.domain or "ai.onnx"): o.version for o in m.opset_import} for m in (original, fixed)]
    if opsets[0] != opsets[1]:
        return None
    if [f.SerializeToString() for f in original.functions] != [f.SerializeToString() for f in fixed.functions]:
        return None
    facts = facts or _Facts(original, fixed)
    o_inits = {t.name: t for t in original.graph.initializer}
    f_inits = facts.f_inits
    o_inputs = {vi.name: vi for vi in original.graph.input}
    f_inputs = {vi.name: vi for vi in fixed.graph.input}
    if set(o_inits) & set(o_inputs) or set(f_inits) & set(f_inputs):
        return None
    same: set[str] = set()
    for name, t in f_inits.items():
        if name in o_inits and o_inits[name].SerializeToString() == t.SerializeToString():
            same.add(name)
    for name, vi in f_inputs.items():
        if (name in o_inputs and name not in in_changes
                and o_inputs[name].type.SerializeToString() == vi.type.SerializeToString()):
            same.add(name)
    producer = facts.o.producer
    rest = []
    alike: set[int] = set()  # ids of the nodes of ``rest`` that are the original's node (:func:`_same_node`)
    for n, ins, outs in zip(facts.f.nodes, facts.f.reads, facts.f.writes):
        first = outs[0] if outs and outs[0] else next((o for o in outs if o), None)
        m = producer.get(first) if first is not None else None
        if m is not None and _same_node(m, n, ins, outs):
            if all(i in same for i in ins if i):
                same.update(o for o in outs if o)
                continue
            alike.add(id(n))
        rest.append(n)
    facts.alike = (rest, alike)
    return same, rest


#: The gate runs a part of the fixed model only when it holds at most this fraction of its nodes:
#: above, its own session costs about what the runs it saves do (the values are the same either way).
PART_MAX_FRACTION = 0.5


@dataclass(frozen=True)
class FixedPart:
    """What of the fixed model the gate runs: its unproven nodes (:func:`proven_equal`) as a model
    whose inputs are proven tensors (fed the original's values, ``frontier`` those the original's run
    must fetch) or the fixed model's graph inputs; every other wanted tensor is the original's."""

    part: Downstream
    same: frozenset[str]
    frontier: tuple[str, ...]
    graph_inputs: frozenset[str]


_UNSET = object()


def fixed_part(original: onnx.ModelProto, fixed: onnx.ModelProto, in_changes: Mapping[str, IoChange],
               wanted: Sequence[str], *, proof=_UNSET, facts: _Facts | None = None) -> FixedPart | None:
    """The :class:`FixedPart` that yields ``wanted`` tensors of ``fixed`` as running the whole fixed
    model would, or None where the whole model is to run (no proof, nothing proven, a part of more
    than half the nodes, a wanted tensor neither proven nor computed by the part). ``proof``: what
    :func:`proven_equal` returns for these models, where the caller has it; ``facts``: their
    :class:`_Facts`, likewise."""
    facts = facts or _Facts(original, fixed)
    if proof is _UNSET:
        proof = proven_equal(original, fixed, in_changes, facts=facts)
    if proof is None:
        return None
    same, rest = proof
    nodes = facts.f.nodes
    if not rest or len(rest) == len(nodes):
        return None
    keep = _with_constant_inputs(rest, same, facts.f_const, facts.f.producer)
    if len(keep) > PART_MAX_FRACTION * len(nodes) or len(keep) == len(nodes):
        return None
    part = _part(fixed, [n for n in nodes if id(n) in keep], (), facts.f_inits)
    f_inputs = frozenset(vi.name for vi in fixed.graph.input)
    if any(n not in same and n not in part.produced for n in wanted):
        return None
    if any(t not in same and t not in f_inputs for t in part.inputs):
        return None
    frontier = tuple(t for t in part.inputs if t not in f_inputs)
    return FixedPart(part, frozenset(same), frontier, f_inputs)


def _computed_from_initializers(model: onnx.ModelProto, reads: list[list[str]] | None = None,
                                writes: list[list[str]] | None = None) -> set[str]:
    """The initializers of ``model`` and the tensors computed from initializers alone (``reads`` and
    ``writes``: its nodes' input and output names, where the caller has them)."""
    const = {t.name for t in model.graph.initializer}
    if reads is None or writes is None:
        nodes = list(model.graph.node)
        reads, writes = [n.input[:] for n in nodes], [n.output[:] for n in nodes]
    for ins, outs in zip(reads, writes):  # topologically sorted
        if all(i in const for i in ins if i):
            const.update(o for o in outs if o)
    return const


def _with_constant_inputs(nodes: Sequence[onnx.NodeProto], same: set[str], const: set[str],
                          producer: Mapping[str, onnx.NodeProto]) -> set[int]:
    """The ids of ``nodes`` and of the nodes computing, from initializers alone, a proven tensor they
    read (e.g. a weight's DequantizeLinear): a part computes such a tensor again, by the same nodes
    from the same bytes, rather than having it fetched from the original's run and fed (fetching
    keeps every such tensor of the original's run apart, and copies it). ``const``:
    :func:`_computed_from_initializers` of the fixed model, ``producer``: its nodes by output."""
    keep = {id(n) for n in nodes}
    todo = [i for n in nodes for i in n.input if i and i in same and i in producer and i in const]
    while todo:
        n = producer[todo.pop()]
        if id(n) not in keep:
            keep.add(id(n))
            todo.extend(i for i in n.input if i and i in producer)
    return keep


#: The gate tries :func:`rewritten_part` only where the fixed model's nodes that differ from the
#: original's are at most this fraction of the nodes it runs otherwise (the part, or the whole fixed
#: model): else running them alone saves little.
REWRITTEN_MAX_FRACTION = 0.5
#: The ops where a model's time goes, for that comparison.
HEAVY_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MatMul", "MatMulInteger",
                       "QLinearMatMul", "Gemm", "LSTM", "GRU", "RNN", "Attention"})


@dataclass(frozen=True)
class RewrittenPart:
    """The nodes of the fixed model that differ from the original's (:func:`rewritten_part`), as a
    model fed the original's values of what they read; ``checked``: the tensors they compute that
    the rest of the fixed model or the gate reads (every one also a tensor of the original)."""

    part: Downstream
    checked: tuple[str, ...]


def _same_node(m: onnx.NodeProto | None, n: onnx.NodeProto, inputs: list[str] | None = None,
               outputs: list[str] | None = None) -> bool:
    """``n`` is ``m``: op, domain, attributes, input and output names (not what the inputs hold);
    ``inputs``, ``outputs``: ``n``'s input and output names, where the caller has read them."""
    return (m is not None and m.op_type == n.op_type and m.domain == n.domain
            and m.input[:] == (n.input[:] if inputs is None else inputs)
            and m.output[:] == (n.output[:] if outputs is None else outputs)
            and [a.SerializeToString() for a in m.attribute] == [a.SerializeToString() for a in n.attribute])


def rewritten_part(original: onnx.ModelProto, fixed: onnx.ModelProto, proof, wanted: Sequence[str],
                   io_changed: bool = False, replaces: Sequence[onnx.NodeProto] | None = None, *,
                   facts: _Facts | None = None) -> RewrittenPart | None:
    """The fixed model's unproven nodes (``proof`` from :func:`proven_equal`) that are not the
    original's node of the same output (or that read a fixed-model initializer or graph input not
    proven equal): the rewritten nodes. Fed the original's values of what they read, they compute the
    ``checked`` tensors; where each of those equals the original's tensor bit for bit on an input
    set, every tensor of the fixed model equals the original's of the same name on it: by induction
    in topological order, any other node is the original's node, and reads proven tensors, checked
    tensors or tensors of such nodes (onnxruntime computes a node from its inputs alone). The gate
    then needs the original's values only. None where that induction cannot be set up: no proof, a
    changed graph interface (``io_changed``), nothing rewritten, too many rewritten nodes, a tensor
    they read or a checked or ``wanted`` tensor that is not the original's. Too many: more than
    REWRITTEN_MAX_FRACTION of the nodes the gate runs otherwise (``replaces``: the part's, default the
    whole fixed model's), counting nodes that compute from more than initializers, and counting
    convolutions and matrix products alone (where most of the time goes). ``facts``: the gate's
    :class:`_Facts` of these models, where the caller has them."""
    if proof is None or io_changed:
        return None
    same, rest = proof
    facts = facts or _Facts(original, fixed)
    producer = facts.o.producer
    f_made = facts.f_made
    # (the nodes :func:`proven_equal` found to be the original's node, where it recorded them)
    known = facts.alike[1] if facts.alike is not None and facts.alike[0] is rest else None
    diff = [n for n in rest if not ((id(n) in known if known is not None else
                                     _same_node(producer.get(next((o for o in n.output if o), "")), n))
                                    and all(i in same or i in f_made for i in n.input if i))]
    nodes, reads, writes = facts.f.nodes, facts.f.reads, facts.f.writes
    heavy = lambda nodes: sum(1 for n in nodes if n.op_type in HEAVY_OPS)  # noqa: E731
    runs = nodes if replaces is None else list(replaces)
    if not diff or heavy(diff) > REWRITTEN_MAX_FRACTION * heavy(runs):
        return None
    const = facts.f_const
    # (the nodes whose input names ``names`` lists that compute from more than initializers)
    computing = lambda names: sum(1 for ins in names if any(i not in const for i in ins if i))  # noqa: E731
    if (computing([n.input[:] for n in diff])
            > REWRITTEN_MAX_FRACTION * computing(reads if replaces is None else [n.input[:] for n in runs])):
        return None
    ids = {id(n) for n in diff}
    # a tensor of the rewritten nodes that only QuantizeLinear nodes read (a QDQ model's Conv output):
    # those join them, and the quantized values are what is compared (float values that round alike
    # are no difference to the rest of the model)
    readers: dict[str, list] = {}
    for n, ins in zip(nodes, reads):
        for i in ins:
            if i:
                readers.setdefault(i, []).append(n)
    for n in list(diff):
        for o in n.output:
            rs = readers.get(o, [])
            if (o and rs and o not in wanted and all(r.op_type == "QuantizeLinear" and r.domain in ("", "ai.onnx")
                                                   and r.input[0] == o and o not in r.input[1:] for r in rs)):
                for r in rs:
                    if id(r) not in ids:
                        diff.append(r)
                        ids.add(id(r))
    keep = _with_constant_inputs(diff + _dequantized_reads(diff, ids, producer, same, const, facts.f.producer),
                                 same, const, facts.f.producer)
    part = _part(fixed, [n for n in nodes if id(n) in keep], (), facts.f_inits)
    o_made = facts.o_made
    o_inputs = {vi.name for vi in original.graph.input}
    # what the rewritten nodes read from the rest: proven graph inputs, or tensors of nodes that are
    # the original's (proven by the induction); either way the original computes them by that name
    if any(not ((t in same and t in o_inputs) or (t in f_made and t in o_made)) for t in part.inputs):
        return None
    outside = {i for n, ins in zip(nodes, reads) if id(n) not in ids for i in ins if i} | set(wanted)
    checked = tuple(o for n, outs in zip(nodes, writes) if id(n) in ids for o in outs if o and o in outside)
    if not checked or any(t not in o_made for t in checked):
        return None
    if any(t not in same and t not in f_made for t in wanted):
        return None
    return RewrittenPart(part, checked)


def _dequantized_reads(diff: Sequence[onnx.NodeProto], ids: set[int],
                       producer: Mapping[str, onnx.NodeProto], same: set[str], const: set[str],
                       f_producer: Mapping[str, onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The DequantizeLinear nodes of the fixed model (``f_producer``: its nodes by output) whose float
    activation the rewritten nodes ``diff`` (ids ``ids``) read, where such a node is the original's
    node of that tensor (``producer``: the original's nodes by output) with a proven scale and zero-point (in ``same``), and reads a tensor
    that a node computes in both models, no rewritten node among them, and not from initializers
    alone (``const``: those are :func:`_with_constant_inputs`'). In the rewritten nodes' part such a node computes the
    original's value of its output again, bit for bit (the same node on the original's int8 values
    and the same parameters; onnxruntime computes a node from its inputs alone): the part then reads
    the int8 tensor, and the original's run fetches that rather than the float one (onnxruntime's
    session costs grow faster than the graph with float activations fetched as outputs)."""
    made_by_diff = {o for n in diff for o in n.output if o}
    out: list[onnx.NodeProto] = []
    taken: set[int] = set()
    for n in diff:
        for i in n.input:
            d = f_producer.get(i) if i and i not in const else None
            if (d is None or id(d) in ids or id(d) in taken or d.op_type != "DequantizeLinear"
                    or d.domain not in ("", "ai.onnx") or not d.input or not _same_node(producer.get(i), d)):
                continue
            x = d.input[0]  # computed by a node in both models (a graph input stays the part's float input)
            if (not x or x not in f_producer or x not in producer or x in made_by_diff or x in const
                    or any(j and j not in same for j in d.input[1:])):
                continue
            taken.add(id(d))
            out.append(d)
    return out


#: The rewritten nodes' part runs in sessions of about this many nodes at most, each holding whole
#: regions (nodes that share a tensor other than an initializer stay together): onnxruntime's session
#: costs more per node the larger the graph (the 31k-node QDQ chain's part, 5,704 nodes in 713
#: regions: 0.36 s in one session, 0.15 s in ten). A part of this size or smaller: one session.
REWRITTEN_GROUP_NODES = 600


def _region_groups(part: Downstream, limit: int) -> list[list[int]] | None:
    """The nodes of ``part`` (their indices, in its order) in groups of whole regions, a group closed
    before it would pass ``limit`` nodes (a region larger than that is a group of its own); None
    where that makes one group."""
    nodes = part.model.graph.node
    if len(nodes) <= limit:
        return None
    inits = {t.name for t in part.model.graph.initializer}
    parent = list(range(len(nodes)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    first: dict[str, int] = {}  # tensor -> the first node that reads or computes it
    for k, n in enumerate(nodes):
        for t in itertools.chain(n.input, n.output):
            if t and t not in inits:
                a, b = root(first.setdefault(t, k)), root(k)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    regions: dict[int, list[int]] = {}  # by root, in the order of each region's first node
    for k in range(len(nodes)):
        regions.setdefault(root(k), []).append(k)
    groups: list[list[int]] = []
    cur: list[int] = []
    for members in regions.values():
        if cur and len(cur) + len(members) > limit:
            groups.append(sorted(cur))
            cur = []
        cur.extend(members)
    if cur:
        groups.append(sorted(cur))
    return groups if len(groups) > 1 else None


class _RewrittenRun:
    """The gate's runs of the rewritten nodes alone (:class:`RewrittenPart`), one input set at a time:
    sessions made on the first input set (the part's inputs typed by their values), one per group
    of whole regions (:func:`_region_groups`), or one for the whole part. Each node computes from
    its inputs alone, so the groups compute what the part's one session does."""

    def __init__(self, rp: RewrittenPart, group_nodes: int | None = None):
        self.rp = rp
        self.group_nodes = REWRITTEN_GROUP_NODES if group_nodes is None else group_nodes
        self.sess: list[tuple] | None = None  # (session, its inputs, its outputs) per group

    def _sessions(self, feed: Mapping[str, np.ndarray]) -> list[tuple]:
        part, checked = self.rp.part, list(self.rp.checked)
        groups = _region_groups(part, self.group_nodes)
        subs = []
        if groups is not None:
            nodes = part.model.graph.node
            for g in groups:
                sub = _part(part.model, [nodes[k] for k in g], ())
                outs = [t for t in checked if t in sub.produced]
                if not outs or any(t not in feed for t in sub.inputs):
                    subs = []  # a group computing nothing checked: the part runs whole
                    break
                subs.append((sub, outs))
        if not subs:
            subs = [(part, checked)]
        begun = [runs.begin_session(sub.typed([feed[t] for t in sub.inputs], outs)) for sub, outs in subs]
        return [(b.ready(), sub.inputs, outs) for b, (sub, outs) in zip(begun, subs)]

    def proven(self, vals: Mapping[str, np.ndarray]) -> bool:
        """Whether every checked tensor computed from ``vals`` (the original's values of this input
        set) is the original's, bit for bit: then the fixed model computes the original's values."""
        feed = {t: vals[t] for t in self.rp.part.inputs}
        if self.sess is None:
            self.sess = self._sessions(feed)
        got: dict[str, np.ndarray] = {}
        for sess, inputs, outs in self.sess:
            got.update(zip(outs, sess.run(outs, {t: feed[t] for t in inputs})))
        return all(_same_bits(vals[t], got[t]) for t in self.rp.checked)


#: The suffix of the isolated rewritten regions' tensor names where they share the part's session.
REGION = "__nafix_region"


class _PartRun:
    """The gate's runs of the fixed model below what is proven (:class:`FixedPart`), one input set at
    a time, with the isolated rewritten regions (:func:`_isolated_boundaries`, their tensors renamed)
    in the same session: one session for both, made on the first input set (the part's inputs typed
    by their values). A proven name is the original's value."""

    def __init__(self, fp: FixedPart, fixed: onnx.ModelProto, boundaries: Sequence[BoundaryCheck],
                 in_changes: Mapping[str, IoChange], names: Sequence[str]):
        self.fp, self.fixed, self.boundaries, self.in_changes = fp, fixed, list(boundaries), in_changes
        self.names = list(names)
        self.outs = [n for n in names if n not in fp.same]
        self.sess = None
        self.tensors: list[str] = []  # boundary tensors of the regions run in the part's session
        self.need: dict[str, type] = {}  # region input -> the dtype the region wants
        self.regions: dict[str, tuple[list, list]] = {}
        self.regions_ok = False  # the regions ran in this session on every input set so far

    def _build(self, feed: Mapping[str, np.ndarray], vals: Mapping[str, np.ndarray]) -> None:
        m = self.fp.part.typed([feed[t] for t in self.fp.part.inputs], self.outs)
        region = _region_model(self.fixed, self.boundaries, vals)
        if region is not None:
            try:
                sess = session(_merged(m, _renamed(region[0], REGION)))
                need = {i.name[:-len(REGION)]: NP_TYPES.get(i.type) for i in sess.get_inputs() if i.name.endswith(REGION)}
                if all(n in vals for n in need):
                    self.sess, self.tensors, self.need, self.regions_ok = sess, region[1], need, True
                    self.regions = {t: ([], []) for t in self.tensors}
                    return
            except Exception:  # noqa: BLE001 - the regions do not join the part: they run on their own
                pass
        self.sess = session(m)

    def run(self, ffeed: Mapping[str, np.ndarray], vals: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        feed = {t: ffeed[t] if t in self.fp.graph_inputs else vals[t] for t in self.fp.part.inputs}
        if self.sess is None:
            self._build(feed, vals)
        if self.regions_ok:
            rfeed = {n: _as_int8_if_shifted(vals[n], w) for n, w in self.need.items()}
            if any(k in self.in_changes for k in rfeed):
                rfeed = {k: _edge_in(v, self.in_changes[k]) if k in self.in_changes else v for k, v in rfeed.items()}
            try:
                res = self.sess.run(self.outs + [t + REGION for t in self.tensors],
                                    {**feed, **{k + REGION: v for k, v in rfeed.items()}})
            except Exception:  # noqa: BLE001 - maybe a region alone: the part runs on its own, the regions apart
                self.regions_ok, self.sess = False, None
                self.sess = session(self.fp.part.typed([feed[t] for t in self.fp.part.inputs], self.outs))
                return self.run(ffeed, vals)
            for t, g in zip(self.tensors, res[len(self.outs):]):
                g = np.asarray(g)
                self.regions[t][0].append(_as_int8_if_shifted(np.asarray(vals[t]), g.dtype.type).reshape(-1))
                self.regions[t][1].append(g.reshape(-1))
            res = res[:len(self.outs)]
        else:
            res = self.sess.run(self.outs, feed)
        got = dict(zip(self.outs, res))
        return [got[n] if n in got else vals[n] for n in self.names]

    def isolated(self) -> dict | None:
        """What :func:`_isolated_boundaries` returns, from this session's runs (None: not run here)."""
        if not self.regions_ok:
            return None
        return {t: (np.concatenate(r), np.concatenate(g)) for t, (r, g) in self.regions.items()}


class _WholeRun:
    """The gate's runs of the whole fixed model (where no :class:`FixedPart` applies) with the isolated
    rewritten regions (:func:`_isolated_boundaries`, their tensors renamed) in the same session, as
    :class:`_PartRun` has them in the part's: one session for both, which loads only where the fixed
    model does (the regions' tensors are apart from its own)."""

    def __init__(self, sess, tensors: list[str], need: dict[str, type], in_changes: Mapping[str, IoChange]):
        self.sess, self.tensors, self.need, self.in_changes = sess, tensors, need, in_changes
        self.regions: dict[str, tuple[list, list]] = {t: ([], []) for t in tensors}
        self.runs = 0  # input sets run so far

    @classmethod
    def build(cls, fixed: onnx.ModelProto, boundaries: Sequence[BoundaryCheck], extra: Sequence[str],
              keys: set[str], in_changes: Mapping[str, IoChange]) -> "_WholeRun | None":
        """The session, or None where the regions do not join the fixed model (``keys``: the names
        each input set's captured values hold, as :func:`_isolated_boundaries` reads them)."""
        region = _region_model(fixed, boundaries, dict.fromkeys(keys))
        if region is None:
            return None
        own = (_tensor_names(fixed) | {vi.name for vi in fixed.graph.input} | {vi.name for vi in fixed.graph.output}
               | {t.name for t in fixed.graph.initializer})
        if any(n.endswith(REGION) for n in own):
            return None
        try:
            sess = session(_merged(_with_outputs(fixed, extra), _renamed(region[0], REGION)))
        except Exception:  # noqa: BLE001 - the fixed model loads on its own (or fails the gate) and the regions apart
            return None
        need = {i.name[:-len(REGION)]: NP_TYPES.get(i.type) for i in sess.get_inputs() if i.name.endswith(REGION)}
        if not all(n in keys for n in need):
            return None
        return cls(sess, region[1], need, in_changes)

    def run(self, outs: list[str], ffeed: Mapping[str, np.ndarray], vals: Mapping[str, np.ndarray]) -> list:
        """``outs`` of the fixed model on ``ffeed``; the regions on ``vals`` (the original's values)."""
        rfeed = {n: _as_int8_if_shifted(vals[n], w) for n, w in self.need.items()}
        if any(k in self.in_changes for k in rfeed):
            rfeed = {k: _edge_in(v, self.in_changes[k]) if k in self.in_changes else v for k, v in rfeed.items()}
        res = self.sess.run(outs + [t + REGION for t in self.tensors],
                            {**ffeed, **{k + REGION: v for k, v in rfeed.items()}})
        for t, g in zip(self.tensors, res[len(outs):]):
            g = np.asarray(g)
            self.regions[t][0].append(_as_int8_if_shifted(np.asarray(vals[t]), g.dtype.type).reshape(-1))
            self.regions[t][1].append(g.reshape(-1))
        self.runs += 1
        return res[:len(outs)]

    def isolated(self) -> dict:
        return {t: (np.concatenate(r), np.concatenate(g)) for t, (r, g) in self.regions.items()}


def _toposort(nodes, available: set[str]) -> list:
    avail = set(available) | {""}
    out, pending = [], list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all(i in avail for i in n.input):
                out.append(n)
                avail.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):  # inputs produced nowhere (e.g. subgraph captures): keep order
            out.extend(rest)
            break
        pending = rest
    return out


def _isolated_boundaries(fixed, boundaries, captured, in_changes) -> dict:
    """For each boundary tensor, the fixed model's region evaluated on the ORIGINAL model's values of
    the tensors it reads (``captured``, one dict per input set), so a rewrite is judged on its own (not
    on differences from upstream rewrites). All regions are cut out as one model and run in one
    session (one per region only when that fails). Returns {tensor: (original values, fixed
    values)}; regions that cannot be cut out are left to the whole-model comparison."""
    from onnx.utils import Extractor

    out: dict = {}
    wanted = [b for b in boundaries if b.inputs]
    if not wanted or not captured:
        return out
    fixed_names = _tensor_names(fixed) | {i.name for i in fixed.graph.input}
    try:
        extractor = Extractor(prepare_for_runtime(fixed))
    except Exception:  # noqa: BLE001 - fall back to the whole-model comparison
        return out

    def run(group):
        ins = sorted({t for b in group for t in b.inputs if t in captured[0] and t in fixed_names})
        if not ins:
            return False
        tensors = [b.tensor for b in group]
        try:
            sess = session(extractor.extract_model(ins, tensors))
        except Exception:  # noqa: BLE001
            return False
        need = [i.name for i in sess.get_inputs()]
        if any(n not in captured[0] for n in need):
            return False
        want = {i.name: NP_TYPES.get(i.type) for i in sess.get_inputs()}
        ref: dict[str, list] = {t: [] for t in tensors}
        got: dict[str, list] = {t: [] for t in tensors}
        try:
            for vals in captured:
                feed = {n: _as_int8_if_shifted(vals[n], want[n]) for n in need}
                if any(k in in_changes for k in feed):
                    feed = {k: _edge_in(v, in_changes[k]) if k in in_changes else v for k, v in feed.items()}
                for t, g in zip(tensors, sess.run(tensors, feed)):
                    g = np.asarray(g)
                    ref[t].append(_as_int8_if_shifted(np.asarray(vals[t]), g.dtype.type).reshape(-1))
                    got[t].append(g.reshape(-1))
        except Exception:  # noqa: BLE001 - a region onnxruntime cannot run alone: whole-model comparison
            return False
        for t in tensors:
            out[t] = (np.concatenate(ref[t]), np.concatenate(got[t]))
        return True

    if not run(wanted):
        for b in wanted:
            run([b])
    return out


def _region_model(fixed: onnx.ModelProto, boundaries: Sequence[BoundaryCheck],
                  vals: Mapping[str, np.ndarray]) -> tuple[onnx.ModelProto, list[str]] | None:
    """All rewritten regions of :func:`_isolated_boundaries` cut out of ``fixed`` as one model, as its
    first attempt cuts them (``vals``: the first input set's captured values), and their boundary
    tensors; None where that attempt would not get as far as a session."""
    from onnx.utils import Extractor

    wanted = [b for b in boundaries if b.inputs]
    if not wanted:
        return None
    fixed_names = _tensor_names(fixed) | {i.name for i in fixed.graph.input}
    ins = sorted({t for b in wanted for t in b.inputs if t in vals and t in fixed_names})
    if not ins:
        return None
    tensors = [b.tensor for b in wanted]
    try:
        return Extractor(prepare_for_runtime(fixed)).extract_model(ins, tensors), tensors
    except Exception:  # noqa: BLE001
        return None


class _NodeNames:
    """A graph's nodes, each one's input and output names (``node.input[:]``, ``node.output[:]``)
    and each tensor's producer, each read off the graph once, when first asked for."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph

    @functools.cached_property
    def nodes(self) -> list[onnx.NodeProto]:
        """The nodes (each wrapper made once: the gate's walks read the lists)."""
        return list(self.graph.node)

    @functools.cached_property
    def reads(self) -> list[list[str]]:
        return [n.input[:] for n in self.nodes]

    @functools.cached_property
    def writes(self) -> list[list[str]]:
        return [n.output[:] for n in self.nodes]

    def names(self) -> tuple[list[list[str]], list[list[str]]]:
        """(:attr:`reads`, :attr:`writes`): :func:`begin_session`'s ``names``."""
        return self.reads, self.writes

    @functools.cached_property
    def producer(self) -> dict[str, onnx.NodeProto]:
        return {o: n for n, outs in zip(self.nodes, self.writes) for o in outs if o}


class _Facts:
    """What the gate's proof reads of the original and the fixed model (tensor names, producers,
    tensors computed from initializers alone), each read off the graphs once, when first asked for,
    rather than once per check. The models are not edited while the gate holds it."""

    def __init__(self, original: onnx.ModelProto, fixed: onnx.ModelProto):
        self.original, self.fixed = original, fixed
        #: each model's nodes, their names and producers (:class:`_NodeNames`)
        self.o, self.f = _NodeNames(original.graph), _NodeNames(fixed.graph)
        #: (the unproven nodes :func:`proven_equal` returned, the ids of those among them that are
        #: the original's node of the same output), or None: :func:`rewritten_part` reads it
        self.alike: tuple[list, set[int]] | None = None

    @functools.cached_property
    def f_inits(self) -> dict[str, onnx.TensorProto]:
        """The fixed model's initializers by name (the last of a name)."""
        return {t.name: t for t in self.fixed.graph.initializer}

    @functools.cached_property
    def o_made(self) -> set[str]:
        """:func:`_tensor_names` of the original."""
        return set(self.o.producer)

    @functools.cached_property
    def f_made(self) -> set[str]:
        """:func:`_tensor_names` of the fixed model."""
        return set(self.f.producer)

    @functools.cached_property
    def f_const(self) -> set[str]:
        """:func:`_computed_from_initializers` of the fixed model."""
        return _computed_from_initializers(self.fixed, self.f.reads, self.f.writes)
