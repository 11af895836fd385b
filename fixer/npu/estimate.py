"""Epoch estimate: what stedgeai will print as "Total number of epochs: N of which M implemented in
software", computed from the placement.

The rule (kept in step with the README's "How epochs are estimated"):

1. Folded nodes (constants, data movement, Q/DQ between quantized ops) add no epoch.
2. A HW node whose operator-table ``epoch`` is ``compute`` (Conv, Gemm, MatMul, pools, Transpose,
   Resize, ...) starts a HW epoch.
3. A HW node whose ``epoch`` is ``fuse`` (activations, element-wise ops, folded BatchNormalization)
   joins the epoch of the HW node that produces one of its inputs when that tensor has no other user
   (Conv + Relu, Conv + residual Add); otherwise it starts its own HW epoch.
4. A HW node whose ``epoch`` is ``none`` (Concat, Split, Slice, Pad) adds no epoch: the compiler
   writes or reads slices of neighbouring buffers. A Pad that no Conv/pool absorbs into its padding
   costs ``extra_epochs`` HW epochs instead (two in a real MediaPipe report).
4b. ``extra_epochs`` on a compute/fuse op adds that many HW epochs after it (PRelu is lowered as
   Relu/Clip/Mul then Mul/Add, two epochs).
4c. Each graph input whose first reader is not a Transpose gets ``input_copy_epochs`` HW epochs (the
   compiler's 'Identity_inserted' input copy); a Conv/Gemm/MatMul whose int8 weights reach
   ``weights_extra_epoch_bytes`` takes one more HW epoch (INF, see the profile).
5. Every SW node is one SW epoch, conversions included (a DequantizeLinear or QuantizeLinear that runs
   in SW is its own epoch), except the float prologue of a graph input: data movement on the float
   input and the QuantizeLinear that ends it are one SW epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import MOVEMENT_OPS, GraphView
from .placement import FOLDED, HW, SW, Placement
from .profile import TargetProfile


@dataclass
class Epoch:
    index: int
    unit: str  # HW | SW
    nodes: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EpochEstimate:
    epochs: int
    sw_epochs: int
    groups: tuple[Epoch, ...]

    @property
    def hw_epochs(self) -> int:
        return self.epochs - self.sw_epochs

    @property
    def hw_ratio(self) -> float:
        return 1.0 if self.epochs == 0 else (self.epochs - self.sw_epochs) / self.epochs

    def as_dict(self) -> dict:
        return {
            "epochs": self.epochs,
            "sw_epochs": self.sw_epochs,
            "hw_epochs": self.hw_epochs,
            "hw_ratio": round(self.hw_ratio, 4),
        }


def estimate_epochs(view: GraphView, placement: Placement, profile: TargetProfile) -> EpochEstimate:
    by_name = placement.by_name
    groups: list[Epoch] = []
    tensor_epoch: dict[str, int] = {}  # tensor -> index of the HW epoch that computed it

    def new(unit: str, node) -> int:
        groups.append(Epoch(len(groups) + 1, unit, [node.name], [node.op]))
        return len(groups) - 1

    def real_users(t) -> int:
        n = 0
        for c, _ in view.sinks(t):
            if c is None:
                n += 1
            elif by_name[c.name].unit == FOLDED and c.op in ("QuantizeLinear", "DequantizeLinear"):
                n += sum(1 for _ in _through_qdq(view, by_name, c))
            else:
                n += 1
        return n

    copies = int(profile.limits["input_copy_epochs"].value) if "input_copy_epochs" in profile.limits else 0
    big = profile.limits.get("weights_extra_epoch_bytes")
    if copies:
        for t in view.graph.inputs:
            if isinstance(t, gs.Constant) or not t.outputs:
                continue
            first = [c for c in _first_readers(view, t) if by_name[c.name].unit != FOLDED]
            float_sw = all(by_name[c.name].unit == SW and c.op not in ("QuantizeLinear", "DequantizeLinear")
                           and by_name[c.name].kernel == "float" for c in first)
            if first and all(c.op != "Transpose" for c in first) and not float_sw:
                for _ in range(copies):
                    groups.append(Epoch(len(groups) + 1, HW, [f"input copy of '{t.name}'"], ["Identity"]))

    for node in view.nodes:
        p = by_name[node.name]
        acts = [t for t in node.inputs if t.name and not view.is_const(t)]
        if p.unit == FOLDED:
            if node.op in MOVEMENT_OPS or node.op in ("QuantizeLinear", "DequantizeLinear"):
                for t in acts[:1]:
                    if t.name in tensor_epoch:
                        for o in node.outputs:
                            tensor_epoch[o.name] = tensor_epoch[t.name]
            continue
        if p.unit == SW:
            if p.role == "graph-input conversion":
                src = view.source(node.inputs[0])
                if src is not None and by_name[src.name].unit == SW and src.name in _group_index(groups):
                    idx = _group_index(groups)[src.name]
                    groups[idx].nodes.append(node.name)
                    groups[idx].ops.append(node.op)
                    continue
            new(SW, node)
            continue
        rule = profile.operators.get(node.op)
        kind = rule.epoch if rule else "compute"
        extra = rule.extra_epochs if rule else 0
        if kind == "none":
            if extra and not _absorbed(view, node):
                for _ in range(extra):
                    idx = new(HW, node)
                for o in node.outputs:
                    tensor_epoch[o.name] = idx
            continue
        if kind == "fuse":
            joined = None
            for t in acts:
                e = tensor_epoch.get(t.name)
                if e is not None and groups[e].unit == HW and real_users(view.source_tensor(t)) == 1:
                    joined = e
                    break
            if joined is not None:
                groups[joined].nodes.append(node.name)
                groups[joined].ops.append(node.op)
                idx = joined
                for _ in range(extra):
                    idx = new(HW, node)
                for o in node.outputs:
                    tensor_epoch[o.name] = idx
                continue
        idx = new(HW, node)
        if big is not None and _weight_bytes(view, node) >= big.value:
            extra += 1
        for _ in range(extra):
            idx = new(HW, node)
        for o in node.outputs:
            tensor_epoch[o.name] = idx

    sw = sum(1 for g in groups if g.unit == SW)
    return EpochEstimate(epochs=len(groups), sw_epochs=sw, groups=tuple(groups))


def _first_readers(view: GraphView, t) -> list:
    """The first nodes that read ``t``, looking through data movement and Q/DQ."""
    out, stack, seen = [], [t], set()
    while stack:
        cur = stack.pop()
        for c, _ in view.sinks(cur):
            if c is None or c.name in seen:
                continue
            seen.add(c.name)
            if c.op in ("QuantizeLinear", "DequantizeLinear"):
                stack.extend(c.outputs)
            else:
                out.append(c)
    return out


def _weight_bytes(view: GraphView, node) -> int:
    """Bytes of a Conv/Gemm/MatMul weight as the NPU stores it (int8: one byte per element)."""
    if node.op not in ("Conv", "ConvTranspose", "Gemm", "MatMul", "QLinearConv", "QLinearMatMul"):
        return 0
    idx = 3 if node.op.startswith("QLinear") else 1
    if len(node.inputs) <= idx:
        return 0
    w = node.inputs[idx]
    if w.shape is None or not all(isinstance(d, int) for d in w.shape):
        return 0
    return int(np.prod(w.shape)) if w.shape else 1


_ABSORBS_PADDING = frozenset({"Conv", "QLinearConv", "MaxPool", "AveragePool", "ConvTranspose"})


def _absorbed(view: GraphView, node) -> bool:
    """A Pad whose every user is a Conv/pool: the compiler folds it into their padding."""
    users = [c for c, _ in view.sinks(node.outputs[0])]
    seen = []
    for c in users:
        while c is not None and c.op in ("QuantizeLinear", "DequantizeLinear"):
            nxt = [d for d, _ in view.sinks(c.outputs[0])]
            c = nxt[0] if len(nxt) == 1 else None
        seen.append(c)
    return bool(seen) and all(c is not None and c.op in _ABSORBS_PADDING for c in seen)


def _group_index(groups: list[Epoch]) -> dict[str, int]:
    return {n: i for i, g in enumerate(groups) for n in g.nodes}


def _through_qdq(view: GraphView, by_name, node):
    """Users of a folded Q/DQ node's output, looking through further folded Q/DQ nodes."""
    for c, _ in view.sinks(node.outputs[0]):
        if c is not None and by_name[c.name].unit == FOLDED and c.op in ("QuantizeLinear", "DequantizeLinear"):
            yield from _through_qdq(view, by_name, c)
        else:
            yield c
