"""nafix's graph IR: nodes, tensors and graphs over an ONNX model, built for speed.

The model the rest of nafix edits (through :class:`fixer.graph.GraphView` and
:class:`fixer.graph.Editor`): a :class:`Graph` of :class:`Node` s reading and writing
:class:`Tensor` s (:class:`Variable` or :class:`Constant`). The semantics are those nafix relied on
from onnx-graphsurgeon, which this module replaces:

- ``node.inputs`` / ``node.outputs`` and ``tensor.inputs`` (producers) / ``tensor.outputs``
  (consumers) are kept in sync: editing one side (``node.inputs[i] = t``, ``node.inputs.clear()``,
  a new :class:`Node` built with its tensors) updates the other.
- Tensors compare equal when their names are equal (and are not hashable); nodes compare by identity.
- Attribute values are Python values: ``int``, ``float``, ``str``, lists of those, a
  :class:`Constant` for a TENSOR attribute, a :class:`Graph` for a GRAPH attribute (the bodies of
  If/Loop/Scan). A node inside a subgraph that reads a tensor of an enclosing graph is one of that
  tensor's consumers.
- ``Variable.dtype`` is a numpy dtype (or the ONNX type number when numpy has none),
  ``Variable.shape`` a list of ``int`` / ``str`` (symbolic) / ``None`` (unknown), or ``None``.

What makes it fast: one pass over the protobuf to import; ``__slots__`` everywhere; a
:class:`Constant` keeps a reference to its ``TensorProto`` and decodes ``values`` only when asked
(reading ``dtype``, ``shape``, ``size`` or ``nbytes`` does not decode); export reuses the original
``TensorProto``, ``AttributeProto`` and ``ValueInfoProto`` of whatever did not change; toposort and
cleanup are linear in the size of the graph.

The protobuf references of one import live in one :class:`_Source` table: :meth:`Graph.release`
drops the table at once, so the model's memory is not held by the graph's node/tensor reference
cycles until the next full garbage collection.
"""

from __future__ import annotations

import weakref
from typing import Iterable, Iterator, Sequence

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

__all__ = ["Tensor", "Variable", "Constant", "Node", "Graph", "import_onnx", "export_onnx", "dtype_to_onnx"]

# ------------------------------------------------------------------------------------------------
# Element types
# ------------------------------------------------------------------------------------------------

#: ONNX types numpy has no (faithful) dtype for: the type number itself is kept as the dtype.
_NO_NUMPY = frozenset({TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                       TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ})


def _build_dtype_table() -> dict[int, object]:
    table: dict[int, object] = {}
    known = set(helper.get_all_tensor_dtypes())
    for code in TensorProto.DataType.values():
        if code in known and code not in _NO_NUMPY:
            try:
                table[code] = helper.tensor_dtype_to_np_dtype(code)
                continue
            except Exception:  # pragma: no cover - an onnx without this mapping
                pass
        table[code] = code
    return table


_DTYPE = _build_dtype_table()


def np_dtype(code: int):
    """The dtype a tensor of ONNX element type ``code`` gets (numpy dtype, or ``code`` itself)."""
    d = _DTYPE.get(code)
    return code if d is None else d


def _itemsizes() -> dict[int, tuple[object, int]]:
    out = {}
    for code in onnx.TensorProto.DataType.values():
        try:
            out[code] = (np_dtype(code), np.dtype(np_dtype(code)).itemsize)
        except TypeError:
            continue  # no numpy dtype: Constant.nbytes decodes the values
    return out


#: ONNX element type -> (its dtype, element size in bytes), for the types numpy has a dtype for
_ITEMSIZE_OF = _itemsizes()

_TO_ONNX: dict[object, int] = {}


def dtype_to_onnx(dtype) -> int:
    """The ONNX element type of a numpy dtype, a numpy scalar type, or an ONNX type number."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return int(dtype)
    try:
        return _TO_ONNX[dtype]
    except (KeyError, TypeError):
        pass
    code = None
    try:
        import ml_dtypes

        code = {np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
                np.dtype(ml_dtypes.float8_e4m3fn): TensorProto.FLOAT8E4M3FN,
                np.dtype(ml_dtypes.float8_e4m3fnuz): TensorProto.FLOAT8E4M3FNUZ,
                np.dtype(ml_dtypes.float8_e5m2): TensorProto.FLOAT8E5M2,
                np.dtype(ml_dtypes.float8_e5m2fnuz): TensorProto.FLOAT8E5M2FNUZ,
                np.dtype(ml_dtypes.uint4): TensorProto.UINT4,
                np.dtype(ml_dtypes.int4): TensorProto.INT4}.get(np.dtype(dtype))
    except (ImportError, TypeError):
        pass
    if code is None:
        code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    try:
        _TO_ONNX[dtype] = code
    except TypeError:
        pass
    return code


# ------------------------------------------------------------------------------------------------
# Synchronized producer/consumer lists
# ------------------------------------------------------------------------------------------------


class _Links(list):
    """A node's inputs or outputs, or a tensor's producers or consumers. Adding an element records
    the owner on the element's opposite list (a node's input records the node among the tensor's
    consumers), removing it removes the owner there (by identity). The list refers to its owner
    weakly: the only reference cycles of a graph are node -> tensor -> node, which
    :meth:`Graph.release` breaks by clearing the nodes' lists."""

    __slots__ = ("_owner",)
    #: the attribute of an element that lists the owner back (a class attribute of the two kinds
    #: below: one store less for each of the four lists every node and tensor has)
    _peer = ""

    def __init__(self, owner, initial: Iterable = ()):
        list.__init__(self)
        self._owner = weakref.ref(owner)
        if initial:
            self.extend(initial)

    def _link(self, elem) -> None:
        list.append(getattr(elem, self._peer), self._owner())

    def _unlink(self, elem) -> None:
        peer = getattr(elem, self._peer)
        owner = self._owner()
        for i, x in enumerate(peer):
            if x is owner:
                list.__delitem__(peer, i)
                return

    def append(self, x) -> None:
        list.append(self, x)
        self._link(x)

    def extend(self, items: Iterable) -> None:
        items = list(items)
        list.extend(self, items)
        for x in items:
            self._link(x)

    def insert(self, i, x) -> None:
        list.insert(self, i, x)
        self._link(x)

    def remove(self, x) -> None:
        for i, y in enumerate(self):
            if y is x:
                break
        else:
            i = list.index(self, x)
        y = self[i]
        list.__delitem__(self, i)
        self._unlink(y)

    def pop(self, i: int = -1):
        x = list.pop(self, i)
        self._unlink(x)
        return x

    def clear(self) -> None:
        for x in self:
            self._unlink(x)
        list.clear(self)

    def __setitem__(self, index, value) -> None:
        if isinstance(index, slice):
            old = list.__getitem__(self, index)
            value = list(value)
            list.__setitem__(self, index, value)
            for x in old:
                self._unlink(x)
            for x in value:
                self._link(x)
            return
        old = list.__getitem__(self, index)
        list.__setitem__(self, index, value)
        self._unlink(old)
        self._link(value)

    def __delitem__(self, index) -> None:
        old = list.__getitem__(self, index)
        list.__delitem__(self, index)
        for x in (old if isinstance(index, slice) else (old,)):
            self._unlink(x)

    def __iadd__(self, other):
        self.extend(other)
        return self

    def __add__(self, other):
        return list(self) + list(other)

    def __copy__(self):
        return list(self)

    def __deepcopy__(self, memo):
        return list(self)

    def __reduce__(self):  # a plain list when pickled or copied
        return (list, (list(self),))


