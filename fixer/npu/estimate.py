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
   ``weights_extra_epoch_bytes`` takes one more HW epoch (INF, see the profile); a non-depthwise Conv
   wider than the native kernel width takes one HW epoch per band of ``conv_kernel_h_native`` kernel
   rows plus ``wide_kernel_sum_epochs`` summing epochs, into which a core's ``fuse_ops`` do not fuse.
5. Every SW node is one SW epoch, conversions included (a DequantizeLinear or QuantizeLinear that runs
   in SW is its own epoch), except the float prologue of a graph input: data movement on the float
   input and the QuantizeLinear that ends it are one SW epoch. An op whose table entry has
   ``reported_as`` is named that way (an activation x activation MatMul is reported as ``Conv``, one
   epoch per batch slice).
6. Lowerings (profile ``lowerings``): the compiler inserts ops of its own, each a SW epoch: nearest
   upsampling becomes one DepthToSpace epoch (instead of a HW epoch), a ConvTranspose makes two HW epochs
   (an Identity copy, a crop/pad Conv) and a zero-inserting Concat + DepthToSpace, a dilated Conv is wrapped in SpaceToDepth -> Conv -> DepthToSpace, a Conv whose stride
   exceeds its kernel or the native stride is preceded by a SpaceToDepth, a channel Pad becomes
   Transpose -> (Identity copy, Pad as a HW Conv) -> Transpose, whose leading Transpose joins the HW
   epoch of a pool feeding the Pad where the core's ``channel_pad_hw_transpose_channels`` divides the
   channel count (INF).
7. Per core version (profile ``cores``): a SW epoch whose op the core lists in ``hybrid_ops`` (int8
   kernel, or inserted by a lowering) is a *hybrid* epoch; with ``float_suffix`` the report names float
   kernels ``Op(float)``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from .. import ir

from ..graph import MOVEMENT_OPS, GraphView
from .placement import FOLDED, HW, SW, Placement
from .profile import TargetProfile

if TYPE_CHECKING:
    from .latency import LatencyEstimate


HYBRID = "hybrid"


@dataclass
class Epoch:
    index: int
    unit: str  # HW | SW | hybrid
    nodes: list[str] = field(default_factory=list)  # the model node(s) the epoch comes from
    ops: list[str] = field(default_factory=list)
    reported_as: str = ""  # the op name the stedgeai report prints for a SW/hybrid epoch
    inserted: bool = False  # an op the compiler inserts when lowering the model node(s)
    lowering: str = ""  # the profile lowering that inserted it


@dataclass(frozen=True)
class EpochEstimate:
    epochs: int
    sw_epochs: int
    groups: tuple[Epoch, ...]
    hybrid_epochs: int = 0
    core: str = ""
    latency: "LatencyEstimate | None" = None  # estimated time (fixer.npu.latency), set by the analysis

    @property
    def latency_ms(self) -> float | None:
        """Estimated ms per inference (nafix's cost model), None when not estimated."""
        return None if self.latency is None else self.latency.ms

    @property
    def hw_epochs(self) -> int:
        return self.epochs - self.sw_epochs - self.hybrid_epochs

    @property
    def hw_ratio(self) -> float:
        """Share of epochs that are not pure SW (hybrid epochs count as offloaded, as in the reports)."""
        return 1.0 if self.epochs == 0 else (self.epochs - self.sw_epochs) / self.epochs

    @property
    def sw_ops(self) -> Counter:
        return Counter(g.reported_as for g in self.groups if g.unit == SW)

    @property
    def hybrid_ops(self) -> Counter:
        return Counter(g.reported_as for g in self.groups if g.unit == HYBRID)

    def as_dict(self) -> dict:
        return {
            "epochs": self.epochs,
            "sw_epochs": self.sw_epochs,
            "hybrid_epochs": self.hybrid_epochs,
            "hw_epochs": self.hw_epochs,
            "hw_ratio": round(self.hw_ratio, 4),
            "sw_ops": dict(sorted(self.sw_ops.items())),
            "hybrid_ops": dict(sorted(self.hybrid_ops.items())),
            "core": self.core,
            **({} if self.latency is None else {"latency_ms": round(self.latency.ms, 3),
                                                 "latency": self.latency.as_dict()}),
        }


