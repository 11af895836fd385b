"""Memory estimate: weight bytes, peak activation bytes, and whether activations fit on-chip RAM.

Activations are sized as the compiler stores them: one byte per element for tensors in the int8
domain, the element size of the ONNX type otherwise. Data movement and folded Q/DQ nodes alias
their input buffer. The peak is the largest sum of live buffers over a topological order (a buffer
lives from the node that writes it to the last node that reads it). The compiler's scheduler may
need more (alignment, epoch-level scratch) or less (in-place ops): this is an estimate.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
from .. import ir

from ..graph import MOVEMENT_OPS, QDQ_OPS, GraphView
from .placement import FOLDED, Placement, QuantDomain


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int
    peak_activation_bytes: int
    peak_at: str | None
    largest_tensor: str | None
    largest_tensor_bytes: int
    onchip_bytes: int
    fits_on_chip: bool
    external_bytes: int
    unallocated_bytes: int = 0
    pools: tuple[dict, ...] = ()
    unknown_tensors: int = 0

    def as_dict(self) -> dict:
        return {
            "weights_bytes": self.weights_bytes,
            "peak_activation_bytes": self.peak_activation_bytes,
            "peak_at": self.peak_at,
            "largest_tensor": self.largest_tensor,
            "largest_tensor_bytes": self.largest_tensor_bytes,
            "onchip_activation_capacity_bytes": self.onchip_bytes,
            "fits_on_chip": self.fits_on_chip,
            "external_activation_bytes": self.external_bytes,
            "unallocated_bytes": self.unallocated_bytes,
            "pools": list(self.pools),
            "tensors_of_unknown_size": self.unknown_tensors,
        }


def _nbytes(t: ir.Tensor, int8_domain: bool) -> int | None:
    shape = t.shape
    if shape is None:
        return None
    n = 1
    for d in shape:  # (one loop: a known shape of non-negative integers, and its element count)
        if not isinstance(d, _INTS) or d < 0:
            return None
        n *= int(d)
    if n >= 2**63:  # np.prod in int64 wraps around there: keep its figure
        n = int(np.prod(shape, dtype=np.int64))
    if int8_domain:
        return n
    try:
        return n * _itemsize(t.dtype)
    except TypeError:
        return n * 4


_INTS = (int, np.integer)
#: element type -> its size in bytes; read for every activation tensor
_ITEMSIZE: dict = {}


def _itemsize(dtype) -> int:
    """``np.dtype(dtype).itemsize`` (TypeError as it raises), remembered per element type."""
    try:
        return _ITEMSIZE[dtype]
    except (KeyError, TypeError):
        pass
    size = np.dtype(dtype).itemsize
    with contextlib.suppress(TypeError):  # an unhashable type: not remembered
        _ITEMSIZE[dtype] = size
    return size


def weights_bytes(view: GraphView) -> int:
    """Bytes of constant parameters as stored: quantized weights at 1 byte, int32 biases at 4, float
    weights at 4; Q/DQ scales and zero-points and integer shape arguments are not counted."""
    seen: set[str] = set()
    total = 0
    Constant = ir.Constant
    for node in view.nodes:
        qdq = node.op in QDQ_OPS
        for t in (node.inputs[:1] if qdq else node.inputs):  # (a Q/DQ's scale and zero-point: not counted)
            if not isinstance(t, Constant) or t.name in seen:
                continue
            dtype, size, nbytes = t.stored()  # from the stored shape and type: the weights are not decoded
            if dtype == np.int64 or size <= 1 and not qdq:
                continue
            seen.add(t.name)
            total += nbytes
    return total


def estimate_memory(view: GraphView, placement: Placement, domain: QuantDomain, pools=None) -> MemoryEstimate:
    """Estimate weights, peak activations and the on-chip fit against ``pools`` (default: the
    STM32N6 default memory pools)."""
    from .mpool import default_stm32n6_pools, fit_activations

    pools = list(pools) if pools is not None else list(default_stm32n6_pools())
    by_name = placement.by_name
    alias: dict[str, str] = {}
    size: dict[str, int] = {}
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    unknown = 0

    def root(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    def int8_domain(t: ir.Tensor) -> bool:
        if t.dtype is not None and _itemsize(t.dtype) == 1:
            return True
        return domain.sourced(t) or domain.sunk(t)  # read from, or written to, int8

    for t in view.graph.inputs:
        b = _nbytes(t, int8_domain(t))
        if b is None:
            unknown += 1
        size[t.name] = b or 0
        start[t.name] = 0
        end[t.name] = 0
    activations = domain.activations
    for step, node in enumerate(view.nodes, start=1):
        acts = activations(node)
        for t in acts:
            r = t.name
            while r in alias:  # (root(), inline)
                r = alias[r]
            if r in start:
                end[r] = step  # (every end recorded so far is at an earlier step)
        p = by_name.get(node.name)
        folded = p is not None and p.unit == FOLDED
        aliasing = folded and (node.op in MOVEMENT_OPS or node.op in QDQ_OPS) and acts
        for o in node.outputs:
            if not o.name:
                continue
            if aliasing:
                alias[o.name] = root(acts[0].name)
                continue
            if folded:
                continue  # compile-time constant
            b = _nbytes(o, int8_domain(o))
            if b is None:
                unknown += 1
                b = 0
            size[o.name] = b
            start[o.name] = step
            end[o.name] = step
    last = len(view.nodes) + 1
    for t in view.graph.outputs:
        r = root(t.name)
        if r in start:
            end[r] = last
    events: dict[int, int] = {}
    for name, s in start.items():
        events[s] = events.get(s, 0) + size[name]
        events[end[name] + 1] = events.get(end[name] + 1, 0) - size[name]
    live = peak = 0
    peak_step = 0
    for step in sorted(events):
        live += events[step]
        if live > peak:
            peak, peak_step = live, step
    largest = max(size, key=lambda k: size[k], default=None)
    wbytes = weights_bytes(view)
    fit = fit_activations(pools, activation_bytes=peak, weights_bytes=wbytes)
    onchip = sum(p.size_bytes for p in pools if p.enabled and p.writable and p.on_chip)
    rows = tuple(
        {"pool": a.pool, "kind": a.kind, "bytes": a.bytes, "on_chip": a.on_chip} for a in fit.allocations
    )
    peak_node = view.nodes[peak_step - 1].name if 0 < peak_step <= len(view.nodes) else None
    return MemoryEstimate(
        weights_bytes=wbytes,
        peak_activation_bytes=peak,
        peak_at=peak_node,
        largest_tensor=largest,
        largest_tensor_bytes=size.get(largest, 0) if largest else 0,
        onchip_bytes=onchip,
        fits_on_chip=fit.activations_external == 0 and fit.unallocated_activation_bytes == 0,
        external_bytes=fit.activations_external + fit.unallocated_activation_bytes,
        unallocated_bytes=fit.unallocated_bytes,
        pools=rows,
        unknown_tensors=unknown,
    )
