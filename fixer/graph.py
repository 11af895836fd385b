"""The one facade over nafix's graph IR (:mod:`fixer.ir`) that the rest of nafix reads graphs through.

:class:`GraphView` answers the questions the placement model and the rules ask: who produces a
tensor, who consumes it, is it a constant (an initializer, a ``Constant`` node, or a subgraph the
compiler folds such as ``Shape`` of a static tensor), what are its shape and element type.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import onnx

from . import ir

#: Ops that only move or relabel data; the compiler folds them into their neighbours.
MOVEMENT_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
_INTS = (int, np.integer)


def quantized_ops(ops: Iterable[str]) -> bool:
    """Whether any of the op types ``ops`` is a QuantizeLinear/DequantizeLinear or a QLinear op: the
    one test of "is this model quantized?" (:func:`is_quantized`; placement's "model not quantized")."""
    return any(op in QDQ_OPS or op.startswith("QLinear") for op in ops)


def is_quantized(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s main graph has a QuantizeLinear/DequantizeLinear or QLinear op (a float
    model has none: every op runs in SW on the NPU)."""
    return quantized_ops(n.op_type for n in model.graph.node)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int | str | None, ...] | None
    dtype: np.dtype | None

    @property
    def static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) and d >= 0 for d in self.shape)

    @property
    def numel(self) -> int | None:
        if not self.static:
            return None
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


@contextlib.contextmanager
def gc_paused():
    """Pause Python's cyclic garbage collector while a block allocates a large object graph.

    An import builds several small objects per node and tensor (they reference each other); every
    few hundred allocations the collector would walk the older generations, so a 30,000-node
    import spent more time collecting than building, and more the larger the heap already was. The
    collector runs again after the block (nothing is leaked: unreachable cycles are collected then).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


#: Collector thresholds for a whole fix or audit (Python's default is 700, 10, 10): a young-generation
#: collection every 100,000 net allocations instead of every 700. Large graphs allocate millions of
#: small objects that all survive; each collection walks them again (a 31k-node fix: 53 s -> 35 s).
RELAXED_GC_THRESHOLDS = (100_000, 50, 100)


def relaxed_gc(func):
    """Run ``func`` with :data:`RELAXED_GC_THRESHOLDS` (restored afterwards, also on error)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        saved = gc.get_threshold()
        gc.set_threshold(*(max(a, b) for a, b in zip(RELAXED_GC_THRESHOLDS, saved)))
        try:
            return func(*args, **kwargs)
        finally:
            gc.set_threshold(*saved)

    return wrapper


def read_graph(model: onnx.ModelProto) -> ir.Graph:
    """The structure and constants of ``model`` for a one-pass query (who reads what, Q/DQ
    parameters): imported without the intermediate tensors' types and with the collector paused.
    Not for export (use :func:`fixer.ir.import_onnx` to edit a graph)."""
    with gc_paused():
        return ir.import_onnx(model, value_info=False)


def node_label(node: ir.Node) -> str:
    return node.name or f"{node.op} -> {node.outputs[0].name if node.outputs else '?'}"


class GraphView:
    """A read-only, topologically sorted view of an ONNX graph with producer/consumer lookups.

    Subgraphs (the bodies of If/Loop/Scan): :attr:`nodes` are the top-level nodes only. A node
    inside a subgraph that reads an outer-scope tensor shows up among that tensor's consumers (as
    :mod:`fixer.ir` records it); :meth:`owner` maps it to the top-level control-flow node that
    contains it, which is the node that really reads the tensor at run time.
    """

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        with gc_paused():
            self.graph = ir.import_onnx(model)
            self.graph.toposort()
        self.nested_owner = self._names_unique()
        self.input_names = frozenset(t.name for t in self.graph.inputs)
        self.output_names = frozenset(t.name for t in self.graph.outputs)
        self.folded = self._constant_foldable()

    def release(self) -> None:
        """Let go of the model now: the graph drops the protobuf references of its import (one table,
        not a walk of the graph), so the model's memory (weights included) is freed when the caller
        drops it, without waiting for the garbage collector to find the graph's node/tensor
        reference cycles (which hold only small objects then). The view is unusable afterwards."""
        graph = self.__dict__.get("graph")
        if graph is not None:
            graph.release()
        self.__dict__.clear()
        self.graph = None

    def _names_unique(self) -> dict[str, ir.Node]:
        """Give every node a unique name, subgraph nodes included (top-level names are kept first);
        returns the subgraph nodes' owners by name (:attr:`nested_owner`)."""
        top = self.graph.nodes
        nested = [(n, t) for t in top if _has_subgraph(t) for n in _nested_nodes(t)]
        unique_node_names(top + [n for n, _ in nested] if nested else top, sep="_", first=1)
        return {n.name: t for n, t in nested}

    def owner(self, node: ir.Node) -> ir.Node:
        """The top-level node that runs ``node``: itself, or the If/Loop/Scan whose subgraph holds it."""
        return self.nested_owner.get(node.name, node)

    @property
    def has_subgraphs(self) -> bool:
        return bool(self.nested_owner)

    @property
    def nodes(self) -> list[ir.Node]:
        return self.graph.nodes

    @cached_property
    def opset(self) -> int:
        """The model's default-domain opset (what the ops nafix builds may use)."""
        return ir.model_opset(self.model)

    # -- index: built on first use, kept current by add_node / remove_node -------------------
    @cached_property
    def by_name(self) -> dict[str, ir.Node]:
        return {n.name: n for n in self.graph.nodes}

    @cached_property
    def names_taken(self) -> set[str]:
        """Every tensor and node name of the graph, built once per view and shared by the round's
        :class:`Editor` s, which add the names they create: a new name costs a set lookup, not a
        walk of the whole graph per rewrite."""
        return set(self.graph.tensors()) | {n.name for n in self.graph.nodes}

    def add_node(self, node: ir.Node) -> None:
        """Record ``node``, already in the graph and wired (its producers recorded before it), in
        the index: names, subgraph owners and constant folding (which spreads to the nodes that
        read it). The index then matches a view built from the edited graph."""
        d = self.__dict__
        if "by_name" in d:
            self.by_name[node.name] = node
        if "names_taken" in d:
            self.names_taken.add(node.name)
            self.names_taken.update(t.name for t in (*node.inputs, *node.outputs) if t.name)
        if _has_subgraph(node):
            for n in _nested_nodes(node):
                self.nested_owner[n.name] = node
        # its readers were rewired to it: their folding is decided again too
        self.refresh_folded(node, *(c for t in node.outputs for c in t.outputs))

    def remove_node(self, node: ir.Node) -> None:
        """Forget ``node`` (call before disconnecting it; the nodes that read it are refreshed when
        they are rewired: :meth:`add_node` of what they read now, or :meth:`refresh_folded`).
        Names stay taken."""
        d = self.__dict__
        if "by_name" in d and self.by_name.get(node.name) is node:
            del self.by_name[node.name]
        for n in _nested_nodes(node) if _has_subgraph(node) else ():
            self.nested_owner.pop(n.name, None)
        self.folded.discard(node.name)

    def refresh_folded(self, *nodes: ir.Node) -> None:
        """Re-decide whether ``nodes`` (whose inputs changed) are folded at compile time, and their
        readers' wherever that changes."""
        stack = list(nodes)
        nested = self.nested_owner
        while stack:
            n = stack.pop()
            if n.name in nested:  # folding is decided for top-level nodes (on their own inputs)
                continue
            now = self._foldable(n, self.folded)
            if now == (n.name in self.folded):
                continue
            (self.folded.add if now else self.folded.discard)(n.name)
            stack.extend(c for t in n.outputs for c in t.outputs)

    # -- tensors ---------------------------------------------------------------------------
    @staticmethod
    def producer(t: ir.Tensor) -> ir.Node | None:
        return t.inputs[0] if t.inputs else None

    @staticmethod
    def consumers(t: ir.Tensor) -> list[ir.Node]:
        return list(t.outputs)

    def is_graph_input(self, t: ir.Tensor) -> bool:
        return t.name in self.input_names and not isinstance(t, ir.Constant)

    def is_graph_output(self, t: ir.Tensor) -> bool:
        return t.name in self.output_names

    def is_const(self, t: ir.Tensor) -> bool:
        if isinstance(t, ir.Constant):
            return True
        producers = t.inputs  # (the producer, inline: this runs for every tensor of every node)
        return bool(producers) and producers[0].name in self.folded

    def is_const_like(self, t: ir.Tensor) -> bool:
        """A constant, or a constant seen through QuantizeLinear/DequantizeLinear (a quantized weight)."""
        while not self.is_const(t):
            p = self.producer(t)
            if p is None or p.op not in QDQ_OPS or not p.inputs:
                return False
            t = p.inputs[0]
        return True

    @staticmethod
    def const_value(t: ir.Tensor) -> np.ndarray | None:
        """The value of a constant tensor when it is stored (initializer or Constant node)."""
        return const_value(t)

    @staticmethod
    def info(t: ir.Tensor) -> TensorInfo:
        shape = None
        if t.shape is not None:
            shape = tuple(d if isinstance(d, (int, np.integer)) and d >= 0 else (d if isinstance(d, str) else None)
                          for d in t.shape)
            shape = tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in shape)
        dtype = None
        if t.dtype is not None:
            try:
                dtype = np.dtype(t.dtype)
            except TypeError:
                dtype = None
        return TensorInfo(t.name, shape, dtype)

    @staticmethod
    def is_static(t: ir.Tensor) -> bool:
        """``info(t).static`` without building the TensorInfo: a known shape of non-negative integers."""
        shape = t.shape
        if shape is None:
            return False
        for d in shape:  # (a loop, not all() over a generator: this runs for most tensors of a graph)
            if not (isinstance(d, _INTS) and d >= 0):
                return False
        return True

    def activations(self, node: ir.Node) -> list[ir.Tensor]:
        """The named inputs of ``node`` that are not constant (:meth:`is_const`, inline: every
        analysis pass reads this for every node)."""
        folded = self.folded
        return [t for t in node.inputs
                if t.name and not (isinstance(t, ir.Constant) or (t.inputs and t.inputs[0].name in folded))]

    @staticmethod
    def activation_inputs(node: ir.Node, view: "GraphView") -> list[ir.Tensor]:
        # (an unnamed tensor is either an omitted Variable or a Constant: dropped either way)
        return view.activations(node)

    # -- walking through data movement -----------------------------------------------------
    def source(self, t: ir.Tensor) -> ir.Node | None:
        """The producer of ``t``, looking back through data-movement ops."""
        p = self.producer(t)
        while p is not None and p.op in MOVEMENT_OPS and p.inputs:
            t = p.inputs[0]
            p = self.producer(t)
        return p

    def source_tensor(self, t: ir.Tensor) -> ir.Tensor:
        p = self.producer(t)
        while p is not None and p.op in MOVEMENT_OPS and p.inputs:
            t = p.inputs[0]
            p = self.producer(t)
        return t

    def sinks(self, t: ir.Tensor, through: frozenset[str] = MOVEMENT_OPS) -> Iterator[tuple[ir.Node | None, ir.Tensor]]:
        """Consumers of ``t`` looking forward through ``through`` ops (data movement by default);
        ``(None, t)`` for graph outputs."""
        stack = [t]
        seen: set[str] = set()
        while stack:
            cur = stack.pop()
            if cur.name in seen:
                continue
            seen.add(cur.name)
            if self.is_graph_output(cur):
                yield None, cur
            for c in cur.outputs:
                if c.op in through:
                    stack.extend(c.outputs)
                else:
                    yield c, cur

    # -- constant folding ------------------------------------------------------------------
    def _constant_foldable(self) -> set[str]:
        """Nodes the compiler evaluates at compile time: all inputs constant, or Shape of a static tensor."""
        folded: set[str] = set()
        for node in self.graph.nodes:
            if self._foldable(node, folded):
                folded.add(node.name)
        return folded

    def _foldable(self, node: ir.Node, folded: set[str]) -> bool:
        op = node.op
        if op == "Constant":
            return True
        if op in ("Shape", "Size") and node.inputs and self.info(node.inputs[0]).static:
            return True
        if op in QDQ_OPS:
            # A Q/DQ of a constant is a weight; it stays visible so placement can call it folded.
            return False
        ins = [t for t in node.inputs if not _empty(t)]
        return bool(ins) and all(type(t) is ir.Constant or (t.inputs and t.inputs[0].name in folded) for t in ins)