class _InLinks(_Links):
    """A node's inputs (each tensor lists the node among its ``outputs``, its consumers) or a
    tensor's producers (each node lists the tensor among its ``outputs``)."""

    __slots__ = ()
    _peer = "outputs"


class _OutLinks(_Links):
    """A node's outputs or a tensor's consumers: each element lists the owner among its ``inputs``."""

    __slots__ = ()
    _peer = "inputs"


_ref = weakref.ref
_lnew = list.__new__
_lappend = list.append


def _new_links(owner, kind: type[_Links]) -> _Links:
    links = _lnew(kind)
    links._owner = _ref(owner)
    return links


class _Source:
    """The protobuf messages one import refers to (initializers, value infos, node protos), by
    index: objects hold ``(source, index)`` so that :meth:`Graph.release` drops them all at once."""

    __slots__ = ("protos", "functions", "model", "__weakref__")

    def __init__(self):
        self.protos: list | None = []
        self.functions = ()
        #: the imported ModelProto: its fields the graph does not model (doc string, metadata, domain,
        #: model version, training info, configuration) are written back from it on export
        self.model = None

    def add(self, proto) -> int:
        self.protos.append(proto)
        return len(self.protos) - 1

    def get(self, i: int):
        protos = self.protos
        if protos is None or i < 0:
            return None
        return protos[i]


# ------------------------------------------------------------------------------------------------
# Tensors
# ------------------------------------------------------------------------------------------------


def _sync_setattr(self, name, value):
    """Assigning ``inputs`` or ``outputs`` replaces the list's contents (kept in sync)."""
    if name == "inputs" or name == "outputs":
        cur = getattr(self, name, None)
        if cur is not None:
            if value is not cur:
                cur.clear()
                cur.extend(value)
            return
    object.__setattr__(self, name, value)


# Each public class (Variable, Constant, Node) derives from a "raw" class of the same layout with no
# __setattr__: the importer fills a raw object with plain attribute stores and then sets its class.


class Tensor:
    """A tensor of a graph: ``inputs`` are the nodes that produce it (one, or none for graph inputs
    and constants), ``outputs`` the nodes that read it."""

    __slots__ = ("name", "inputs", "outputs", "_src", "_pi", "__weakref__")

    DYNAMIC = -1

    def is_empty(self) -> bool:
        """An omitted optional input or output (no name), not a tensor of no elements."""
        return self.name == ""

    def i(self, tensor_idx: int = 0, producer_idx: int = 0) -> "Tensor":
        return self.inputs[producer_idx].inputs[tensor_idx]

    def o(self, consumer_idx: int = 0, tensor_idx: int = 0) -> "Tensor":
        return self.outputs[consumer_idx].outputs[tensor_idx]

    def __eq__(self, other):
        if not isinstance(other, Tensor):
            return NotImplemented
        return self.name == other.name

    def __ne__(self, other):
        if not isinstance(other, Tensor):
            return NotImplemented
        return self.name != other.name

    __hash__ = None  # equal by name, and names change: not hashable

    def __str__(self):
        return f"{type(self).__name__} ({self.name}): (shape={self.shape}, dtype={self.dtype})"

    __repr__ = __str__


_tensor_set = object.__setattr__


class _VariableRaw(Tensor):
    __slots__ = ("dtype", "shape", "type")


class Variable(_VariableRaw):
    """A tensor whose value is known at run time only."""

    __slots__ = ()
    __setattr__ = _sync_setattr

    def __init__(self, name: str, dtype=None, shape: Sequence | None = None, type: str = "tensor_type"):
        s = _tensor_set
        s(self, "name", name)
        s(self, "inputs", _new_links(self, _InLinks))
        s(self, "outputs", _new_links(self, _OutLinks))
        s(self, "dtype", dtype)
        s(self, "shape", shape)
        s(self, "type", type)
        s(self, "_src", None)
        s(self, "_pi", -1)

    @staticmethod
    def empty() -> "Variable":
        """An omitted optional input or output."""
        return Variable("")

    def copy(self) -> "Variable":
        return Variable(self.name, self.dtype, self.shape, self.type)


def _variable(name: str, dtype=None, shape=None, kind: str = "tensor_type", src=None, pi: int = -1) -> Variable:
    """A Variable built by plain stores before its class is set (this runs for every tensor of an
    imported graph)."""
    v = _VariableRaw()
    v.name = name
    wr = _ref(v)
    ins = _lnew(_InLinks)
    ins._owner = wr
    v.inputs = ins
    outs = _lnew(_OutLinks)
    outs._owner = wr
    v.outputs = outs
    v.dtype = dtype
    v.shape = shape
    v.type = kind
    v._src = src
    v._pi = pi
    v.__class__ = Variable
    return v


#: How many times the values of a constant were set after it was made (decoded values are read-only,
#: so this is every edit of a constant in place): the engine infers the shapes of a round that made one.
VALUE_EDITS = 0


class _ConstantRaw(Tensor):
    __slots__ = ("_values", "data_location", "_sparse", "_dirty")


