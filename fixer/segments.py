"""onnxruntime sessions of large graphs, made and run as consecutive segments.

Making an onnxruntime session costs more than linear time in the graph's size (onnxruntime 1.32, a
QDQ conv chain without graph optimizations: 0.11 s for 3,141 nodes, 2.4 s for 31,404 even with the
initializers kept in place, :func:`fixer.runtime.runtime_session`; the rest is spread over its
graph resolution, planning and allocator). A graph of :data:`SEGMENT_FROM` nodes or more is cut, in
topological order, into segments of about :data:`SEGMENT_NODES` nodes; each is a model of its own
(its nodes, the initializers they read, the value_info of what they make) whose inputs are the
graph inputs and the earlier segments' tensors it reads, declared as onnxruntime infers them in the
segment that makes them (:class:`SegmentedSession`). Run in order, the segments compute what the
whole graph computes, bit for bit: without graph optimizations onnxruntime computes each node from
its inputs alone, with the same kernel. Every node still loads in a session, against the types and
shapes its inputs have in the whole graph, so a node onnxruntime rejects is rejected here too (in
its segment's session).

What is not cut (:func:`plan` returns None; the caller makes one session as before): graphs below
:data:`SEGMENT_FROM` nodes, graphs with subgraphs (If, Loop, Scan read outer tensors implicitly),
sparse initializers, a graph input that is also an initializer (its value may be fed or not), a
graph input no node reads, a tensor made twice or read but never made, a cycle, a graph output that
no node makes. onnxruntime's own error is then the one reported for a graph it cannot load.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

#: Graphs with at least this many nodes are made and run as segments (every real model nafix was
#: measured on has fewer than 1,400 nodes; a GRU unrolled for --quantize may have 15,000).
SEGMENT_FROM = 8_000
#: Nodes per segment: about where a session's cost per node stops growing with the graph's size.
SEGMENT_NODES = 1_000
#: Threads that make segment sessions: a session's own, or those its caller shares between the
#: sessions it begins (:func:`shared_workers`), where two models' segments queue for the same threads.
SEGMENT_WORKERS = max(1, min(4, os.cpu_count() or 1))
#: Default-domain operators with subgraph attributes (other domains' nodes are read for them).
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


@dataclass(frozen=True)
class Plan:
    """How a graph is cut: ``segments`` (node indexes in topological order, per segment),
    ``inputs`` (per segment, in order: the tensors it reads that it does not make and that are not
    initializers), ``outputs`` (per segment: what it makes that a later segment reads or that is a
    graph output, ``extra`` of :func:`plan` included), ``last_read`` (tensor -> the last segment that
    reads it), ``reads`` and ``writes`` (per node: the names it reads and makes, empty names left
    out), ``initializers`` (per segment: the positions in the graph's initializer list of the
    initializers its nodes read, in the order they first read them; the last of a name)."""

    segments: list[list[int]]
    inputs: list[list[str]]
    outputs: list[list[str]]
    last_read: dict[str, int]
    reads: list[list[str]]
    writes: list[list[str]]
    initializers: list[list[int]]


def with_extra(outputs: list[str], extra: Sequence[str]) -> list[str]:
    """``outputs`` and then the names of ``extra`` not among them (each once)."""
    have = set(outputs)
    return outputs + [t for t in dict.fromkeys(extra) if t not in have]


def _named(lists: list[list[str]]) -> list[list[str]]:
    """``lists`` without empty names (a list with none is kept as it is)."""
    return [[t for t in names if t] if "" in names else names for names in lists]


def plan(model: onnx.ModelProto, *, extra: Sequence[str] = (),
         names: Callable[[], tuple[list[list[str]], list[list[str]]]] | None = None) -> Plan | None:
    """How ``model``'s graph is cut into segments, or None where it stays whole (see the module).

    ``extra``: tensors fetched as outputs beyond the graph's own (as if the graph declared them; a
    name no node makes keeps the graph whole, as a graph output no node makes does). ``names()``:
    (reads, writes), each node's input and output names (``node.input[:]``, ``node.output[:]``, empty
    names included), where the caller has read them already (the gate has); asked for only where the
    graph is large enough to be cut."""
    g = model.graph
    nodes = g.node
    if len(nodes) < max(SEGMENT_FROM, 2 * SEGMENT_NODES) or len(g.sparse_initializer):
        return None
    graph_inputs = [i.name for i in g.input]
    init_names = [t.name for t in g.initializer]
    inits = set(init_names)
    if inits.intersection(graph_inputs) or len(set(graph_inputs)) != len(graph_inputs):
        return None
    sub = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    for n in nodes:  # (node domains are rare: a custom one is asked for subgraph attributes)
        if n.op_type in _SUBGRAPH_OPS or (n.domain not in ("", "ai.onnx") and any(a.type in sub for a in n.attribute)):
            return None
    reads, writes = names() if names is not None else ([n.input[:] for n in nodes], [n.output[:] for n in nodes])
    reads, writes = _named(reads), _named(writes)
    producer = {o: k for k, outs in enumerate(writes) for o in outs}
    taken = inits.union(graph_inputs)
    if len(producer) != sum(map(len, writes)) or not taken.isdisjoint(producer):
        return None  # a tensor made twice, or made that is an initializer or graph input
    read = set().union(*reads)
    if not read.issubset(taken.union(producer)):
        return None  # read but never made: onnxruntime's error, from the whole graph
    graph_outputs = with_extra([o.name for o in g.output], extra)
    if not read.issuperset(graph_inputs) or any(o not in producer for o in graph_outputs):
        return None
    # each node's producer per input name (None: an initializer or a graph input)
    get = producer.get
    made_by = [list(map(get, ins)) for ins in reads]
    # depth-first post-order from the graph outputs (then from nodes nothing reached): each node
    # right after what it reads, so a weight's DequantizeLinear lands beside its Conv and few tensors
    # cross from one segment to another
    state = [0] * len(nodes)  # 0 not seen, 1 on the path, 2 placed
    order: list[int] = []
    roots = [producer[o] for o in graph_outputs] + list(range(len(nodes)))
    for root in roots:
        if state[root]:
            continue
        state[root] = 1
        stack = [(root, iter(made_by[root]))]
        while stack:
            k, it = stack[-1]
            for p in it:
                if p is None or state[p] == 2:
                    continue
                if state[p] == 1:
                    return None  # a cycle
                state[p] = 1
                stack.append((p, iter(made_by[p])))
                break
            else:
                stack.pop()
                state[k] = 2
                order.append(k)
    count = -(-len(order) // SEGMENT_NODES)
    size = -(-len(order) // count)
    segments = [order[i:i + size] for i in range(0, len(order), size)]
    seg_of = [0] * len(nodes)
    for s, idx in enumerate(segments):
        for k in idx:
            seg_of[k] = s
    init_at = {t: k for k, t in enumerate(init_names)}
    last_read: dict[str, int] = {}
    inputs: list[list[str]] = []
    initializers: list[list[int]] = []
    for s, idx in enumerate(segments):
        ins: dict[str, None] = {}
        read_inits: dict[int, None] = {}
        for k in idx:
            for t, p in zip(reads[k], made_by[k]):
                if p is None:
                    at = init_at.get(t)
                    if at is not None:
                        read_inits[at] = None
                        continue
                elif seg_of[p] == s:
                    continue
                ins[t] = None
                last_read[t] = s
        inputs.append(list(ins))
        initializers.append(list(read_inits))
    wanted = set(graph_outputs)
    outputs = [[] for _ in segments]
    for s, idx in enumerate(segments):
        for k in idx:
            for o in writes[k]:
                if o in wanted or last_read.get(o, -1) > s:
                    outputs[s].append(o)
    return Plan(segments, inputs, outputs, last_read, reads, writes, initializers)


_shared: contextvars.ContextVar = contextvars.ContextVar("nafix_segment_workers", default=None)


def _new_workers() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(SEGMENT_WORKERS, thread_name_prefix="nafix-segment")


def current_workers() -> concurrent.futures.ThreadPoolExecutor | None:
    """The threads of the innermost :func:`shared_workers` block of this thread, or None."""
    return _shared.get()


@contextlib.contextmanager
def shared_workers():
    """Within the block, every segmented session begun in this thread hands its segments to the same
    :data:`SEGMENT_WORKERS` threads (in the order they are begun); the threads end with the block:
    a session still being made is finished, one nobody waited for and not yet started is dropped
    (the block left early: an error, Ctrl-C), so nothing is left loading and no idle thread stays."""
    pool = _new_workers()
    token = _shared.set(pool)
    try:
        yield pool
    finally:
        _shared.reset(token)
        pool.shutdown(wait=True, cancel_futures=True)


_ELEM_TYPES = {name.lower(): value for name, value in onnx.TensorProto.DataType.items()}


def _value_info(arg) -> onnx.ValueInfoProto | None:
    """A ValueInfoProto of onnxruntime's NodeArg ``arg`` (None for what is not a tensor)."""
    t = arg.type or ""
    if not (t.startswith("tensor(") and t.endswith(")")):
        return None
    elem = _ELEM_TYPES.get(t[len("tensor("):-1])
    if elem is None:
        return None
    shape = arg.shape
    dims = None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape]
    return helper.make_tensor_value_info(arg.name, elem, dims)