def unique_node_names(nodes: Iterable, *, sep: str = "__nafix_", first: int = 0, name_unnamed: bool = True,
                      avoid_all: bool = False) -> int:
    """Give every node of ``nodes`` (IR nodes, or protobuf ones through :class:`ProtoNode`) a unique
    name, in order (earlier nodes keep theirs): a repeated name becomes ``<name><sep><k>`` (``k``
    from ``first``), an unnamed node ``<op>_<index>`` (left unnamed without ``name_unnamed``). A new
    name avoids the names already given, or with ``avoid_all`` every name of ``nodes``. Returns how
    many nodes were renamed. (The views: ``_1``, ``_2``...; the loader: the same, unnamed nodes left,
    avoiding all names; the models handed to onnxruntime: ``__nafix_0``..., as they always had.)"""
    nodes = list(nodes)
    seen: set[str] = set()
    avoid = {n.name for n in nodes if n.name} if avoid_all else seen
    renamed = 0
    for i, node in enumerate(nodes):
        name = node.name
        if name and name not in seen:
            seen.add(name)
            continue
        if not name and not name_unnamed:
            continue
        base = name or f"{node.op}_{i}"
        name, k = base, first
        while name in avoid:
            name = f"{base}{sep}{k}"
            k += 1
        node.name = name
        renamed += 1
        seen.add(name)
        avoid.add(name)
    return renamed