def estimate_epochs(view: GraphView, placement: Placement, profile: TargetProfile, *, domain=None) -> EpochEstimate:
    """The epochs stedgeai would make of ``view`` placed as ``placement``. ``domain``: the view's
    :class:`~fixer.npu.placement.QuantDomain` (unchanged since it was built), whose activation lists
    are read instead of computing them again."""
    by_name = placement.by_name
    activations = domain.activations if domain is not None and domain.view is view else view.activations
    groups: list[Epoch] = []
    tensor_epoch: dict[str, int] = {}  # tensor -> index of the HW epoch that computed it
    summed: set[int] = set()  # epochs that sum the partial results of a decomposed wide-kernel Conv

    def new(unit: str, node) -> int:
        groups.append(Epoch(len(groups) + 1, unit, [node.name], [node.op]))
        return len(groups) - 1

    def inserted(op: str, node, low: str) -> int:
        groups.append(Epoch(len(groups) + 1, SW, [node.name], [op], reported_as=op, inserted=True, lowering=low))
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

    from .placement import source_format

    tflite = source_format(view.model) == "tflite"
    copies = int(profile.limits["input_copy_epochs"].value) if "input_copy_epochs" in profile.limits else 0
    big = profile.limits.get("weights_extra_epoch_bytes")
    if copies:
        for t in view.graph.inputs:
            if isinstance(t, ir.Constant) or not t.outputs:
                continue
            first = [c for c in _first_readers(view, t) if by_name[c.name].unit != FOLDED]
            float_sw = all(by_name[c.name].unit == SW and c.op not in ("QuantizeLinear", "DequantizeLinear")
                           and by_name[c.name].kernel == "float" for c in first)
            if first and all(c.op != "Transpose" for c in first) and not float_sw:
                for _ in range(copies):
                    groups.append(Epoch(len(groups) + 1, HW, [f"input copy of '{t.name}'"], ["Identity"]))

    for node in view.nodes:
        p = by_name[node.name]
        acts = activations(node)
        if p.unit == FOLDED:
            if node.op in MOVEMENT_OPS or node.op in ("QuantizeLinear", "DequantizeLinear"):
                for t in acts[:1]:
                    if t.name in tensor_epoch:
                        for o in node.outputs:
                            tensor_epoch[o.name] = tensor_epoch[t.name]
            continue
        if p.unit == SW and node.op in ("Resize", "Upsample") and lowering_of(view, node, profile) == "upsample_nearest":
            # nearest upsampling is lowered to DepthToSpace whatever its coordinate mode (st_yolo_x 3.0:
            # two RESIZE_NEAREST -> two hybrid DepthToSpace, no Resize epoch)
            inserted(profile.lowerings["upsample_nearest"].inserts[0], node, "upsample_nearest")
            continue
        if p.unit == SW:
            if p.role == "graph-input conversion":
                src = view.source(node.inputs[0])
                if src is not None and by_name[src.name].unit == SW and src.name in _group_index(groups):
                    idx = _group_index(groups)[src.name]
                    groups[idx].nodes.append(node.name)
                    groups[idx].ops.append(node.op)
                    continue
            rule = profile.operators.get(node.op)
            lowered = profile.core.sw_lowered.get(node.op) if profile.core is not None else None
            if lowered:
                for op in lowered:
                    idx = new(SW, node)
                    groups[idx].ops, groups[idx].reported_as = [op], op
                continue
            around = _matmul_reshape_epochs(view, node, profile)
            if around:
                new(HW, node)  # the operands reshaped to the conv layout (matmul_float_OE c_info)
            n_sw = _requantize_readers(view, node) if p.role == "conversion" else _sw_slices(view, node, rule)
            for _ in range(n_sw):
                idx = new(SW, node)
                if rule is not None and rule.reported_as:
                    groups[idx].reported_as = rule.reported_as
            for _ in range(around - 1 if around else 0):
                new(HW, node)  # the product reshaped back
            continue
        low = lowering_of(view, node, profile)
        if low == "upsample_nearest":
            idx = inserted(profile.lowerings[low].inserts[0], node, low)
            continue  # the outputs come from a SW/hybrid epoch: nothing fuses into it
        if low in ("dilated_conv", "conv_stride_beyond_kernel"):
            inserted(profile.lowerings[low].inserts[0], node, low)
        if low == "global_depthwise_decomposed":
            kh = int(_kernel(node)[0])
            for _ in range(-(-kh // int(profile.limit("conv_kernel_h_native")))):
                for op in profile.lowerings[low].inserts:
                    inserted(op, node, low)
        rule = profile.operators.get(node.op)
        kind = rule.epoch if rule else "compute"
        if profile.core is not None and node.op in profile.core.fuse_ops:
            kind = "fuse"
        extra = rule.extra_epochs if rule else 0
        if low == "channel_pad":
            first, last = profile.lowerings[low].inserts[0], profile.lowerings[low].inserts[-1]
            pool_epoch = _pool_epoch_taking_transpose(view, node, profile, tensor_epoch)
            if pool_epoch is not None and groups[pool_epoch].unit == HW:
                # the leading Transpose runs in the pool's HW epoch (c_info: 'MaxPool_62 | Transpose_63', NODE_HW)
                groups[pool_epoch].nodes.append(node.name)
                groups[pool_epoch].ops.append(first)
            else:
                inserted(first, node, low)
            new(HW, node)  # an Identity copy, then the padding itself as a HW Conv (c_info:
            new(HW, node)  # 'Pad_33_conv_identity' -> 'Pad_33 Node kind=Conv', face_landmark; blazeface alike)
            inserted(last, node, low)
            continue
        if kind == "none":
            if extra and not _absorbed(view, node):
                for _ in range(extra):
                    idx = new(HW, node)
                for o in node.outputs:
                    tensor_epoch[o.name] = idx
            continue
        prelu_copy = profile.limits.get("tflite_prelu_copy_epochs")
        if node.op == "PRelu" and prelu_copy is not None and tflite and _feeds_conv(view, node):
            extra += int(prelu_copy.value)
        mul_extra = profile.limits.get("mul_activations_extra_epochs")
        if node.op == "Mul" and mul_extra is not None and len(acts) == 2:
            extra += int(mul_extra.value)
        if kind == "fuse":
            joined = None
            core_fused = rule is not None and rule.epoch != "fuse"  # fused by the core's fuse_ops only
            for t in acts:
                e = tensor_epoch.get(t.name)
                if core_fused and e in summed:
                    continue  # not into the summing epoch of a decomposed Conv (magnus 7x7, 4.0.0: 5 epochs)
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
        bands = _wide_kernel_bands(node, profile)
        if bands:
            for _ in range(bands - 1):
                idx = new(HW, node)
            for _ in range(int(profile.limit("wide_kernel_sum_epochs"))):
                idx = new(HW, node)
                summed.add(idx)
        if big is not None and _weight_bytes(view, node) >= big.value:
            extra += 1
        dw_extra = profile.limits.get("depthwise_decomposed_extra_epochs")
        if dw_extra is not None and _tall_depthwise(node, profile):
            extra += int(dw_extra.value)
        for _ in range(extra):
            idx = new(HW, node)
        if low == "conv_transpose":
            # zero insertion (a Concat with zeros + DepthToSpace), then a HW Identity copy and a crop/pad Conv
            # before the ConvTranspose's own Conv (PP-OCRv4 det 2.2 c_info, both ConvTransposes)
            zi = profile.limits.get("conv_transpose_zero_insert_epochs")
            for _ in range(int(zi.value) if zi is not None else 0):
                new(HW, node)
            for op in profile.lowerings[low].inserts:
                inserted(op, node, low)
            continue  # the output comes from a SW/hybrid epoch
        if low == "dilated_conv":
            inserted(profile.lowerings[low].inserts[-1], node, low)
            continue  # the output comes from a SW/hybrid epoch
        for o in node.outputs:
            tensor_epoch[o.name] = idx

    core = profile.core
    for g in groups:
        if g.unit != SW:
            continue
        p = by_name.get(g.nodes[0])
        base = g.reported_as or g.ops[0]
        float_kernel = not g.inserted and p is not None and p.kernel == "float"
        suffix = core is not None and core.float_suffix and float_kernel and base not in _NEVER_SUFFIXED
        g.reported_as = f"{base}(float)" if suffix else base
        if core is not None and base in core.hybrid_ops and (g.inserted or (p is not None and p.kernel == "int8")):
            g.unit = HYBRID
    for i, g in enumerate(groups):
        g.index = i + 1
    sw = sum(1 for g in groups if g.unit == SW)
    hybrid = sum(1 for g in groups if g.unit == HYBRID)
    return EpochEstimate(epochs=len(groups), sw_epochs=sw, groups=tuple(groups), hybrid_epochs=hybrid,
                         core=profile.core_version)


def lowering_unit(profile: TargetProfile, lowering: str) -> str | None:
    """The kind of epoch (``SW`` or ``hybrid``) the ops a lowering inserts make on the profile's core,
    or None when the profile has no such lowering."""
    low = profile.lowerings.get(lowering)
    if low is None:
        return None
    core = profile.core
    return HYBRID if core is not None and all(op in core.hybrid_ops for op in low.inserts) else SW


def lowering_note(profile: TargetProfile, lowering: str) -> str:
    """One sentence for near-misses: what the compiler does with the pattern on this core."""
    low = profile.lowerings[lowering]
    unit = lowering_unit(profile, lowering)
    kind = "hybrid" if unit == HYBRID else "pure SW"
    epochs = f"{kind} epochs" if len(low.inserts) > 1 else f"a {kind} epoch"
    return f"stedgeai core {profile.core_version or '?'} lowers it with {' + '.join(low.inserts)}, {epochs} [{low.tag}]"


def lowering_hybrid_cores(profile: TargetProfile, lowering: str) -> list[str]:
    """The core versions of the profile on which every op the lowering inserts runs as a hybrid epoch."""
    low = profile.lowerings.get(lowering)
    if low is None:
        return []
    return [c.version for c in profile.cores if all(op in c.hybrid_ops for op in low.inserts)]


#: conversions the reports never mark "(float)"
_NEVER_SUFFIXED = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast"})


def _sw_slices(view: GraphView, node, rule) -> int:
    """SW epochs one SW node makes: one, or one per batch slice for an op the compiler lowers to
    ``reported_as`` per slice (an activation x activation MatMul becomes one Conv per head: yolov11n,
    2 batched MatMuls -> 4 SW Conv epochs, INF)."""
    if rule is None or not rule.reported_as or node.op != "MatMul" or not node.outputs:
        return 1
    shape = node.outputs[0].shape
    if shape is None or len(shape) < 3 or not all(isinstance(d, int) and d > 0 for d in shape[:-2]):
        return 1
    return max(1, int(np.prod(shape[:-2])))


def _requantize_readers(view: GraphView, node) -> int:
    """SW epochs of a QuantizeLinear that re-quantizes a float SW op's output: one per op reading the
    quantized tensor (through its DequantizeLinear), at least one (yolov8n micro and yolov11n, 4.0.1: the float
    'Sub(float)' read by an Add and a Sub is followed by 2 SW QuantizeLinear epochs; OBS)."""
    if node.op != "QuantizeLinear" or not node.outputs:
        return 1
    readers = set()
    for c, _ in view.sinks(node.outputs[0]):
        if c is not None and c.op == "DequantizeLinear":
            readers.update(d.name if d is not None else "<output>" for d, _ in view.sinks(c.outputs[0]))
        else:
            readers.add(c.name if c is not None else "<output>")
    return max(1, len(readers))


def _matmul_reshape_epochs(view: GraphView, node, profile: TargetProfile) -> int:
    """HW epochs (``activation_matmul_reshape_epochs``: 0 or 2, one before, the rest after) around a SW
    Gemm/MatMul of two activations whose operands are rank 2 (matmul_float_OE c_info: reshape_x/reshape_w,
    then the SW Conv, then squeeze_y)."""
    lim = profile.limits.get("activation_matmul_reshape_epochs")
    if lim is None or int(lim.value) <= 0 or node.op not in ("Gemm", "MatMul") or len(node.inputs) < 2:
        return 0
    a, b = node.inputs[0], node.inputs[1]
    if view.is_const_like(b) or any(t.shape is None or len(t.shape) != 2 for t in (a, b)):
        return 0
    return int(lim.value)


def _pool_epoch_taking_transpose(view: GraphView, node, profile: TargetProfile, tensor_epoch: dict) -> int | None:
    """The HW epoch of the pool that feeds a channel-padding ``node`` when the core runs the lowering's
    leading Transpose in that epoch: the Pad's input (through Q/DQ) is a MaxPool/AveragePool output and
    its channel count is a multiple of the profile's ``channel_pad_hw_transpose_channels`` (0: never)."""
    lim = profile.limits.get("channel_pad_hw_transpose_channels")
    if lim is None or int(lim.value) <= 0 or not node.inputs:
        return None
    x = node.inputs[0]
    src = view.source(x)
    while src is not None and src.op in ("QuantizeLinear", "DequantizeLinear"):
        src = view.source(src.inputs[0])
    if src is None or src.op not in ("MaxPool", "AveragePool"):
        return None
    shape = x.shape
    c = shape[3 if _nhwc(view, node) else 1] if shape is not None and len(shape) == 4 else None
    if not isinstance(c, int) or c <= 0 or c % int(lim.value):
        return None
    return tensor_epoch.get(x.name)


def _feeds_conv(view: GraphView, node) -> bool:
    """Some reader of ``node``'s output, through Q/DQ and data movement, is a Conv."""
    through = MOVEMENT_OPS | {"QuantizeLinear", "DequantizeLinear"}
    return any(c is not None and c.op in ("Conv", "QLinearConv")
               for o in node.outputs for c, _ in view.sinks(o, through=through))


def _wide_kernel_bands(node, profile: TargetProfile) -> int:
    """HW passes of a (non-depthwise) Conv whose kernel is wider than the native width: one per band of at
    most ``conv_kernel_h_native`` kernel rows; 0 when the Conv is not decomposed (or the profile has no
    ``wide_kernel_sum_epochs``)."""
    if node.op not in ("Conv", "QLinearConv") or int(node.attrs.get("group", 1)) != 1:
        return 0
    if "wide_kernel_sum_epochs" not in profile.limits:
        return 0
    ks = _kernel(node)
    if len(ks) != 2 or not all(isinstance(k, int) for k in ks):
        return 0
    strides = _ints(node.attrs.get("strides"), 2, 1)
    wmax = profile.limits.get("conv_kernel_w_native_stride1" if strides[1] == 1 else "conv_kernel_w_native_stride2")
    hmax = profile.limits.get("conv_kernel_h_native")
    if wmax is None or hmax is None or ks[1] <= wmax.value:
        return 0
    return -(-int(ks[0]) // int(hmax.value))


def _tall_depthwise(node, profile: TargetProfile) -> bool:
    """A depthwise Conv whose kernel is taller than the native window: the compiler splits it into
    sub-mask convolutions fed by an Identity copy."""
    if node.op not in ("Conv", "QLinearConv") or int(node.attrs.get("group", 1)) <= 1:
        return False
    w = _weight(node)
    ks = _kernel(node)
    native = profile.limits.get("conv_kernel_h_native")
    return (w is not None and w.shape is not None and len(w.shape) == 4 and w.shape[1] == 1 and bool(ks)
            and isinstance(ks[0], int) and native is not None and ks[0] > native.value)


def _nhwc(view: GraphView, node) -> bool:
    """True when ``node`` works on NHWC data: a TFLite import places its ops before the layout Transpose
    (perm [0, 3, 1, 2]) that turns the input to NCHW."""
    for c, _ in view.sinks(node.outputs[0], through=frozenset({"QuantizeLinear", "DequantizeLinear"})):
        if c is not None and c.op == "Transpose" and [int(p) for p in c.attrs.get("perm", [])] == [0, 3, 1, 2]:
            return True
    return False


def _weight(node):
    i = 3 if node.op.startswith("QLinear") else 1
    return node.inputs[i] if len(node.inputs) > i else None


def _kernel(node) -> list:
    w = _weight(node)
    return list(node.attrs.get("kernel_shape") or (w.shape[2:] if w is not None and w.shape is not None else []))


def _ints(v, n: int, default: int) -> list[int]:
    out = [int(x) for x in v] if v is not None else []
    return out if len(out) == n else [default] * n


def lowering_of(view: GraphView, node, profile: TargetProfile) -> str | None:
    """Which of the profile's lowerings stedgeai applies to this HW node (None: none).

    ``upsample_nearest``: a nearest Resize/Upsample with integer scales > 1 on the spatial axes;
    ``conv_transpose``: a ConvTranspose with stride > 1; ``dilated_conv``: a Conv with a dilation > 1;
    ``conv_stride_beyond_kernel``: a Conv whose stride exceeds its kernel or ``conv_stride_native``;
    ``channel_pad``: a rank-4 Pad on the channel axis (Transpose -> Pad -> Transpose);
    ``global_depthwise_decomposed``: a depthwise Conv taller and wider than the native kernel over its whole
    input (a 7x7 one: SW; a 7x6 one ran on the NPU as sub-mask convs, MobileFaceNet per-channel 2.1 c_info).
    """
    lows = profile.lowerings
    if not lows:
        return None
    op = node.op
    if op in ("Resize", "Upsample") and "upsample_nearest" in lows:
        from .constraints import resize_scales

        mode = node.attrs.get("mode", "nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        x = node.inputs[0].shape
        if x is not None and len(x) == 4 and list(x[2:]) == [1, 1]:
            return None  # a broadcast of one pixel: a HW 'tile' (fallguard SSD, OBS)
        if mode == "nearest":
            ctx = type("_Ctx", (), {"view": view})()
            scales = resize_scales(node, ctx)
            if scales and len(scales) >= 3 and any(s > 1 for s in scales[2:]):
                return "upsample_nearest"
        return None
    if op == "ConvTranspose" and "conv_transpose" in lows:
        strides = node.attrs.get("strides")
        if strides is not None and any(int(s) > 1 for s in strides):
            return "conv_transpose"
        return None
    if op == "Pad" and "channel_pad" in lows:
        pads = node.attrs.get("pads")
        if pads is None and len(node.inputs) > 1 and node.inputs[1].name:
            v = view.const_value(node.inputs[1])
            pads = None if v is None else [int(x) for x in np.ravel(v)]
        x = node.inputs[0].shape
        c = 3 if _nhwc(view, node) else 1
        if pads is not None and x is not None and len(x) == 4 and len(pads) == 8 and (int(pads[c]) or int(pads[c + 4])):
            return "channel_pad"
        return None
    if op not in ("Conv", "QLinearConv"):
        return None
    w = _weight(node)
    ks = _kernel(node)
    if not ks:
        return None
    n = len(ks)
    dil = _ints(node.attrs.get("dilations"), n, 1)
    if any(d > 1 for d in dil) and "dilated_conv" in lows:
        return "dilated_conv"
    group = int(node.attrs.get("group", 1))
    x, y = node.inputs[0].shape, node.outputs[0].shape if node.outputs else None
    if ("global_depthwise_decomposed" in lows and group > 1 and w is not None and w.shape is not None
            and len(w.shape) == 4 and w.shape[1] == 1 and isinstance(ks[0], int)
            and ks[0] > profile.limits["conv_kernel_h_native"].value
            and len(ks) == 2 and isinstance(ks[1], int) and "conv_kernel_w_native_stride1" in profile.limits
            and ks[1] > profile.limits["conv_kernel_w_native_stride1"].value
            and x is not None and len(x) == 4 and list(x[2:]) == [int(k) for k in ks]
            and y is not None and len(y) == 4 and list(y[2:]) == [1, 1]):
        return "global_depthwise_decomposed"
    strides = _ints(node.attrs.get("strides"), n, 1)
    native = profile.limits.get("conv_stride_native")
    if "conv_stride_beyond_kernel" in lows and any(
        s > max(int(k), 1) or (native is not None and s > native.value) for s, k in zip(strides, ks) if isinstance(k, int)
    ):
        return "conv_stride_beyond_kernel"
    return None


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
    shape = w.shape
    if shape is None:
        return 0
    n = 1
    for d in shape:
        if not isinstance(d, int):
            return 0
        n *= d
    if not -2**63 <= n < 2**63:  # np.prod in int64 wraps around there: keep its figure
        n = int(np.prod(shape))
    return n


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