class _Arg:
    """What onnxruntime's NodeArg says of a session's input or output (name, type, shape), kept
    after the session is gone."""

    __slots__ = ("name", "type", "shape")

    def __init__(self, arg):
        self.name, self.type, self.shape = arg.name, arg.type, arg.shape


class Loaded:
    """A segment's session made only to see that it loads: its inputs and outputs as onnxruntime
    described them. The session itself is dropped at once, so its memory is not held while the
    caller goes on (:class:`SegmentedSession` with ``keep`` False makes them again to run)."""

    __slots__ = ("_inputs", "_outputs")

    def __init__(self, sess):
        self._inputs = [_Arg(a) for a in sess.get_inputs()]
        self._outputs = [_Arg(a) for a in sess.get_outputs()]

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)


class Unsegmentable(Exception):
    """A boundary tensor onnxruntime does not describe as a tensor: the graph is made whole."""


def _typed(v: onnx.ValueInfoProto | None) -> bool:
    """``v`` declares a tensor with an element type (a segment input can be declared so)."""
    return v is not None and v.type.HasField("tensor_type") and v.type.tensor_type.elem_type != 0


def _dims(v: onnx.ValueInfoProto) -> list | None:
    """The shape ``v`` declares, as onnxruntime describes one (int, str or None per dimension)."""
    tt = v.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]