class ProtoNode:
    """A protobuf NodeProto seen with the IR's ``name`` / ``op`` (for :func:`unique_node_names`)."""

    __slots__ = ("p",)

    def __init__(self, p: onnx.NodeProto):
        self.p = p

    @property
    def name(self) -> str:
        return self.p.name

    @name.setter
    def name(self, value: str) -> None:
        self.p.name = value

    @property
    def op(self) -> str:
        return self.p.op_type


def const_value(t: ir.Tensor) -> np.ndarray | None:
    """The value of a constant tensor when it is stored (initializer or Constant node)."""
    if type(t) is ir.Constant:
        return np.asarray(t.values)
    p = t.inputs[0] if t.inputs else None
    if p is not None and p.op == "Constant":
        v = p.attrs.get("value")
        if isinstance(v, ir.Constant):
            return np.asarray(v.values)
        for key in ("value_float", "value_int"):
            if key in p.attrs:
                return np.asarray(p.attrs[key])
        for key in ("value_floats", "value_ints"):
            if key in p.attrs:
                return np.asarray(p.attrs[key])
    return None


def _nested_nodes(node: ir.Node) -> Iterator[ir.Node]:
    """Every node inside the subgraphs of ``node`` (recursively)."""
    for sub in node.subgraphs():
        for n in sub.nodes:
            yield n
            yield from _nested_nodes(n)


