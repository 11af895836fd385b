"""The one facade over onnx-graphsurgeon that the rest of nafix reads graphs through.

:class:`GraphView` answers the questions the placement model and the rules ask: who produces a
tensor, who consumes it, is it a constant (an initializer, a ``Constant`` node, or a subgraph the
compiler folds such as ``Shape`` of a static tensor), what are its shape and element type.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Iterator

import numpy as np
import onnx
import onnx_graphsurgeon as gs

#: Ops that only move or relabel data; the compiler folds them into their neighbours.
MOVEMENT_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


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


def node_label(node: gs.Node) -> str:
    return node.name or f"{node.op} -> {node.outputs[0].name if node.outputs else '?'}"


class GraphView:
    """A read-only, topologically sorted view of an ONNX graph with producer/consumer lookups."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = gs.import_onnx(model)
        self.graph.toposort()
        self._names_unique()
        self.input_names = frozenset(t.name for t in self.graph.inputs)
        self.output_names = frozenset(t.name for t in self.graph.outputs)
        self.folded = self._constant_foldable()

    def _names_unique(self) -> None:
        seen: dict[str, int] = {}
        for i, node in enumerate(self.graph.nodes):
            if not node.name or node.name in seen:
                base = node.name or f"{node.op}_{i}"
                name, k = base, 1
                while name in seen:
                    name = f"{base}_{k}"
                    k += 1
                node.name = name
            seen[node.name] = i

    @property
    def nodes(self) -> list[gs.Node]:
        return self.graph.nodes

    @cached_property
    def by_name(self) -> dict[str, gs.Node]:
        return {n.name: n for n in self.graph.nodes}

    # -- tensors ---------------------------------------------------------------------------
    @staticmethod
    def producer(t: gs.Tensor) -> gs.Node | None:
        return t.inputs[0] if t.inputs else None

    @staticmethod
    def consumers(t: gs.Tensor) -> list[gs.Node]:
        return list(t.outputs)

    def is_graph_input(self, t: gs.Tensor) -> bool:
        return t.name in self.input_names and not isinstance(t, gs.Constant)

    def is_graph_output(self, t: gs.Tensor) -> bool:
        return t.name in self.output_names

    def is_const(self, t: gs.Tensor) -> bool:
        if isinstance(t, gs.Constant):
            return True
        p = self.producer(t)
        return p is not None and p.name in self.folded

    def is_const_like(self, t: gs.Tensor) -> bool:
        """A constant, or a constant seen through QuantizeLinear/DequantizeLinear (a quantized weight)."""
        while not self.is_const(t):
            p = self.producer(t)
            if p is None or p.op not in QDQ_OPS or not p.inputs:
                return False
            t = p.inputs[0]
        return True

    def const_value(self, t: gs.Tensor) -> np.ndarray | None:
        """The value of a constant tensor when it is stored (initializer or Constant node)."""
        if isinstance(t, gs.Constant):
            return np.asarray(t.values)
        p = self.producer(t)
        if p is not None and p.op == "Constant":
            v = p.attrs.get("value")
            if isinstance(v, gs.Constant):
                return np.asarray(v.values)
            for key in ("value_float", "value_int"):
                if key in p.attrs:
                    return np.asarray(p.attrs[key])
            for key in ("value_floats", "value_ints"):
                if key in p.attrs:
                    return np.asarray(p.attrs[key])
        return None

    @staticmethod
    def info(t: gs.Tensor) -> TensorInfo:
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
    def activation_inputs(node: gs.Node, view: "GraphView") -> list[gs.Tensor]:
        return [t for t in node.inputs if not _empty(t) and not view.is_const(t)]

    # -- walking through data movement -----------------------------------------------------
    def source(self, t: gs.Tensor) -> gs.Node | None:
        """The producer of ``t``, looking back through data-movement ops."""
        p = self.producer(t)
        while p is not None and p.op in MOVEMENT_OPS and p.inputs:
            t = p.inputs[0]
            p = self.producer(t)
        return p

    def source_tensor(self, t: gs.Tensor) -> gs.Tensor:
        p = self.producer(t)
        while p is not None and p.op in MOVEMENT_OPS and p.inputs:
            t = p.inputs[0]
            p = self.producer(t)
        return t

    def sinks(self, t: gs.Tensor) -> Iterator[tuple[gs.Node | None, gs.Tensor]]:
        """Consumers of ``t`` looking forward through data-movement ops; ``(None, t)`` for graph outputs."""
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
                if c.op in MOVEMENT_OPS:
                    stack.extend(c.outputs)
                else:
                    yield c, cur

    # -- constant folding ------------------------------------------------------------------
    def _constant_foldable(self) -> frozenset[str]:
        """Nodes the compiler evaluates at compile time: all inputs constant, or Shape of a static tensor."""
        folded: set[str] = set()
        for node in self.graph.nodes:
            if node.op == "Constant":
                folded.add(node.name)
                continue
            if node.op in ("Shape", "Size") and node.inputs and self.info(node.inputs[0]).static:
                folded.add(node.name)
                continue
            ins = [t for t in node.inputs if not _empty(t)]
            if node.op in QDQ_OPS:
                # A Q/DQ of a constant is a weight; it stays visible so placement can call it folded.
                continue
            if ins and all(isinstance(t, gs.Constant) or (self.producer(t) is not None and self.producer(t).name in folded)
                           for t in ins):
                folded.add(node.name)
        return frozenset(folded)


def _empty(t: gs.Tensor) -> bool:
    return isinstance(t, gs.Variable) and t.is_empty() if hasattr(t, "is_empty") else not t.name


def iter_attrs(node: gs.Node) -> Iterable[tuple[str, object]]:
    return node.attrs.items()