def _agrees(declared: onnx.ValueInfoProto, arg) -> bool:
    """Whether ``declared`` says of a tensor what onnxruntime inferred for it (NodeArg ``arg``): the
    same element type and, where onnxruntime knows a dimension's size, that size (and no size where
    it knows none), so the segment reading it sees what the whole graph's node would."""
    mine = _value_info(arg)
    if mine is None or mine.type.tensor_type.elem_type != declared.type.tensor_type.elem_type:
        return False
    theirs, ours = arg.shape, _dims(declared)
    if theirs is None or ours is None:
        return theirs is None and ours is None
    return len(theirs) == len(ours) and all(
        (o == t) if isinstance(t, int) else not isinstance(o, int) for o, t in zip(ours, theirs))


class _Parts:
    """What segments of ``model`` are made of: its header (IR version, opsets, functions) serialized;
    its graph's nodes, initializers and value_info by position, each serialized on its own where
    :func:`_wire_classes` can read them so (else, and for a graph protobuf cannot serialize whole,
    over 2 GiB, the messages themselves); and where each value_info is, by name (the last of a name,
    as a dict of them would hold; the plan has the initializers' positions)."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.header = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import,
                                      functions=model.functions).SerializeToString()
        self.vi_at = {v.name: k for k, v in enumerate(g.value_info)}
        #: the wire classes the parts are bytes of, or None (the parts are the messages)
        self.wire = _wire_classes()
        if self.wire is not None:
            try:
                parsed = self.wire[0].FromString(g.SerializeToString())
            except Exception:  # noqa: BLE001 - a graph over protobuf's 2 GiB: its messages, segment by segment
                self.wire = None
            else:
                self.nodes, self.initializers, self.value_info = parsed.node[:], parsed.initializer[:], parsed.value_info[:]
        if self.wire is None:
            self.nodes, self.initializers, self.value_info = g.node, g.initializer, g.value_info


_WIRE: list = []


def _wire_classes():
    """(GraphWire, ModelWire): message classes of the ONNX wire format whose GraphProto fields
    ``node``, ``initializer``, ``input``, ``output`` and ``value_info`` are kept as the bytes of each
    message and whose ModelProto field ``graph`` is bytes, or None where they cannot be made here.

    A segment is assembled from its parts' bytes (the same bytes protobuf writes for each message)
    without copying each node and initializer into a new message in Python: for a 31k-node graph
    ~0.15 s less per segmented model. A self-test decides they are usable: a model assembled so
    parses back equal to one built of the messages."""
    if _WIRE:
        return _WIRE[0]
    classes = None
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        field = descriptor_pb2.FieldDescriptorProto
        fdp = descriptor_pb2.FileDescriptorProto(name="nafix_segments/wire.proto", package="nafix_segments",
                                                 syntax="proto2")
        numbers = onnx.GraphProto.DESCRIPTOR.fields_by_name
        graph = fdp.message_type.add(name="GraphWire")
        graph.field.add(name="name", number=numbers["name"].number, label=field.LABEL_OPTIONAL,
                        type=field.TYPE_STRING)
        for name in ("node", "initializer", "input", "output", "value_info"):
            graph.field.add(name=name, number=numbers[name].number, label=field.LABEL_REPEATED,
                            type=field.TYPE_BYTES)
        fdp.message_type.add(name="ModelWire").field.add(
            name="graph", number=onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number,
            label=field.LABEL_OPTIONAL, type=field.TYPE_BYTES)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        graph_wire, model_wire = (message_factory.GetMessageClass(pool.FindMessageTypeByName(f"nafix_segments.{n}"))
                                  for n in ("GraphWire", "ModelWire"))
        # self-test
        probe = helper.make_model(helper.make_graph(
            [helper.make_node("Add", ["x", "w"], ["y"], name="n")], "probe",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, "n"])],
            [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 2])],
            [helper.make_tensor("w", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])],
            value_info=[helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])]),
            opset_imports=[helper.make_opsetid("", 13)])
        parts = graph_wire.FromString(probe.graph.SerializeToString())
        g = probe.graph
        header = onnx.ModelProto(ir_version=probe.ir_version, opset_import=probe.opset_import).SerializeToString()
        assembled = _assembled((graph_wire, model_wire), header, g.name, parts.node[:], parts.initializer[:],
                               parts.value_info[:], g.input, g.output)
        assert assembled == probe and assembled.SerializeToString() == probe.SerializeToString()
        classes = (graph_wire, model_wire)
    except Exception:  # noqa: BLE001 - segments are then built of the messages themselves
        classes = None
    _WIRE.append(classes)
    return classes


def _assembled(wire, header: bytes, name: str, nodes: list[bytes], initializers: list[bytes],
               value_info: list[bytes], inputs, outputs) -> onnx.ModelProto:
    """The model of ``header`` (a serialized ModelProto without its graph) whose graph ``name`` holds
    the serialized ``nodes``, ``initializers`` and ``value_info`` and the ValueInfoProtos ``inputs``
    and ``outputs``, assembled through the classes ``wire`` (:func:`_wire_classes`)."""
    return onnx.ModelProto.FromString(_assembled_bytes(wire, header, name, nodes, initializers, value_info,
                                                       inputs, outputs))


def _assembled_bytes(wire, header: bytes, name: str, nodes: list[bytes], initializers: list[bytes],
                     value_info: list[bytes], inputs, outputs) -> bytes:
    """:func:`_assembled`, serialized (the bytes it parses)."""
    graph_wire, model_wire = wire
    graph = graph_wire(name=name, node=nodes, initializer=initializers, value_info=value_info,
                       input=[v.SerializeToString() for v in inputs], output=[v.SerializeToString() for v in outputs])
    return header + model_wire(graph=graph.SerializeToString()).SerializeToString()


class SegmentedSession:
    """The graph of ``model`` cut as ``plan`` says, one onnxruntime session per segment, made by
    ``make(segment_model)``; answers ``get_inputs``, ``get_outputs`` and ``run`` as one session of
    the whole graph would (the same values, the same input and output descriptions).

    A segment's input made by an earlier segment is first declared as the graph's value_info (or
    output) declares that tensor: the constructor writes the segment models and hands each, as soon
    as it is written, to the threads of the caller's :func:`shared_workers` block (else to
    :data:`SEGMENT_WORKERS` threads of its own; onnxruntime makes a session outside the GIL), and
    returns. :meth:`ready` waits for them (the other methods call it) and checks each such
    declaration against what onnxruntime inferred for the tensor in the segment that makes it; where
    one differs (a stale or hand-written value_info), or where a tensor has no typed declaration,
    the segments are made again in order, each input declared as onnxruntime inferred it, as the
    whole graph's node would see it. The error of the first segment onnxruntime rejects, in graph
    order, is raised, once none is left loading.

    ``extra``: the tensors fetched as outputs beyond the graph's, as ``plan`` was given them (the
    session then answers as one of the model with those outputs added would, without the model
    being copied to add them)."""

    def __init__(self, model: onnx.ModelProto, cut: Plan, make: Callable[[onnx.ModelProto], object], *,
                 keep: bool = True, make_serialized: Callable[[bytes, int], object] | None = None,
                 extra: Sequence[str] = ()):
        g = model.graph
        self._plan, self._make, self._model = cut, make, model
        #: ``make_serialized(data, n)``: the session of the serialized segment ``data`` (``n``: at least
        #: the number of initializers and Constant nodes it holds), where segments are assembled as
        #: bytes (:func:`_wire_classes`): each is then handed over as the bytes it is assembled of,
        #: not parsed into a model that ``make`` would serialize again
        self._make_serialized = make_serialized
        #: False: each segment's session is dropped once made (:class:`Loaded`), so a graph that is
        #: only checked to load never holds all of them; :meth:`run` makes them again (as they were
        #: made: by the threads, or in order) and keeps them
        self._keep = keep
        self._declared_in = {i.name: i for i in g.input}
        self._declared_out = {o.name: o for o in g.output}
        self._graph_inputs = [i.name for i in g.input]
        self._graph_outputs = with_extra([o.name for o in g.output], extra)
        self._output_names = set(self._graph_outputs)  # (their value_info is not the segment's)
        self._parts = _Parts(model)
        self._sessions: list | None = None
        self._futures: list = []
        self._own = None  # the threads of this session alone, where no caller shares its own
        # the inputs one segment reads from another
        self._crossing = [t for ins in cut.inputs for t in ins if t not in self._declared_in]
        # how each is declared: a typed graph output's declaration, else its value_info (the outputs
        # a caller adds to fetch inner tensors are names alone)
        self._declared: dict[str, onnx.ValueInfoProto] = {}
        vi_at = self._parts.vi_at
        for t in self._crossing:
            o = self._declared_out.get(t)
            if o is not None and _typed(o):
                self._declared[t] = o
            elif t in vi_at:
                self._declared[t] = g.value_info[vi_at[t]]
        self._ordered = False  # the segments were made in order (:meth:`_in_order`)
        if all(_typed(self._declared.get(t)) for t in self._crossing):
            self._begin()
        else:
            self._in_order()

    def _begin(self) -> None:
        """Hand every segment, its inputs declared as the graph declares them, to the threads."""
        pool = _shared.get()
        if pool is None:
            pool = self._own = _new_workers()
        self._futures = [pool.submit(self._load, s, self._segment_model(s, self._declared.get))
                         for s in range(len(self._plan.segments))]

    def _load(self, s: int, segment: onnx.ModelProto | bytes):
        """The session of segment ``s`` (``segment``: from :meth:`_segment_model`), or what it loaded
        as (:class:`Loaded`) where it is not kept."""
        if isinstance(segment, bytes):
            sess = self._make_serialized(segment, len(self._plan.initializers[s]) + len(self._plan.segments[s]))
        else:
            sess = self._make(segment)
        return sess if self._keep else Loaded(sess)

    def _segment_model(self, s: int, declare: Callable[[str], onnx.ValueInfoProto]) -> onnx.ModelProto | bytes:
        """Segment ``s`` as a model (serialized, where it is assembled of bytes and there is a
        ``make_serialized``); ``declare(t)``: how an input made by an earlier segment is declared."""
        cut, parts, declared_in, declared_out = self._plan, self._parts, self._declared_in, self._declared_out
        idx = cut.segments[s]
        name = f"{self._model.graph.name or 'graph'}_segment{s}"
        ins = [declared_in[t] if t in declared_in else declare(t) for t in cut.inputs[s]]
        outs = [declared_out[t] if t in declared_out else onnx.ValueInfoProto(name=t) for t in cut.outputs[s]]
        nodes = [parts.nodes[k] for k in idx]
        inits = [parts.initializers[k] for k in cut.initializers[s]]
        vi_at, vis = parts.vi_at, parts.value_info
        outputs = self._output_names
        made = [vis[vi_at[t]] for k in idx for t in cut.writes[k] if t in vi_at and t not in outputs]
        if parts.wire is None:
            m = onnx.ModelProto.FromString(parts.header)
            sg = m.graph
            sg.name = name
            sg.node.extend(nodes)
            sg.initializer.extend(inits)
            sg.input.extend(ins)
            sg.output.extend(outs)
            sg.value_info.extend(made)
            return m
        if self._make_serialized is not None:
            return _assembled_bytes(parts.wire, parts.header, name, nodes, inits, made, ins, outs)
        return _assembled(parts.wire, parts.header, name, nodes, inits, made, ins, outs)

    def _in_order(self) -> None:
        """Make the segments one after the other, each input made by an earlier segment declared as
        onnxruntime inferred it there (:class:`Unsegmentable` where that is not a tensor)."""
        args: dict[str, object] = {}

        def declare(t: str) -> onnx.ValueInfoProto:
            v = _value_info(args[t])
            if v is None:
                raise Unsegmentable(t)
            return v

        self._ordered = True
        sessions = []
        for s in range(len(self._plan.segments)):
            sess = self._load(s, self._segment_model(s, declare))
            for a in sess.get_outputs():
                args[a.name] = a
            sessions.append(sess)
        self._done(sessions)

    def ready(self) -> "SegmentedSession":
        """Wait for the segments' sessions (see the class); raise the first rejected segment's error."""
        if self._sessions is None:
            concurrent.futures.wait(self._futures)  # none left loading behind an error
            if self._own is not None:
                self._own.shutdown(wait=True)
                self._own = None
            futures, self._futures = self._futures, []
            made: dict[str, object] = {}  # tensor -> onnxruntime's NodeArg where its segment loaded
            for f in futures:
                if f.exception() is None:
                    made.update((a.name, a) for a in f.result().get_outputs())
            stale = any(t in made and not _agrees(self._declared[t], made[t]) for t in self._crossing)
            if stale:
                self._in_order()
            else:
                self._done([f.result() for f in futures])
        return self

    def _done(self, sessions: list) -> None:
        args: dict[str, object] = {}
        for sess in sessions:
            for a in sess.get_inputs():
                args.setdefault(a.name, a)
            for a in sess.get_outputs():
                args[a.name] = a
        self._inputs = [args[t] for t in self._graph_inputs]
        self._outputs = [args[t] for t in self._graph_outputs]
        self._input_names = set(self._graph_inputs)
        self._sessions = sessions

    def get_inputs(self):
        return list(self.ready()._inputs)

    def get_outputs(self):
        return list(self.ready()._outputs)

    def run(self, names: Sequence[str] | None, feed: Mapping[str, object], run_options=None) -> list:
        self.ready()
        if not self._keep:  # only checked to load so far: the sessions are made again (as before), kept now
            self._keep, self._sessions = True, None
            if self._ordered:
                self._in_order()
            else:
                self._begin()
                self.ready()
        graph_outputs = [o.name for o in self._outputs]
        names = graph_outputs if names is None else list(names)
        for t in feed:
            if t not in self._input_names:
                raise ValueError(f"Invalid input name: {t}")
        for t in names:
            if t not in graph_outputs:
                raise ValueError(f"Invalid output name:{t}")
        missing = [t for t in self._graph_inputs if t not in feed]
        if missing:
            raise ValueError(f"Required inputs ({missing}) are missing from input feed ({list(feed)}).")
        cut = self._plan
        wanted = set(names)
        # the segments whose outputs are wanted or read by a segment that runs, last to first
        runs = [False] * len(self._sessions)
        need = set(wanted)
        for s in range(len(self._sessions) - 1, -1, -1):
            if any(t in need for t in cut.outputs[s]):
                runs[s] = True
                need.update(cut.inputs[s])
        values = dict(feed)
        for s, sess in enumerate(self._sessions):
            if not runs[s]:
                continue
            outs = [t for t in cut.outputs[s] if t in need]
            got = sess.run(outs, {t: values[t] for t in cut.inputs[s]}, run_options)
            values.update(zip(outs, got))
            for t in cut.inputs[s]:  # what no later segment reads and nobody asked for
                if cut.last_read.get(t) == s and t not in wanted and t not in feed:
                    del values[t]
        return [values[t] for t in names]