_has_subgraph = ir.has_subgraph


def _empty(t: ir.Tensor) -> bool:
    return type(t) is ir.Variable and not t.name


def attr(node: ir.Node, name: str, default=None):
    """Attribute ``name`` of ``node`` (``default`` when absent); strings as ``str``."""
    v = node.attrs.get(name, default)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, (list, tuple)):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return v


def iter_attrs(node: ir.Node) -> Iterable[tuple[str, object]]:
    return node.attrs.items()


# ------------------------------------------------------------------------------------------------
# Editing: the only way rewriters create nodes (names with provenance, unique names)
# ------------------------------------------------------------------------------------------------


def rewire(old: ir.Tensor, new: ir.Tensor) -> None:
    """Make every node that reads ``old`` read ``new`` instead (graph outputs are left alone)."""
    for consumer in list(old.outputs):
        for i, t in enumerate(consumer.inputs):
            if t is old:
                consumer.inputs[i] = new


class Editor:
    """Builds new nodes and tensors in a graph on behalf of one rule applied at one anchor node.

    Every node it creates is named ``<anchor>__nafix_<k>`` and recorded in ``provenance`` with the
    rule id, so the saved model says which rule made it. Rewriters build; they never search the
    graph and never clean it up (the engine does one cleanup + toposort per round).
    """

    def __init__(self, graph: ir.Graph, *, rule_id: str, anchor: ir.Node, provenance: dict[str, str],
                 taken: set[str] | None = None):
        """``taken``: the graph's names when the caller keeps them (``GraphView.names_taken``,
        shared and extended); otherwise they are collected from ``graph`` here."""
        self.graph = graph
        self.rule_id = rule_id
        self.anchor = anchor
        self.provenance = provenance
        if taken is None:
            taken = set(graph.tensors().keys()) | {n.name for n in graph.nodes}
        self._taken = taken
        self._next: dict[str, int] = {}  # base -> the first k name() has not tried yet
        self.created: list[ir.Node] = []

    def name(self, base: str | None = None) -> str:
        """``<base>__nafix_<k>`` with the smallest ``k`` not taken. Names are only ever added to the
        taken set, so the search for a base resumes after the last ``k`` it gave (a rewrite creating
        thousands of nodes, an unrolled GRU, made each name in time linear in the names before it)."""
        base = base or self.anchor.name
        k = self._next.get(base, 0)
        while True:
            cand = f"{base}__nafix_{k}"
            if cand not in self._taken:
                self._taken.add(cand)
                self._next[base] = k + 1
                return cand
            k += 1

    def const(self, values: np.ndarray, base: str | None = None) -> ir.Constant:
        return ir.Constant(self.name(base), np.array(values, order="C"))

    def var(self, dtype=None, shape=None, base: str | None = None) -> ir.Variable:
        return ir.Variable(self.name(base), dtype=dtype, shape=shape)

    def node(self, op: str, inputs: list, outputs: list | None = None, attrs: dict | None = None,
             *, dtype=None, shape=None, domain: str | None = None, base: str | None = None,
             at: int | None = None) -> ir.Node:
        """Create ``op`` reading ``inputs``; with no ``outputs`` one new variable is made. ``base``:
        the node's name base (the anchor's by default); ``at``: its index in the node list (the end
        by default; the engine sorts the graph after the round)."""
        if outputs is None:
            outputs = [self.var(dtype=dtype, shape=shape)]
        n = ir.Node(op=op, name=self.name(base), attrs=dict(attrs or {}), inputs=list(inputs), outputs=list(outputs),
                    domain=domain)
        if at is None:
            self.graph.nodes.append(n)
        else:
            self.graph.nodes.insert(at, n)
        self.provenance[n.name] = self.rule_id
        self.created.append(n)
        return n

    def replace_uses(self, old: ir.Tensor, new: ir.Tensor, *, keep_name: bool = True) -> None:
        """Make every reader of ``old`` read ``new``. If ``old`` is a graph output, ``new`` takes its
        place (and, with ``keep_name``, its name, so the model's interface keeps its names)."""
        rewire(old, new)
        for i, t in enumerate(self.graph.outputs):
            if t is old:
                if keep_name:
                    old_name = old.name
                    old.name = self.name(old_name + "_orig")
                    new.name = old_name
                self.graph.outputs[i] = new

    def remove(self, node: ir.Node) -> None:
        """Disconnect ``node``; the engine's cleanup drops it and whatever only it used."""
        node.inputs.clear()
        node.outputs.clear()