class Constant(_ConstantRaw):
    """A tensor whose value is stored in the model (an initializer, or a TENSOR attribute).

    Imported constants keep their ``TensorProto`` and decode :attr:`values` on first access, as a
    read-only array (copy it to edit; assign :attr:`values` to change the constant). Export writes
    the original ``TensorProto`` again unless :attr:`values` was assigned."""

    __slots__ = ()
    __setattr__ = _sync_setattr

    def __init__(self, name: str, values: np.ndarray, data_location: int | None = None):
        if not isinstance(values, np.ndarray):
            raise TypeError(f"Constant '{name}': values must be a numpy array, not {type(values).__name__}")
        s = _tensor_set
        s(self, "name", name)
        s(self, "inputs", _new_links(self, _InLinks))
        s(self, "outputs", _new_links(self, _OutLinks))
        s(self, "_values", values)
        s(self, "data_location", data_location)
        s(self, "_sparse", False)
        s(self, "_dirty", True)
        s(self, "_src", None)
        s(self, "_pi", -1)

    @property
    def proto(self):
        """The TensorProto (or SparseTensorProto) this constant was imported from, or None."""
        return self._src.get(self._pi) if self._src is not None else None

    @property
    def is_loaded(self) -> bool:
        """Whether :attr:`values` has been decoded (or set)."""
        return self._values is not None

    @property
    def values(self) -> np.ndarray:
        v = self._values
        if v is None:
            p = self.proto
            if p is None:
                raise RuntimeError(f"constant '{self.name}': its model was released")
            v = _sparse_to_array(p) if self._sparse else numpy_helper.to_array(p)
            if v.flags.writeable:
                v.flags.writeable = False
            object.__setattr__(self, "_values", v)
        return v

    @values.setter
    def values(self, values: np.ndarray) -> None:
        global VALUE_EDITS
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_dirty", True)
        VALUE_EDITS += 1

    @property
    def shape(self) -> tuple[int, ...]:
        v = self._values
        if v is not None:
            return v.shape
        p = self.proto
        return tuple(p.dims) if not self._sparse else tuple(p.dims)

    @property
    def dtype(self):
        v = self._values
        if v is not None:
            return v.dtype
        p = self.proto
        return np_dtype(p.values.data_type if self._sparse else p.data_type)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the decoded values (computed without decoding them)."""
        v = self._values
        if v is not None:
            return int(v.nbytes)
        try:
            item = np.dtype(self.dtype).itemsize
        except TypeError:
            return int(self.values.nbytes)
        return self.size * item

    def stored(self) -> tuple[object, int, int]:
        """(dtype, element count, bytes of the decoded values) in one step: read from the stored
        TensorProto while the values are not decoded (what :attr:`dtype`, :attr:`size` and
        :attr:`nbytes` give, without decoding them)."""
        if self._values is None and not self._sparse and self._src is not None:
            p = self._src.get(self._pi)
            known = _ITEMSIZE_OF.get(p.data_type)
            if known is not None:
                n = 1
                for d in p.dims:
                    n *= int(d)
                return known[0], n, n * known[1]
        return self.dtype, self.size, self.nbytes

    @property
    def export_dtype(self):
        return self.dtype

    def copy(self) -> "Constant":
        c = object.__new__(Constant)
        s = _tensor_set
        s(c, "name", self.name)
        s(c, "inputs", _new_links(c, _InLinks))
        s(c, "outputs", _new_links(c, _OutLinks))
        for k in ("_values", "data_location", "_sparse", "_dirty", "_src", "_pi"):
            s(c, k, getattr(self, k))
        return c

    def __repr__(self):
        return self.__str__()


def _constant_from_proto(proto, src: _Source, sparse: bool = False, name: str | None = None) -> Constant:
    """A Constant of ``proto`` (``name``: its name, when the caller has read it already)."""
    c = _ConstantRaw()
    c.name = name if name is not None else proto.values.name if sparse else proto.name
    wr = _ref(c)
    ins = _lnew(_InLinks)
    ins._owner = wr
    c.inputs = ins
    outs = _lnew(_OutLinks)
    outs._owner = wr
    c.outputs = outs
    c._values = None
    loc = None
    if sparse:
        loc = int(proto.values.data_location)
    elif proto.HasField("data_location"):
        loc = int(proto.data_location)
    c.data_location = loc
    c._sparse = sparse
    c._dirty = False
    c._src = src
    protos = src.protos
    c._pi = len(protos)
    protos.append(proto)
    c.__class__ = Constant
    return c


def _sparse_to_array(sp) -> np.ndarray:
    """Dense values of a SparseTensorProto (INT64 indices, [NNZ] or [NNZ, rank] layout)."""
    vals = numpy_helper.to_array(sp.values).reshape(-1)
    idx = numpy_helper.to_array(sp.indices) if sp.indices.dims else np.zeros((0,), np.int64)
    dims = tuple(sp.dims)
    out = np.zeros(dims, dtype=vals.dtype)
    if idx.ndim == 1:
        out.reshape(-1)[idx] = vals
    else:
        out[tuple(idx.T)] = vals
    return out


# ------------------------------------------------------------------------------------------------
# Nodes
# ------------------------------------------------------------------------------------------------


class _NodeRaw:
    __slots__ = ("op", "name", "attrs", "inputs", "outputs", "domain", "_src", "_pi", "__weakref__")


class Node(_NodeRaw):
    """An operation reading ``inputs`` and writing ``outputs`` (lists kept in sync with the
    tensors' producer/consumer lists)."""

    __slots__ = ()
    __setattr__ = _sync_setattr

    def __init__(self, op: str, name: str | None = None, attrs: dict | None = None,
                 inputs: Sequence[Tensor] | None = None, outputs: Sequence[Tensor] | None = None,
                 domain: str | None = None):
        s = object.__setattr__
        s(self, "op", op)
        s(self, "name", "" if name is None else name)
        s(self, "attrs", {} if attrs is None else attrs)
        s(self, "inputs", _InLinks(self, inputs or ()))
        s(self, "outputs", _OutLinks(self, outputs or ()))
        s(self, "domain", domain)
        s(self, "_src", None)
        s(self, "_pi", -1)

    def subgraphs(self, recursive: bool = False) -> Iterator["Graph"]:
        """The graphs held in this node's attributes (the bodies of If/Loop/Scan)."""
        for v in self.attrs.values():
            if type(v) is Graph:
                yield v
                if recursive:
                    for n in v.nodes:
                        yield from n.subgraphs(recursive=True)

    def i(self, tensor_idx: int = 0, producer_idx: int = 0) -> "Node":
        return self.inputs[tensor_idx].inputs[producer_idx]

    def o(self, consumer_idx: int = 0, tensor_idx: int = 0) -> "Node":
        return self.outputs[tensor_idx].outputs[consumer_idx]

    def __str__(self):
        ins = ", ".join(t.name for t in self.inputs)
        outs = ", ".join(t.name for t in self.outputs)
        return f"{self.name} ({self.op}): [{ins}] -> [{outs}]"

    __repr__ = __str__


def has_subgraph(node: Node) -> bool:
    """Whether an attribute of ``node`` holds a graph (If/Loop/Scan bodies)."""
    for v in node.attrs.values():
        if type(v) is Graph:
            return True
    return False


# ------------------------------------------------------------------------------------------------
# Graphs
# ------------------------------------------------------------------------------------------------


class Graph:
    """Nodes (``nodes``, a plain list), graph ``inputs`` and ``outputs`` (plain lists of tensors)."""

    __slots__ = ("nodes", "inputs", "outputs", "name", "doc_string", "opset", "import_domains",
                 "producer_name", "producer_version", "ir_version", "_src", "_gp", "_inits", "_kept", "_extra_vi",
                 "_init_in",
                 "__weakref__")

    def __init__(self, nodes: Sequence[Node] | None = None, inputs: Sequence[Tensor] | None = None,
                 outputs: Sequence[Tensor] | None = None, name: str | None = None, doc_string: str | None = None,
                 opset: int | None = None, import_domains=None, producer_name: str = "",
                 producer_version: str = "", ir_version: int | None = None):
        self.nodes = list(nodes or [])
        self.inputs = list(inputs or [])
        self.outputs = list(outputs or [])
        self.name = "nafix_graph" if name is None else name
        self.doc_string = doc_string or ""
        self.opset = opset
        self.import_domains = import_domains
        self.producer_name = producer_name or ""
        self.producer_version = producer_version or ""
        self.ir_version = ir_version
        self._src = None
        #: (imported graphs) the index of the GraphProto in ``_src``: its fields the graph does not
        #: model (metadata, quantization annotations) and its value_info order are written back
        self._gp = -1
        #: (imported graphs) the range of indices in ``_src`` of its initializers (dense, then sparse)
        self._inits = (0, 0)
        #: (imported graphs) the initializers and typed values no node read or wrote at import, kept
        #: as they were; None when there were none
        self._kept = None
        #: (imported graphs) indices in ``_src`` of value infos no Variable of this graph carries (an
        #: initializer's type; in a subgraph, an enclosing graph's tensor): written back while their
        #: tensor is there; None when there were none
        self._extra_vi = None
        #: (imported graphs) initializers listed among the graph inputs: (position, index in ``_src``)
        self._init_in = None

    def __str__(self):
        return f"Graph {self.name}: {len(self.nodes)} nodes, {len(self.inputs)} inputs, {len(self.outputs)} outputs"

    __repr__ = __str__

    def release(self) -> None:
        """Free the graph now: drop the protobuf references of the import (one table; constants not
        decoded yet can no longer be read) and disconnect the nodes from their tensors (the only
        reference cycles), so reference counting frees nodes, tensors and values without waiting
        for the cyclic garbage collector. The graph is empty afterwards."""
        if self._src is not None:
            self._src.protos = None
            self._src.functions = ()
            self._src.model = None
        clear = list.clear
        stack = [self]
        while stack:
            g = stack.pop()
            for n in g.nodes:
                clear(n.inputs)
                clear(n.outputs)
                for v in n.attrs.values():
                    if type(v) is Graph:
                        stack.append(v)
            g.nodes = []
            g.inputs = []
            g.outputs = []
            g._kept = None

    def subgraphs(self, recursive: bool = False) -> Iterator["Graph"]:
        for n in self.nodes:
            yield from n.subgraphs(recursive=recursive)

    def tensors(self, check_duplicates: bool = False) -> dict[str, Tensor]:
        """Every named tensor the graph uses: inputs, then node inputs and outputs in node order, then
        outputs (a later tensor of the same name replaces an earlier one)."""
        out: dict[str, Tensor] = {}
        for t in self.inputs:
            if t.name:
                out[t.name] = t
        for n in self.nodes:
            for t in n.inputs:
                if t.name:
                    if check_duplicates and out.get(t.name, t) is not t:
                        raise ValueError(f"distinct tensors share the name '{t.name}'")
                    out[t.name] = t
            for t in n.outputs:
                if t.name:
                    if check_duplicates and out.get(t.name, t) is not t:
                        raise ValueError(f"distinct tensors share the name '{t.name}'")
                    out[t.name] = t
        for t in self.outputs:
            if t.name:
                out[t.name] = t
        return out

    # -- scope ------------------------------------------------------------------------------------
    def _local_names(self) -> set[str]:
        """Names of the tensors this graph defines: node outputs, graph inputs, constants."""
        local = {t.name for n in self.nodes for t in n.outputs if t.name}
        local.update(t.name for t in self.inputs)
        for n in self.nodes:
            for t in n.inputs:
                if type(t) is Constant:
                    local.add(t.name)
        for t in self.outputs:
            if type(t) is Constant:
                local.add(t.name)
        return local

    def _foreign_tensors(self) -> list[Tensor]:
        """Tensors read inside this graph (its subgraphs included) that it does not define: they come
        from an enclosing graph."""
        local = self._local_names()
        out: dict[str, Tensor] = {}
        for n in self.nodes:
            for t in n.inputs:
                if t.name not in local:
                    out[t.name] = t
            if has_subgraph(n):
                for sub in n.subgraphs():
                    for t in sub._foreign_tensors():
                        if t.name not in local:
                            out[t.name] = t
        return list(out.values())

    def _reads(self, node: Node) -> list[Tensor]:
        """The tensors ``node`` reads: its inputs, and what its subgraphs read from outside."""
        if not has_subgraph(node):
            return node.inputs
        reads = list(node.inputs)
        for sub in node.subgraphs():
            reads += sub._foreign_tensors()
        return reads

    # -- cleanup ----------------------------------------------------------------------------------
    def cleanup(self, remove_unused_node_outputs: bool = False, recurse_subgraphs: bool = True,
                remove_unused_graph_inputs: bool = False, recurse_functions: bool = True) -> "Graph":
        """Remove the nodes no graph output depends on (they are disconnected from their tensors)
        and drop producers of graph inputs. Linear in the size of the graph."""
        if recurse_subgraphs:
            for sub in list(self.subgraphs()):
                sub.cleanup(remove_unused_node_outputs=remove_unused_node_outputs, recurse_subgraphs=True,
                            remove_unused_graph_inputs=remove_unused_graph_inputs)
        for t in self.inputs:
            t.inputs.clear()
        in_graph = {id(n) for n in self.nodes}
        used: set[int] = set()
        seen: set[int] = set()
        stack = [t for t in self.outputs]
        used_inputs: set[str] = set()
        while stack:
            t = stack.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            used_inputs.add(t.name)
            for p in t.inputs:
                if id(p) in in_graph and id(p) not in used:
                    used.add(id(p))
                    stack.extend(self._reads(p))
        if remove_unused_graph_inputs:
            self.inputs = [t for t in self.inputs if t.name in used_inputs]
        kept = []
        for n in self.nodes:
            if id(n) in used:
                kept.append(n)
            else:
                n.inputs.clear()
                n.outputs.clear()
        if remove_unused_node_outputs:
            out_names = {t.name for t in self.outputs}
            for n in kept:
                for t in [t for t in n.outputs if t.name and not t.outputs and t.name not in out_names]:
                    n.outputs.remove(t)
        self.nodes = kept
        return self

    # -- toposort ---------------------------------------------------------------------------------
    def _depth_buckets(self, owners: set) -> list[list[Node]] | None:
        """The nodes by depth (each depth in list order) when every producer comes before its reader,
        in one pass: a node's depth is at most one more than the deepest bucket so far; None when
        the graph is not sorted (or lists a node twice). ``owners``: the nodes holding subgraphs."""
        nodes = self.nodes
        depth = dict.fromkeys(nodes, -1)  # (-1: not reached yet; None from .get: not in this graph)
        if len(depth) != len(nodes):
            return None
        get = depth.get
        buckets: list[list[Node]] = []
        for n in nodes:
            lv = 0
            for t in (n.inputs if n not in owners else self._reads(n)):
                for p in t.inputs:
                    lp = get(p)
                    if lp is None:
                        continue
                    if lp < 0:
                        return None  # a producer comes later
                    if lp >= lv:
                        lv = lp + 1
            depth[n] = lv
            if lv < len(buckets):
                buckets[lv].append(n)
            else:
                buckets.append([n])
        return buckets

    def toposort(self, recurse_subgraphs: bool = True, recurse_functions: bool = True, mode: str = "full") -> "Graph":
        """Sort the nodes topologically, by depth: a node's depth is one more than the deepest node
        it reads from (0 for nodes that read only inputs and constants), and nodes of equal depth
        keep their order (the order of a depth-first walk from each node in list order to the
        producers it reads, in input order; the list order itself when the graph is sorted).
        Sorting a sorted graph keeps its order. Linear in the size of the graph; raises
        ``ValueError`` on a cycle."""
        nodes = self.nodes
        owners = set()  # the nodes holding subgraphs (they read what their subgraphs read outside)
        subs = []
        for n in nodes:
            for v in n.attrs.values():
                if type(v) is Graph:
                    subs.append(v)
                    owners.add(n)
        if recurse_subgraphs:
            for sub in subs:
                sub.toposort(recurse_subgraphs=True)
        if len(nodes) < 2:
            return self
        buckets = self._depth_buckets(owners)
        if buckets is not None:  # sorted: by depth, each depth in list order
            self.nodes = [n for b in buckets for n in b]
            return self
        pos = {id(n): i for i, n in enumerate(nodes)}
        n_nodes = len(nodes)

        def deps(n: Node) -> list[int]:
            out: list[int] = []
            for t in self._reads(n):
                for p in t.inputs:
                    j = pos.get(id(p))
                    if j is not None and j not in out:
                        out.append(j)
            return out

        # not sorted: a depth-first post-order, as a recursive walk in list order would give
        level = [-1] * n_nodes
        order = []
        on_path = [False] * n_nodes
        dep_cache: dict[int, list[int]] = {}
        for root in range(n_nodes):
            if level[root] >= 0:
                continue
            dep_cache[root] = deps(nodes[root])
            stack = [(root, iter(dep_cache[root]))]
            on_path[root] = True
            while stack:
                i, it = stack[-1]
                for j in it:
                    if level[j] >= 0:
                        continue
                    if on_path[j]:
                        raise ValueError(f"the graph has a cycle through node '{nodes[j].name}' ({nodes[j].op})")
                    on_path[j] = True
                    dep_cache[j] = deps(nodes[j])
                    stack.append((j, iter(dep_cache[j])))
                    break
                else:
                    stack.pop()
                    on_path[i] = False
                    level[i] = 1 + max((level[j] for j in dep_cache[i]), default=-1)
                    order.append(i)
        by_level: list[list[int]] = [[] for _ in range(max(level) + 1)]
        for i in order:
            by_level[level[i]].append(i)
        self.nodes = [nodes[i] for b in by_level for i in b]
        return self


# ------------------------------------------------------------------------------------------------
# Import
# ------------------------------------------------------------------------------------------------

_A_FLOAT, _A_INT, _A_STRING, _A_TENSOR, _A_GRAPH = (AttributeProto.FLOAT, AttributeProto.INT, AttributeProto.STRING,
                                                     AttributeProto.TENSOR, AttributeProto.GRAPH)
_A_FLOATS, _A_INTS, _A_STRINGS = AttributeProto.FLOATS, AttributeProto.INTS, AttributeProto.STRINGS


def _vi_type(vi) -> tuple[object, list | None, str | None]:
    """(dtype, shape, type) of a ValueInfoProto with a type."""
    tp = vi.type
    kind = tp.WhichOneof("value")
    shape = None
    if kind == "tensor_type":
        tt = tp.tensor_type
        code = tt.elem_type
        if tt.HasField("shape"):
            shape = []
            for d in tt.shape.dim:
                v = d.dim_value
                if v:  # the common case: one field read
                    shape.append(v)
                    continue
                w = d.WhichOneof("value")
                shape.append(v if w == "dim_value" else d.dim_param if w == "dim_param" else None)
    elif kind == "sequence_type":
        code = tp.sequence_type.elem_type.tensor_type.elem_type
    elif kind == "map_type":
        code = tp.map_type.value_type
    elif kind == "optional_type":
        code = tp.optional_type.elem_type
    elif kind == "sparse_tensor_type":
        code = tp.sparse_tensor_type.elem_type
    else:
        code = 0
    return np_dtype(code) if isinstance(code, int) else None, shape, kind


class _Importer:
    __slots__ = ("src", "types", "_decoded")

    def __init__(self, src: _Source, types: bool = True):
        self.types = types
        self.src = src
        #: serialized TypeProto -> its _vi_type: a graph repeats few distinct types (13k value_infos
        #: of the shared models, 1.5k distinct), and one serialization is cheaper than the field walk
        self._decoded: dict[bytes, tuple] = {}

    def _type_of(self, vi, key: bytes) -> tuple[object, list | None, str | None]:
        """``_vi_type(vi)`` (``key``: ``vi.type`` serialized), with a fresh shape list."""
        known = self._decoded.get(key)
        if known is None:
            known = self._decoded[key] = _vi_type(vi)
        dtype, shape, kind = known
        return dtype, (shape[:] if shape is not None else None), kind

    def graph(self, gp: onnx.GraphProto, outer: list[dict]) -> Graph:
        src = self.src
        first_init = len(src.protos)
        local: dict[str, Tensor] = {}
        for init in gp.initializer:
            name = init.name
            if name not in local:
                local[name] = _constant_from_proto(init, src, name=name)
        inits = set(local)  # (the names of the initializers)
        for sp in gp.sparse_initializer:
            name = sp.values.name
            inits.add(name)
            if name not in local:
                local[name] = _constant_from_proto(sp, src, sparse=True)
        init_range = (first_init, len(src.protos))
        extra_vi = None
        protos = src.protos
        vi_lo = len(protos)
        if self.types:
            value_info = self._value_info
            new_value = self._new_value
            for vi in gp.value_info:
                name = vi.name
                if outer or name in local:  # an initializer's or a repeated name, or a subgraph: all cases
                    n0 = len(protos)
                    value_info(vi, local, outer, update=True)
                    if len(protos) == n0:
                        # not a new tensor of this graph (an initializer's type, a repeated name, an
                        # enclosing graph's tensor): written back as it is
                        if extra_vi is None:
                            extra_vi = []
                        extra_vi.append(src.add(vi))
                else:  # (a new name of the top-level graph: most tensors, one call)
                    new_value(vi, name, local)
        vi_hi = len(protos)
        inputs = []
        init_in = None
        for pos, vi in enumerate(gp.input):
            if vi.name in inits:  # an initializer listed as an input (IR < 4 style): written back as it is
                if init_in is None:
                    init_in = []
                init_in.append((pos, src.add(vi)))
            else:
                inputs.append(self._value_info(vi, local, (), update=False))
        outputs = [self._value_info(vi, local, (), update=False) for vi in gp.output]
        if vi_hi > vi_lo:
            # a graph input or output also listed in value_info: both entries are written back as they are
            for vis, ts in ((gp.input, inputs), (gp.output, outputs)):
                if len(ts) == len(vis):
                    for vi, t in zip(vis, ts):
                        if type(t) is Variable and t._src is src and vi_lo <= t._pi < vi_hi:
                            if extra_vi is None:
                                extra_vi = []
                            extra_vi.append(t._pi)
                            object.__setattr__(t, "_pi", src.add(vi))
                else:  # (initializers among the inputs)
                    for t in ts:
                        if type(t) is Variable and t._src is src and vi_lo <= t._pi < vi_hi:
                            vi = next(v for v in vis if v.name == t.name)
                            if extra_vi is None:
                                extra_vi = []
                            extra_vi.append(t._pi)
                            object.__setattr__(t, "_pi", src.add(vi))
            if extra_vi is not None:
                extra_vi.sort()
        nodes = []
        scope = outer + [local]
        nodes_append = nodes.append
        for npr in gp.node:
            nodes_append(self.node(npr, local, outer, scope))
        # what no node reads or writes (an unused initializer, a value_info of a name the graph does
        # not use) is written back as it was: only a graph to export reads the types
        kept = [t for t in local.values() if not t.outputs and not t.inputs] if self.types else None
        if kept:
            io = {id(t) for t in inputs}
            io.update(id(t) for t in outputs)
            kept = [t for t in kept if id(t) not in io]
        g = Graph.__new__(Graph)
        g.nodes = nodes
        g.inputs = inputs
        g.outputs = outputs
        g.name = gp.name
        g.doc_string = gp.doc_string
        g.opset = None
        g.import_domains = None
        g.producer_name = ""
        g.producer_version = ""
        g.ir_version = None
        g._src = src
        g._gp = src.add(gp)
        g._inits = init_range
        g._kept = kept or None
        g._init_in = init_in
        g._extra_vi = extra_vi
        return g

    def _value_info(self, vi, local: dict, outer, *, update: bool) -> Tensor:
        name = vi.name
        t = local.get(name)
        if t is not None:
            if update and type(t) is Variable and vi.type.ByteSize() > 0:
                dtype, shape, kind = self._type_of(vi, vi.type.SerializeToString())
                changed = False
                if t.dtype is None:
                    object.__setattr__(t, "dtype", dtype)
                    changed = True
                if not t.shape and shape is not None and shape != t.shape:
                    object.__setattr__(t, "shape", shape)
                    changed = True
                if changed:
                    object.__setattr__(t, "_pi", -1)  # the info no longer comes from one proto
            return t
        if update:
            for scope in reversed(outer):
                t = scope.get(name)
                if t is not None:
                    return t
        return self._new_value(vi, name, local)

    def _new_value(self, vi, name: str, local: dict) -> Variable:
        """The Variable of ``vi`` (named ``name``, not in ``local`` yet), recorded in ``local``."""
        key = vi.type.SerializeToString()
        src = self.src
        protos = src.protos
        if key:
            v = _variable(name, *self._type_of(vi, key), src, len(protos))
        else:
            v = _variable(name, src=src, pi=len(protos))
        protos.append(vi)
        local[name] = v
        return v

    def node(self, npr: onnx.NodeProto, local: dict, outer: list[dict], scope: list[dict]) -> Node:
        n = _NodeRaw()
        wr = _ref(n)
        ins = _lnew(_InLinks)
        ins._owner = wr
        outs = _lnew(_OutLinks)
        outs._owner = wr
        get = local.get
        append = _lappend
        for name in npr.input[:]:  # (a slice copies the names in C: faster to walk than the field)
            t = get(name)
            if t is None:
                for sc in reversed(outer):
                    t = sc.get(name)
                    if t is not None:
                        break
                else:
                    t = _variable(name)
                    if name:
                        local[name] = t
            append(ins, t)
            append(t.outputs, n)
        for name in npr.output[:]:
            t = get(name) if name else None
            if t is None:
                t = _variable(name)
                if name:
                    local[name] = t
            append(outs, t)
            append(t.inputs, n)
        attrs = {}
        attributes = npr.attribute  # (each read of the field makes a new container)
        if attributes:
            for a in attributes:
                t = a.type
                if t == _A_INT and not a.ref_attr_name:
                    attrs[a.name] = a.i
                elif t == _A_INTS and not a.ref_attr_name:
                    attrs[a.name] = a.ints[:]  # (a list, copied in C)
                else:
                    attrs[a.name] = self.attr(a, scope)
        n.op = npr.op_type
        n.name = npr.name
        n.attrs = attrs
        n.inputs = ins
        n.outputs = outs
        n.domain = npr.domain if npr.HasField("domain") else None
        src = self.src
        n._src = src
        protos = src.protos
        n._pi = len(protos)
        append(protos, npr)
        n.__class__ = Node
        return n

    def attr(self, a: AttributeProto, scope: list[dict]):
        if a.ref_attr_name:
            return _Raw(a)
        t = a.type
        if t == _A_INT:
            return a.i
        if t == _A_FLOAT:
            return a.f
        if t == _A_INTS:
            return list(a.ints)
        if t == _A_STRING:
            return a.s.decode()
        if t == _A_FLOATS:
            return list(a.floats)
        if t == _A_TENSOR:
            return _constant_from_proto(a.t, self.src)
        if t == _A_GRAPH:
            return self.graph(a.g, scope)
        if t == _A_STRINGS:
            return [s.decode() for s in a.strings]
        return _Raw(a)  # SPARSE_TENSOR, TYPE_PROTO, TENSORS, GRAPHS: written back as they were


class _Raw:
    """An attribute nafix does not decode (sparse tensor, type proto, lists of tensors or graphs, a
    reference to a function attribute): exported as it was read."""

    __slots__ = ("proto",)

    def __init__(self, proto: AttributeProto):
        self.proto = AttributeProto()
        self.proto.CopyFrom(proto)

    def __repr__(self):
        return f"<attribute {self.proto.name}: {AttributeProto.AttributeType.Name(self.proto.type)}>"


def _copy_opset(imp) -> onnx.OperatorSetIdProto:
    out = onnx.OperatorSetIdProto()
    out.CopyFrom(imp)
    return out


def model_opset(model: onnx.ModelProto, missing=0):
    """The default-domain (``""`` / ``ai.onnx``) opset a model imports; ``missing`` when it imports none."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return missing


def import_onnx(model: onnx.ModelProto, *, value_info: bool = True) -> Graph:
    """The graph of ``model`` (one pass over the protobuf; constants are not decoded). With
    ``value_info=False`` the types of intermediate tensors are not read (graph inputs' and outputs'
    are): a graph to read structure and constants from, not to export."""
    src = _Source()
    src.functions = model.functions
    src.model = model
    g = _Importer(src, value_info).graph(model.graph, [])
    g.opset = model_opset(model) or None
    g.import_domains = [_copy_opset(i) for i in model.opset_import]
    g.producer_name = model.producer_name
    g.producer_version = model.producer_version
    g.ir_version = model.ir_version
    return g


# ------------------------------------------------------------------------------------------------
# Export
# ------------------------------------------------------------------------------------------------


def _same_attr(v, a: AttributeProto) -> bool:
    """Whether value ``v`` is what attribute ``a`` decodes to (so ``a`` can be written again)."""
    t = a.type
    tv = type(v)
    if a.ref_attr_name:
        return False
    if t == _A_INT:
        return tv is int and v == a.i
    if t == _A_FLOAT:
        return tv is float and v == a.f
    if t == _A_INTS:
        return tv is list and len(v) == len(a.ints) and all(type(x) is int for x in v) and v == list(a.ints)
    if t == _A_STRING:
        return tv is str and v.encode() == a.s
    if t == _A_FLOATS:
        return tv is list and len(v) == len(a.floats) and all(type(x) is float for x in v) and v == list(a.floats)
    if t == _A_STRINGS:
        return tv is list and all(type(x) is str for x in v) and [x.encode() for x in v] == list(a.strings)
    if t == _A_TENSOR:
        if tv is not Constant or v._dirty or v._sparse or v.name != a.t.name:
            return False
        p = v.proto
        return p is not None and p == a.t
    return False


def _constant_proto(c: Constant):
    """The TensorProto of constant ``c``: the original one when its values were not assigned."""
    p = c.proto if not c._dirty else None
    if p is not None:
        if p.name == c.name if not c._sparse else p.values.name == c.name:
            return p
        q = type(p)()
        q.CopyFrom(p)
        if c._sparse:
            q.values.name = c.name
        else:
            q.name = c.name
        return q
    values = c.values
    if not values.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        values = values.copy(order="C")
    if values.dtype == object or values.dtype.kind in "SU":
        q = numpy_helper.from_array(values, c.name)
    else:
        q = helper.make_tensor(name=c.name, data_type=dtype_to_onnx(values.dtype), dims=values.shape,
                               vals=values.tobytes(), raw=True)
    if c.data_location is not None:
        q.data_location = c.data_location
    return q


def _value_info(t: Tensor, out) -> None:
    """Write the type of tensor ``t`` into ValueInfoProto ``out`` (reusing the original one)."""
    if type(t) is Variable:
        vi = t._src.get(t._pi) if t._src is not None else None
        if vi is not None and vi.name == t.name:
            if vi.type.ByteSize() == 0:
                if t.dtype is None and t.shape is None:
                    out.CopyFrom(vi)
                    return
            else:
                dtype, shape, kind = _vi_type(vi)
                if kind == t.type and _same_dtype(dtype, t.dtype) and shape == (
                        list(t.shape) if t.shape is not None else None):
                    out.CopyFrom(vi)
                    return
        dtype, shape, kind = t.dtype, t.shape, t.type
    else:
        dtype, shape, kind = t.dtype, t.shape, "tensor_type"
    if dtype is None:
        out.CopyFrom(helper.make_empty_tensor_value_info(t.name))
        return
    code = dtype_to_onnx(dtype)
    shape = list(shape) if shape is not None else None
    if kind == "sequence_type":
        out.CopyFrom(helper.make_tensor_sequence_value_info(t.name, code, shape))
    elif kind == "sparse_tensor_type":
        out.CopyFrom(helper.make_sparse_tensor_value_info(t.name, code, shape))
    else:
        out.CopyFrom(helper.make_tensor_value_info(t.name, code, shape))


def _same_dtype(a, b) -> bool:
    if a is b:
        return True
    if a is None or b is None:
        return False
    try:
        return dtype_to_onnx(a) == dtype_to_onnx(b)
    except (TypeError, ValueError, KeyError):
        return False


def _make_attr(key: str, val, scope: "_Scope | None" = None) -> AttributeProto:
    if type(val) is Constant:
        a = AttributeProto()
        a.name = key
        a.type = _A_TENSOR
        a.t.CopyFrom(_constant_proto(val))
        return a
    if type(val) is Graph:
        a = AttributeProto()
        a.name = key
        a.type = _A_GRAPH
        _export_graph(val, a.g, scope.inner() if scope is not None else None)
        return a
    if type(val) is _Raw:
        a = AttributeProto()
        a.CopyFrom(val.proto)
        a.name = key
        return a
    if isinstance(val, type) or isinstance(val, np.dtype):
        try:
            val = dtype_to_onnx(val)
        except TypeError:
            pass
    return helper.make_attribute(key, val)


_NODE_FIELDS = {f.name for f in onnx.NodeProto.DESCRIPTOR.fields}
#: NodeProto fields the IR does not model: written back from the imported NodeProto (its doc string,
#: metadata such as the TFLite importer's layout marks, overload, device configurations)
_NODE_KEPT = tuple(f for f in ("doc_string", "overload") if f in _NODE_FIELDS)
_NODE_KEPT_LISTS = tuple(f for f in ("metadata_props", "device_configurations") if f in _NODE_FIELDS)


def _export_node(n: Node, out: onnx.NodeProto, scope: "_Scope | None" = None) -> None:
    ins = [t.name for t in n.inputs]
    outs = [t.name for t in n.outputs]
    orig = n._src.get(n._pi) if n._src is not None else None
    if orig is not None:
        oattrs = orig.attribute
        attrs = n.attrs
        if (n.op == orig.op_type and n.name == orig.name and ins == orig.input[:] and outs == orig.output[:]
                and len(attrs) == len(oattrs)):
            d = n.domain
            same = not orig.HasField("domain") if d is None else d == orig.domain and (d or orig.HasField("domain"))
            if same and attrs:
                for (k, v), a in zip(attrs.items(), oattrs):
                    if a.name != k or a.type == _A_GRAPH or not _same_attr(v, a):
                        same = False
                        break
            if same:  # as imported: the NodeProto itself (doc string and metadata included)
                out.CopyFrom(orig)
                return
    out.op_type = n.op
    out.input.extend(ins)
    out.output.extend(outs)
    if n.name:
        out.name = n.name
    if n.domain is not None:
        out.domain = n.domain
    if orig is not None:  # what the IR does not model (doc string, metadata, ...) as imported
        for f in _NODE_KEPT:
            v = getattr(orig, f)
            if v or orig.HasField(f):  # (an empty string set is written back set)
                setattr(out, f, v)
        for f in _NODE_KEPT_LISTS:
            v = getattr(orig, f)
            if v:
                getattr(out, f).extend(v)
    if not n.attrs:
        return
    by_name = {a.name: a for a in orig.attribute} if orig is not None and len(orig.attribute) else {}
    attrs = out.attribute
    for k, v in n.attrs.items():
        a = by_name.get(k)
        if a is not None and a.type != _A_GRAPH and _same_attr(v, a):
            attrs.append(a)
        else:
            attrs.append(_make_attr(k, v, scope))


class _Scope:
    """The tensors of the graphs enclosing a subgraph being exported (by id): a subgraph writes as
    its own initializers and value infos only what is not theirs (its nodes list an enclosing
    graph's tensors among their inputs)."""

    __slots__ = ("graph", "tmap", "outer", "_ids")

    def __init__(self, graph: Graph, tmap: dict, outer: set | None):
        self.graph = graph
        self.tmap = tmap
        self.outer = outer
        self._ids = None

    def inner(self) -> set:
        if self._ids is None:
            ids = set(self.outer) if self.outer else set()
            ids.update(id(t) for t in self.tmap.values())
            if self.graph._kept:
                ids.update(id(t) for t in self.graph._kept)
            self._ids = ids
        return self._ids


_LAST = 1 << 62  # sort key offset of what an import did not bring (written after, in first-use order)


def _order_key(src):
    """Sort key of a tensor of a graph imported from ``src``: its position in the import (so that
    initializers and value infos keep their order in the file), new tensors after."""
    counter = iter(range(_LAST, _LAST << 1))

    def key(t) -> int:
        if src is not None and t._src is src and t._pi >= 0:
            return t._pi
        return next(counter)

    return key


def _vi_matches(vi, t: Variable) -> bool:
    """Whether ValueInfoProto ``vi`` states the type Variable ``t`` has."""
    if vi.type.ByteSize() == 0:
        return t.dtype is None and t.shape is None
    dtype, shape, kind = _vi_type(vi)
    return kind == t.type and _same_dtype(dtype, t.dtype) and shape == (list(t.shape) if t.shape is not None else None)


def _export_graph(g: Graph, gp: onnx.GraphProto, outer: set | None = None) -> None:
    """Write graph ``g`` into ``gp``. What the import brought and nafix did not change is written as it
    was read, in the order it was read: initializers, value infos (those of unused names and of
    initializers included), the graph's metadata and quantization annotations. ``outer``: the ids of
    the tensors of the enclosing graphs (a subgraph), which the subgraph does not write again."""
    tmap = g.tensors()
    src = g._src
    orig = src.get(g._gp) if src is not None else None
    kept = g._kept if orig is not None else None
    subs = None
    for n in g.nodes:
        if n.attrs:
            for v in n.attrs.values():
                if type(v) is Graph:
                    if subs is None:
                        subs = []
                    subs.append(v)
    # initializers: this graph's constants (an initializer only a subgraph reads included), in import order
    consts = [t for t in tmap.values() if type(t) is Constant and (outer is None or id(t) not in outer)]
    if kept:
        consts += [t for t in kept if type(t) is Constant and t.name not in tmap]
    if subs is not None and orig is not None:
        lo, hi = g._inits
        have = {t.name for t in consts}
        for sub in subs:
            for sg in (sub, *sub.subgraphs(recursive=True)):
                for t in sg.tensors().values():
                    if (type(t) is Constant and t._src is src and lo <= t._pi < hi and t.name not in have
                            and t.name not in tmap):
                        have.add(t.name)
                        consts.append(t)
                        tmap[t.name] = t  # (an enclosing graph's tensor for the subgraphs)
    scope = _Scope(g, tmap, outer) if subs is not None else None
    for n in g.nodes:
        _export_node(n, gp.node.add(), scope)
    gp.name = g.name
    if g.doc_string or (orig is not None and orig.HasField("doc_string") and g.doc_string == orig.doc_string):
        gp.doc_string = g.doc_string
    if orig is not None:
        consts.sort(key=_order_key(src))
    written = {}
    for t in consts:
        p = _constant_proto(t)
        written[t.name] = t
        if t._sparse:
            gp.sparse_initializer.append(p)
        else:
            gp.initializer.append(p)
    if g._init_in is None or orig is None:
        for t in g.inputs:
            _value_info(t, gp.input.add())
    else:  # the initializers the graph listed among its inputs, where they were
        vis = []
        for t in g.inputs:
            vi = onnx.ValueInfoProto()
            _value_info(t, vi)
            vis.append(vi)
        for pos, pi in g._init_in:
            vi = src.get(pi)
            c = written.get(vi.name)
            if c is None:
                continue
            if c._dirty:
                vi = helper.make_tensor_value_info(c.name, dtype_to_onnx(c.dtype), list(c.shape))
            vis.insert(min(pos, len(vis)), vi)
        gp.input.extend(vis)
    for t in g.outputs:
        _value_info(t, gp.output.add())
    # value infos: typed intermediate tensors, in import order
    io = {t.name for t in g.inputs}
    io.update(t.name for t in g.outputs)
    typed = [t for name, t in tmap.items() if name not in io and type(t) is Variable
             and not (t.dtype is None and t.shape is None) and (outer is None or id(t) not in outer)]
    if kept:
        typed += [t for t in kept if type(t) is Variable and t.name not in tmap and t.name not in io
                  and not (t.dtype is None and t.shape is None)]
    extra = g._extra_vi if orig is not None else None
    if orig is None or (not extra and all(t._src is src and t._pi >= 0 for t in typed)
                        and all(typed[i]._pi < typed[i + 1]._pi for i in range(len(typed) - 1))):
        for t in typed:  # (in import order already: the common case)
            _value_info(t, gp.value_info.add())
    else:
        key = _order_key(src)
        entries = [(key(t), t, None) for t in typed]
        unused = {t.name: t for t in kept if type(t) is Variable} if kept else {}
        for pi in extra or ():
            vi = src.get(pi)
            t = tmap.get(vi.name)
            if t is None:
                t = unused.get(vi.name)  # (a repeated value_info of a name no node uses)
                if t is None:
                    continue
            if type(t) is Constant:
                if t._dirty or t.name not in written:
                    continue
            elif not (t.dtype is None and t.shape is None) and not _vi_matches(vi, t):
                vi = None  # (the tensor's type changed: its value info is written anew)
            entries.append((pi, t, vi))
        entries.sort(key=lambda e: e[0])
        for _, t, vi in entries:
            if vi is not None:
                gp.value_info.append(vi)
            else:
                _value_info(t, gp.value_info.add())
    if orig is not None:
        _graph_extras(orig, gp, tmap)


_GRAPH_FIELDS = {f.name for f in onnx.GraphProto.DESCRIPTOR.fields}


def _graph_extras(orig: onnx.GraphProto, gp: onnx.GraphProto, tmap: dict) -> None:
    """The fields of imported GraphProto ``orig`` the IR does not model: its metadata, and the
    quantization annotations of the tensors still in the graph."""
    if "metadata_props" in _GRAPH_FIELDS and len(orig.metadata_props):
        gp.metadata_props.extend(orig.metadata_props)
    if len(orig.quantization_annotation):
        gp.quantization_annotation.extend([a for a in orig.quantization_annotation if a.tensor_name in tmap])


def _opset_imports(g: Graph) -> list:
    imports = list(g.import_domains) if g.import_domains is not None else [helper.make_opsetid("", g.opset or 11)]
    have = {i.domain for i in imports}
    used = {n.domain for n in g.nodes}
    for sub in g.subgraphs(recursive=True):
        used.update(n.domain for n in sub.nodes)
    used.discard(None)
    for d in sorted(used - have):
        imports.append(helper.make_opsetid(d, 1))
    return imports


def export_onnx(graph: Graph, do_type_check: bool = False) -> onnx.ModelProto:
    """The ONNX model of ``graph``: unchanged constants, attributes and value infos are written from
    the protobufs they were read from (nothing is decoded and encoded again)."""
    if do_type_check:
        for t in (*graph.inputs, *graph.outputs):
            if t.dtype is None:
                raise ValueError(f"graph input/output '{t.name}' has no element type")
    model = onnx.ModelProto()
    _export_graph(graph, model.graph)
    model.ir_version = graph.ir_version if graph.ir_version is not None else onnx.IR_VERSION
    model.opset_import.extend(_opset_imports(graph))
    src = graph._src
    orig = src.model if src is not None else None
    for f in ("producer_name", "producer_version"):
        v = getattr(graph, f)
        if v or (orig is not None and orig.HasField(f) and getattr(orig, f) == v):
            setattr(model, f, v)
    if src is not None and src.functions:
        model.functions.extend(src.functions)
    if src is not None and src.model is not None:
        # the model fields the graph does not model (doc string, metadata, domain, model version,
        # training info, configuration) as imported
        copy_fields(src.model, model, skip=_MODEL_MODELED)
    return model


def copy_fields(src, dst, *, skip=frozenset()) -> None:
    """Every field ``src`` has set, but those named in ``skip``, onto ``dst`` (a message of the same
    type): repeated fields appended, sub-messages copied, scalars set."""
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        if getattr(fd, "is_repeated", None) or getattr(fd, "label", None) == 3:  # 3: LABEL_REPEATED
            getattr(dst, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


#: ModelProto fields the graph carries (or export writes itself)
_MODEL_MODELED = frozenset({"graph", "ir_version", "opset_import", "producer_name", "producer_version", "functions"})