def qparams(node: ir.Node, value=const_value) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(scale, zero-point) of a QuantizeLinear/DequantizeLinear as stored, None where not constant;
    no zero-point input reads as uint8 zeros (ONNX's default). ``value``: how constants are read."""
    ins = node.inputs
    s = value(ins[1]) if len(ins) > 1 else None
    if len(ins) > 2 and ins[2].name:
        z = value(ins[2])
    else:
        z = None if s is None else np.zeros(np.shape(s), np.uint8)
    return s, z


def qdq_params(view: GraphView, node: ir.Node) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(scale, zero_point, axis) of a QuantizeLinear/DequantizeLinear with constant parameters."""
    scale = view.const_value(node.inputs[1])
    if scale is None:
        raise ValueError(f"'{node.name}' has a non-constant scale")
    if len(node.inputs) > 2 and node.inputs[2].name:
        zp = view.const_value(node.inputs[2])
        if zp is None:
            raise ValueError(f"'{node.name}' has a non-constant zero-point")
    else:
        zp = np.zeros_like(scale, dtype=np.uint8)
    axis = node.attrs.get("axis", 1) if np.asarray(scale).size > 1 else None
    return np.asarray(scale), np.asarray(zp), axis


@dataclass(frozen=True)
class QuantWeight:
    """A constant weight as the model stores it: integer values + DequantizeLinear parameters, or float."""

    tensor: ir.Tensor  # the tensor the op reads (DequantizeLinear output, or the constant itself)
    values: np.ndarray  # stored values (int8/int32 when quantized, float otherwise)
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None
    axis: int | None = None
    dq: ir.Node | None = None

    @property
    def quantized(self) -> bool:
        return self.dq is not None

    def dequantized(self) -> np.ndarray:
        if self.dq is None:
            return self.values.astype(np.float32)
        v = self.values.astype(np.float64)
        s = self.scale.astype(np.float64)
        z = self.zero_point.astype(np.float64)
        if self.axis is not None and s.size > 1:
            shape = [1] * v.ndim
            shape[self.axis] = -1
            s = s.reshape(shape)
            z = z.reshape(shape)
        return ((v - z) * s).astype(np.float32)


def read_weight(view: GraphView, t: ir.Tensor) -> QuantWeight | None:
    """The constant behind ``t``: directly, or through a DequantizeLinear of a constant."""
    v = view.const_value(t)
    if v is not None:
        return QuantWeight(t, v)
    p = view.producer(t)
    if p is not None and p.op == "DequantizeLinear":
        raw = view.const_value(p.inputs[0])
        if raw is None:
            return None
        scale, zp, axis = qdq_params(view, p)
        if axis is not None and axis < 0:
            axis += raw.ndim
        return QuantWeight(t, raw, scale, zp, axis, p)
    return None
