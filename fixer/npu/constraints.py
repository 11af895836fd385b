"""NPU constraints: what the Neural-ART NPU can run, one small function each.

Each constraint is ``(node, ctx) -> Verdict``. Its docstring, formatted with the live limits of the
target profile, is the requirement sentence shown to users; the verdict's detail says what was
observed on the node, naming it in quotes. ``severity`` says what a failure means:

- ``sw``: the node falls back to a SW epoch on the Cortex-M55;
- ``note``: the node stays on the NPU but runs slower (decomposed, split);
- ``compile_error``: stedgeai is known to fail on it;
- ``hang``: it compiles with no SW epoch but is known to hang the board.

The fact behind each constraint, with its source, is in docs/NPU_FACTS.md; the anchor of each id is
in :data:`fixer.facts.CONSTRAINT_ANCHORS` (SARIF's ``helpUri`` uses it), and a test checks that every
registered constraint has one and that every anchor exists.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
from .. import ir

from ..graph import MOVEMENT_OPS, QDQ_OPS, node_label

if TYPE_CHECKING:  # pragma: no cover
    from .placement import PlacementContext

SEVERITIES = ("sw", "note", "compile_error", "hang")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str = ""


OK = Verdict(True)


@dataclass(frozen=True)
class Constraint:
    id: str
    func: Callable[[ir.Node, "PlacementContext"], Verdict]
    tag: str
    severity: str
    template: str
    #: the ops it can fail on (None: any op); placement does not call it for other ops
    ops: frozenset[str] | None = None

    def requirement(self, values: dict) -> str:
        return self.template.format(**values)


REGISTRY: dict[str, Constraint] = {}

#: Constraints checked on every node the NPU could run (tier hw), before the op's own list.
GENERIC = ("static_shape", "rank_limit", "dim_limit", "quantized_activations", "int8_activations", "params_quantized")


def constraint(cid: str, *, tag: str, severity: str = "sw", ops: tuple[str, ...] | None = None):
    """Register a constraint function under ``cid``; its docstring is the requirement sentence.
    ``ops``: the only ops it can fail on, when it is one of the checks run for many ops (the function
    still checks the op itself: it may be called for any node)."""
    assert severity in SEVERITIES

    def deco(fn: Callable[[ir.Node, "PlacementContext"], Verdict]):
        if not fn.__doc__:
            raise TypeError(f"constraint {cid} needs a docstring: it is the requirement shown to users")
        REGISTRY[cid] = Constraint(cid, fn, tag, severity, " ".join(inspect.cleandoc(fn.__doc__).split()),
                                   frozenset(ops) if ops is not None else None)
        return fn

    return deco


_Constant = ir.Constant
_INTS = (int, np.integer)


def _q(node: ir.Node) -> str:
    return f"'{node_label(node)}'"


def _shape(t: ir.Tensor):
    return tuple(t.shape) if t.shape is not None else None


# --------------------------------------------------------------------------------------------
# Generic constraints
# --------------------------------------------------------------------------------------------


@constraint("static_shape", tag="3P", severity="compile_error")
def static_shape(node, ctx):
    """Every tensor of an NPU op must have a static shape (stedgeai needs static shapes; pin dynamic
    inputs with --input-shape)."""
    folded = ctx.view.folded
    bad = []
    # (view.is_static and view.is_const inline, the latter checked after the shape: most tensors are
    # static and this runs for every node)
    for tensors in (node.inputs, node.outputs):
        for t in tensors:
            if not t.name or type(t) is _Constant:
                continue
            shape = t.shape
            if shape is not None:
                for d in shape:
                    if not (isinstance(d, _INTS) and d >= 0):
                        break
                else:
                    continue  # static
            if not (t.inputs and t.inputs[0].name in folded):
                bad.append(t.name)
    if bad:
        return Verdict(False, f"{_q(node)} has tensors of unknown or dynamic shape: {', '.join(bad[:3])}")
    return OK


@constraint("rank_limit", tag="3P")
def rank_limit(node, ctx):
    """Tensors must have rank <= {max_rank}: the NPU's internal tensor model is 4-D and rank-5
    tensors crash atonn."""
    r = ctx.profile.limit("max_rank")
    for tensors in (node.inputs, node.outputs):
        for t in tensors:
            if type(t) is _Constant or not t.name:  # (before the shape: a Constant's is read from its proto)
                continue
            shape = t.shape
            if shape is not None and len(shape) > r and not ctx.view.is_const(t):
                return Verdict(False, f"{_q(node)} tensor '{t.name}' has rank {len(shape)} (shape {list(shape)})")
    return OK


@constraint("dim_limit", tag="3P")
def dim_limit(node, ctx):
    """Every tensor dimension must be below {max_dim_exclusive}."""
    m = ctx.profile.limit("max_dim")
    for tensors in (node.inputs, node.outputs):
        for t in tensors:
            if type(t) is _Constant or not t.name:
                continue
            shape = t.shape
            if shape is None:
                continue
            for d in shape:  # the first dimension over the limit (is_const asked only then)
                if isinstance(d, int) and d > m:
                    if not ctx.view.is_const(t):
                        return Verdict(False, f"{_q(node)} tensor '{t.name}' has a dimension of {d}")
                    break
    return OK


@constraint("quantized_activations", tag="DOC")
def quantized_activations(node, ctx):
    """The NPU runs only 8-bit quantized ops: every activation input must come from a
    DequantizeLinear (or an int8 tensor) and every output must reach a QuantizeLinear. Anything left
    in float runs in SW on the Cortex-M55."""
    domain = ctx.domain
    sourced, sunk = domain.sourced, domain.sunk
    floats_in = [t.name for t in domain.activations(node) if not sourced(t)]
    floats_out = [t.name for t in node.outputs if t.name and not sunk(t)]
    if floats_in or floats_out:
        parts = []
        if floats_in:
            parts.append(f"float input(s) {', '.join(floats_in[:2])}")
        if floats_out:
            parts.append(f"float output(s) {', '.join(floats_out[:2])}")
        return Verdict(False, f"{_q(node)} has {' and '.join(parts)} not covered by Q/DQ")
    return OK


@constraint("int8_activations", tag="3P", severity="compile_error")
def int8_activations(node, ctx):
    """Activations must be signed int8: stedgeai rejects uint8 activations ('quantized unsigned
    integer format is not supported'); re-quantize them to int8 (zero-point - 128, same scale)."""
    if not getattr(ctx.domain, "has_uint8", True):
        return OK  # no uint8 source or sink in the model
    bad = [t.name for t in ctx.domain.activations(node) if ctx.domain.uint8_source(t)]
    bad += [t.name for t in node.outputs if t.name and ctx.domain.uint8_sink(t)]
    if bad:
        return Verdict(False, f"{_q(node)} reads or writes uint8-quantized tensor(s) {', '.join(bad[:2])}")
    return OK


_WEIGHT_SLOTS = {"Conv": (1,), "ConvTranspose": (1,), "Gemm": (1,), "MatMul": (1,), "PRelu": (1,)}


@constraint("params_quantized", tag="OBS")
def params_quantized(node, ctx):
    """Constant weights of a quantized op must be quantized too (through a DequantizeLinear): an
    unquantized parameter makes stedgeai print 'WARNING: <tensor> is not quantized' and run the op in
    float as DequantizeLinear -> op -> QuantizeLinear, three SW epochs."""
    if ctx.oe_export:
        return OK  # ST's own export keeps quantization in a side _Q.json
    for i in _WEIGHT_SLOTS.get(node.op, ()):
        if i < len(node.inputs):
            t = node.inputs[i]
            if ctx.view.is_const(t) and np.dtype(t.dtype or np.float32).kind == "f" and ctx.domain.sourced_any(node):
                return Verdict(False, f"{_q(node)} parameter '{t.name}' is a float constant with no DequantizeLinear")
    return OK


# --------------------------------------------------------------------------------------------
# Op-specific constraints
# --------------------------------------------------------------------------------------------


@constraint("weights_constant", tag="3P")
def weights_constant(node, ctx):
    """The weights (second input) must be a constant: an activation x activation product runs in SW."""
    if len(node.inputs) > 1 and not ctx.view.is_const_like(node.inputs[1]):
        return Verdict(False, f"{_q(node)} multiplies two activations ('{node.inputs[0].name}' x '{node.inputs[1].name}')")
    return OK


@constraint("gemm_bias_constant", tag="3P", severity="compile_error")
def gemm_bias_constant(node, ctx):
    """Gemm's bias C must be a constant: a computed bias makes stedgeai fail with 'TOOL ERROR: list
    index out of range' (unfuse it into MatMul + Add)."""
    if len(node.inputs) > 2 and node.inputs[2].name and not ctx.view.is_const_like(node.inputs[2]):
        return Verdict(False, f"{_q(node)} has a computed bias '{node.inputs[2].name}'")
    return OK


def output_channels(node, ctx) -> int | None:
    """Output channels of a Conv/Gemm/MatMul-like node (None when unknown)."""
    op = node.op
    w = node.inputs[1] if len(node.inputs) > 1 else None
    if op in ("Conv", "ConvInteger", "QLinearConv", "ConvTranspose"):
        idx = 3 if op == "QLinearConv" else 1
        w = node.inputs[idx] if len(node.inputs) > idx else None
        shape = _shape(w) if w is not None else None
        if shape and isinstance(shape[0], int):
            if op == "ConvTranspose":
                group = int(node.attrs.get("group", 1))
                return int(shape[1]) * group if isinstance(shape[1], int) else None
            return int(shape[0])
    elif op in ("Gemm",):
        shape = _shape(w) if w is not None else None
        if shape and len(shape) == 2:
            return int(shape[0] if node.attrs.get("transB", 0) else shape[1])
    elif op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        idx = 3 if op == "QLinearMatMul" else 1
        w = node.inputs[idx] if len(node.inputs) > idx else None
        shape = _shape(w) if w is not None else None
        if shape and isinstance(shape[-1], int):
            return int(shape[-1])
    out = node.outputs[0] if node.outputs else None
    if out is not None and out.shape is not None and len(out.shape) >= 2 and isinstance(out.shape[1], int):
        return int(out.shape[1])
    return None


def channel_split_ok(channels: int, chunk_max: int) -> bool:
    """True when ``channels`` fits one chunk or splits into equal chunks of at most ``chunk_max``."""
    if channels <= chunk_max:
        return True
    smallest_parts = -(-channels // chunk_max)
    return any(channels % k == 0 for k in range(smallest_parts, channels // 2 + 1))


@constraint("awkward_output_channels", tag="INF")
def awkward_output_channels(node, ctx):
    """Output channels must number at most {channel_chunk_max}, or divide into equal chunks of at most
    {channel_chunk_max}: stedgeai fails to split large counts with no such divisor (257 fell back to
    SW; 144 + 113 ran on the NPU)."""
    c = output_channels(node, ctx)
    limit = int(ctx.profile.limit("channel_chunk_max"))
    if c is not None and not channel_split_ok(c, limit):
        extra = ""
        out = node.outputs[0] if node.outputs else None
        zp = ctx.domain.output_zero_point(out) if out is not None else None
        if zp not in (None, 0):
            extra = f"; its quantized output has zero-point {zp} ('scale-offset format')"
        return Verdict(False, f"{_q(node)} has {c} output channels, which has no divisor giving chunks <= {limit}{extra}")
    return OK


def input_channels(node, ctx) -> int | None:
    """Input channels of a group-1 Conv, or the reduction size K of a Gemm/MatMul (None when unknown)."""
    w = node.inputs[1] if len(node.inputs) > 1 else None
    shape = _shape(w) if w is not None else None
    if not shape:
        return None
    if node.op == "Conv":
        if int(node.attrs.get("group", 1)) != 1 or len(shape) < 2:
            return None
        d = shape[1]
    elif node.op == "Gemm":
        if len(shape) != 2:
            return None
        d = shape[1] if node.attrs.get("transB", 0) else shape[0]
    elif node.op == "MatMul":
        d = shape[0] if len(shape) == 1 else shape[-2]
    else:
        return None
    return int(d) if isinstance(d, int) else None


@constraint("awkward_input_channels", tag="INF", severity="note")
def awkward_input_channels(node, ctx):
    """Input channels (Conv) and the reduction size K (Gemm, MatMul) are best at most
    {channel_chunk_max} or divisible into equal chunks of at most {channel_chunk_max}. A published
    rewrite of the 257-channel denoiser also split 257 inputs into 86-wide chunks summed with Add, but
    the SW epochs in that compiler log were all layers with 257 output channels (257-input layers
    stayed on the NPU), so this is a performance note, not a SW fallback."""
    c = input_channels(node, ctx)
    limit = int(ctx.profile.limit("channel_chunk_max"))
    if c is not None and not channel_split_ok(c, limit):
        return Verdict(False, f"{_q(node)} has {c} input channels, which has no divisor giving chunks <= {limit}")
    return OK


@constraint("conv_kernel_native", tag="3P", severity="note")
def conv_kernel_native(node, ctx):
    """Conv kernels run natively up to {conv_kernel_h_native} rows and {conv_kernel_w_native_stride1}
    columns at stride 1 ({conv_kernel_w_native_stride2} at stride >= 2); larger kernels are
    decomposed into several HW passes (slower)."""
    ks = node.attrs.get("kernel_shape")
    if ks is None and len(node.inputs) > 1 and node.inputs[1].shape is not None and len(node.inputs[1].shape) == 4:
        ks = list(node.inputs[1].shape[2:])
    if not ks or len(ks) != 2:
        return OK
    kh, kw = int(ks[0]), int(ks[1])
    strides = node.attrs.get("strides", [1, 1])
    sw_ = int(strides[-1]) if strides else 1
    wmax = ctx.profile.limit("conv_kernel_w_native_stride1" if sw_ == 1 else "conv_kernel_w_native_stride2")
    if kh > ctx.profile.limit("conv_kernel_h_native") or kw > wmax:
        return Verdict(False, f"{_q(node)} has a {kh}x{kw} kernel at stride {sw_}")
    return OK


@constraint("conv_dilation", tag="3P", severity="note")
def conv_dilation(node, ctx):
    """Avoid dilated convolutions on the NPU: dilation is emulated and slower."""
    d = node.attrs.get("dilations")
    if d and any(int(x) != 1 for x in d):
        return Verdict(False, f"{_q(node)} has dilations {list(d)}")
    return OK


@constraint("line_buffer", tag="3P", severity="note")
def line_buffer(node, ctx):
    """An 8-bit feature line (width x input channels) should fit {line_buffer_elems} elements; wider
    lines are split by the compiler (slower)."""
    x = node.inputs[0]
    if x.shape is not None and len(x.shape) == 4 and all(isinstance(d, int) for d in x.shape[1:]):
        n = int(x.shape[1]) * int(x.shape[3])
        if n > ctx.profile.limit("line_buffer_elems"):
            return Verdict(False, f"{_q(node)} input line is {x.shape[3]} wide x {x.shape[1]} channels = {n} elements")
    return OK


@constraint("prelu_slope_quantized", tag="OBS")
def prelu_slope_quantized(node, ctx):
    """PRelu's slope must be a quantized constant (through a DequantizeLinear); with a float slope the
    op runs in SW: with an int8 kernel between Q -> DQ pairs (the per-channel QDQ MobileFaceNet, 2.1: 33 SW
    PRelu and no Q/DQ epoch), in float after a lone DequantizeLinear of a QLinearConv output (the QOperator
    MobileFaceNet: DequantizeLinear -> PRelu -> QuantizeLinear, three SW epochs)."""
    if ctx.oe_export or len(node.inputs) < 2:
        return OK
    s = node.inputs[1]
    if not ctx.view.is_const_like(s):
        return Verdict(False, f"{_q(node)} has a computed slope '{s.name}'")
    if ctx.view.is_const(s) and np.dtype(s.dtype or np.float32).kind == "f":
        return Verdict(False, f"{_q(node)} slope '{s.name}' is an unquantized float constant")
    return OK


def _broadcast_shapes(node):
    shapes = [_shape(t) for t in node.inputs if t.name]
    out = _shape(node.outputs[0]) if node.outputs else None
    return shapes, out


def _int_numel(shape) -> int:
    """``int(np.prod([d for d in shape if isinstance(d, int)] or [1]))`` without numpy's per-call cost
    (numpy's int64 figure where the product leaves the int64 range, as np.prod wraps there)."""
    n = 1
    for d in shape:
        if isinstance(d, int):
            n *= d
    if not -2**63 <= n < 2**63:
        n = int(np.prod([d for d in shape if isinstance(d, int)] or [1]))
    return n


@constraint("eltwise_broadcast", tag="3P")
def eltwise_broadcast(node, ctx):
    """Element-wise ops broadcast in one direction only: at most one operand may be smaller than the
    output (best with <= {eltwise_broadcast_max_elems} elements)."""
    shapes, out = _broadcast_shapes(node)
    if out is None or any(s is None for s in shapes):
        return OK
    out_n = _int_numel(out)
    smaller = [s for s in shapes if _int_numel(s) < out_n]
    if len(smaller) > 1 and len(shapes) > 1 and all(len(smaller) == len(shapes) for _ in [0]):
        return Verdict(False, f"{_q(node)} broadcasts both operands {[list(s) for s in shapes]} to {list(out)}")
    return OK


@constraint("sub_constant_first", tag="OBS")
def sub_constant_first(node, ctx):
    """Sub must subtract from an activation: in an ONNX model Sub(constant, x) ran in SW (core 2.x;
    'Sub(float)' between a DequantizeLinear and a QuantizeLinear in yolov11n 4.0.1); rewrite it as
    Mul(x, -1) + Add(constant)."""
    if getattr(ctx, "source_format", "onnx") == "tflite":
        return OK  # YOLOv8 TFLite (2.0): its SUB(anchors, x) ran on the NPU
    if node.inputs and ctx.view.is_const_like(node.inputs[0]) and len(node.inputs) > 1 and not ctx.view.is_const_like(node.inputs[1]):
        return Verdict(False, f"{_q(node)} computes constant '{node.inputs[0].name}' minus an activation")
    return OK


@constraint("div_by_constant", tag="3P")
def div_by_constant(node, ctx):
    """Div runs on the NPU only when dividing by a constant; division by a runtime tensor runs in SW."""
    if len(node.inputs) > 1 and not ctx.view.is_const_like(node.inputs[1]):
        return Verdict(False, f"{_q(node)} divides by the runtime tensor '{node.inputs[1].name}'")
    return OK


@constraint("transpose_perm", tag="OBS")
def transpose_perm(node, ctx):
    """A Transpose runs on the NPU as a layout change (NCHW <-> NHWC, or rank <= 3); swapping the
    channel axis with one spatial axis (perm [0, 2, 1, 3]) or the two spatial axes (perm [0, 1, 3, 2])
    ran in SW in real reports (MediaPipe 2.1; YOLOv8 2.0 and yolov11n 4.0.1, hybrid there)."""
    perm = node.attrs.get("perm")
    x = node.inputs[0]
    if perm is None or x.shape is None or len(x.shape) != 4:
        return OK
    perm = [int(p) for p in perm]
    moved = [i for i, p in enumerate(perm) if p != i and not (isinstance(x.shape[p], int) and x.shape[p] == 1)]
    if perm in ([0, 2, 1, 3], [0, 1, 3, 2]) and moved:
        return Verdict(False, f"{_q(node)} has perm {perm} on shape {list(x.shape)}")
    return OK


@constraint("concat_equal_inputs", tag="INF")
def concat_equal_inputs(node, ctx):
    """A Concat along axis 1 runs on the NPU when its inputs are equally wide along it; inputs of
    different widths made SW 'Concat' epochs in core 2.0/2.1 reports (YOLOv8 2.0: its 4 neck concats
    256+128, 128+64, 64+128, 128+256 and its 2+2+6 tail; SSD 2.1: 5120+1280+320+80; the 14 equal-width
    concats of the same models ran on the NPU; core 3.0 ran such concats on the NPU)."""
    axis = node.attrs.get("axis")
    shapes = [t.shape for t in node.inputs if t.name and not ctx.view.is_const(t)]
    if axis is None or len(shapes) < 2 or any(s is None for s in shapes):
        return OK
    rank = len(shapes[0])
    a = int(axis) % rank if rank else 0
    if a != 1:
        return OK  # only the channel axis (NCHW, or [batch, rows, channels] after a TFLite reshape) is evidenced
    widths = [s[a] if a < len(s) else None for s in shapes]
    if all(isinstance(w, int) for w in widths) and len(set(widths)) > 1:
        return Verdict(False, f"{_q(node)} concatenates widths {widths} on axis {a}")
    return OK


@constraint("slice_rank3_channels", tag="INF")
def slice_rank3_channels(node, ctx):
    """A Slice of a rank-3 tensor along its channel axis ran in SW in core 2.0 (YOLOv8: the two
    [1, 4, N] box slices of its decoding tail; the rank-4 slices of the same model ran on the NPU)."""
    x = node.inputs[0].shape
    if x is None or len(x) != 3 or len(node.inputs) < 4:
        return OK
    axes = ctx.view.const_value(node.inputs[3]) if node.inputs[3].name else None
    if axes is not None and [int(a) % 3 for a in np.ravel(axes)] == [1]:
        return Verdict(False, f"{_q(node)} slices axis 1 of the rank-3 tensor '{node.inputs[0].name}' {list(x)}")
    return OK


_FUSING_PRODUCERS = frozenset({"Conv", "QLinearConv", "ConvInteger", "Gemm"})


@constraint("fused_into_conv", tag="OBS")
def fused_into_conv(node, ctx):
    """This activation runs on the NPU only fused into the Conv that produces its input (its only
    reader, through Q/DQ): PP-OCRv4 det (2.2) c_info has 9 of its 10 HardSigmoid in their Conv's HW epoch
    ('Conv2D_591 ... HardSigmoid_594'); an activation not after a Conv has no NPU kernel (unverified)."""
    x = node.inputs[0] if node.inputs else None
    if x is None:
        return OK
    t, src = x, ctx.view.producer(x)
    while src is not None and (src.op in QDQ_OPS or src.op in MOVEMENT_OPS) and src.inputs:
        if len(t.outputs) != 1:
            break
        t = src.inputs[0]
        src = ctx.view.producer(t)
    if src is not None and src.op in _FUSING_PRODUCERS and len(t.outputs) == 1:
        return OK
    what = f"'{src.op}' node '{src.name}'" if src is not None else "a graph input"
    return Verdict(False, f"{_q(node)} follows {what}, not a Conv it is the only reader of")


@constraint("pad_constant_mode", tag="3P")
def pad_constant_mode(node, ctx):
    """Pad runs on the NPU in 'constant' mode only; reflect/edge padding runs in SW."""
    mode = node.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "constant":
        return Verdict(False, f"{_q(node)} pads in '{mode}' mode")
    return OK


@constraint("pool_window", tag="3P", severity="note")
def pool_window(node, ctx):
    """Pooling windows up to {pool_window_native}x{pool_window_native} run natively; larger windows
    are decomposed (slower)."""
    ks = node.attrs.get("kernel_shape")
    n = int(ctx.profile.limit("pool_window_native"))
    if ks and any(int(k) > n for k in ks):
        return Verdict(False, f"{_q(node)} has a {'x'.join(str(int(k)) for k in ks)} window")
    return OK


@constraint("global_pool_size", tag="OBS")
def global_pool_size(node, ctx):
    """A global pool should reduce at most {global_pool_max_elems} elements per channel (the largest
    seen on the NPU in real reports; larger pools are unverified)."""
    x = node.inputs[0]
    if x.shape is not None and len(x.shape) >= 3 and all(isinstance(d, int) for d in x.shape[2:]):
        n = int(np.prod(x.shape[2:]))
        if n > ctx.profile.limit("global_pool_max_elems"):
            return Verdict(False, f"{_q(node)} pools {' x '.join(str(d) for d in x.shape[2:])} = {n} elements")
    return OK


@constraint("reduce_as_global_pool", tag="3P")
def reduce_as_global_pool(node, ctx):
    """ReduceMean/ReduceMax run on the NPU only when they amount to a global pool: the reduced axes are
    the trailing ones and the tensor rank is the number of reduced axes + 2."""
    x = node.inputs[0]
    if x.shape is None:
        return Verdict(False, f"{_q(node)} has an input of unknown rank")
    rank = len(x.shape)
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1].name:
        v = ctx.view.const_value(node.inputs[1])
        axes = None if v is None else [int(a) for a in np.atleast_1d(v)]
    if axes is None:
        axes = list(range(rank))
    axes = sorted(int(a) % rank for a in axes)
    want = list(range(rank - len(axes), rank))
    if axes != want or rank != len(axes) + 2:
        return Verdict(False, f"{_q(node)} reduces axes {axes} of a rank-{rank} tensor")
    if x.shape is not None and all(isinstance(d, int) for d in x.shape[2:]):
        n = int(np.prod(x.shape[2:]))
        if n > ctx.profile.limit("global_pool_max_elems"):
            return Verdict(False, f"{_q(node)} reduces {n} elements per channel (more than {ctx.profile.limit('global_pool_max_elems')})")
    return OK


_FOLD_TARGETS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "QLinearConv"})


def _dequantized_const(t, ctx) -> bool:
    """``t`` is a quantized constant read through a DequantizeLinear."""
    p = ctx.view.producer(t)
    return p is not None and p.op == "DequantizeLinear" and bool(p.inputs) and ctx.view.is_const_like(p.inputs[0])


@constraint("batchnorm_folded", tag="OBS")
def batchnorm_folded(node, ctx):
    """BatchNormalization runs on the NPU when folded into the Conv/Gemm before it, or as a per-channel
    Mul + Add between int8 tensors (PP-OCRv4 det, 2.2: the BatchNormalization after ConvTranspose + Add,
    between Q/DQ with a quantized scale, is c_info 'Mul_inserted_id2525' + 'Add_inserted_id2527', HW); a
    standalone BatchNormalization with a float scale or on float data runs in SW (SFace, 2.1: 28 of them,
    each between SW Q/DQ)."""
    if (not ctx.oe_export and len(node.inputs) > 1 and ctx.domain.sourced(node.inputs[0])
            and all(ctx.domain.sunk(o) for o in node.outputs if o.name) and _dequantized_const(node.inputs[1], ctx)):
        return OK
    src = ctx.view.source(node.inputs[0])
    while src is not None and src.op in QDQ_OPS:
        src = ctx.view.source(src.inputs[0])
    if src is None or src.op not in _FOLD_TARGETS:
        what = f"'{src.op}' node '{src.name}'" if src is not None else "a graph input"
        return Verdict(False, f"{_q(node)} follows {what}, not a Conv/Gemm it could fold into")
    return OK


@constraint("resize_nearest_asymmetric", tag="3P")
def resize_nearest_asymmetric(node, ctx):
    """Resize runs on the NPU only with mode 'nearest', coordinate_transformation_mode 'asymmetric',
    nearest_mode 'floor' and constant integer scales; bilinear (linear) Resize runs in SW."""
    def attr(name, default):
        v = node.attrs.get(name, default)
        return v.decode() if isinstance(v, bytes) else v

    mode = attr("mode", "nearest")
    ctm = attr("coordinate_transformation_mode", "half_pixel" if node.op == "Resize" else "asymmetric")
    nm = attr("nearest_mode", "round_prefer_floor")
    problems = []
    if mode != "nearest":
        problems.append(f"mode '{mode}'")
    else:
        if ctm != "asymmetric":
            problems.append(f"coordinate_transformation_mode '{ctm}'")
        if nm != "floor":
            problems.append(f"nearest_mode '{nm}'")
    x = node.inputs[0].shape
    if x is not None and len(x) == 4 and list(x[2:]) == [1, 1]:
        return OK  # upsampling a 1x1 map is a broadcast whatever the mode (fallguard: RESIZE_BILINEAR -> 'tile', HW)
    scales = resize_scales(node, ctx)
    if scales is None:
        problems.append("scales that are not constant")
    elif any(abs(s - round(s)) > 1e-6 or s < 1 for s in scales):
        problems.append(f"non-integer scales {[round(float(s), 4) for s in scales]}")
    if problems:
        return Verdict(False, f"{_q(node)} has {', '.join(problems)}")
    return OK


def resize_scales(node, ctx) -> list[float] | None:
    """Per-axis scale factors of a Resize/Upsample, from constant scales or sizes (None if unknown)."""
    if node.op == "Upsample":
        t = node.inputs[1] if len(node.inputs) > 1 else None
        v = ctx.view.const_value(t) if t is not None else None
        if v is None and "scales" in node.attrs:
            v = np.asarray(node.attrs["scales"])
        return None if v is None else [float(s) for s in np.ravel(v)]
    ins = node.inputs
    if len(ins) > 2 and ins[2].name:
        v = ctx.view.const_value(ins[2])
        if v is not None and v.size:
            return [float(s) for s in np.ravel(v)]
    if len(ins) > 3 and ins[3].name:
        v = ctx.view.const_value(ins[3])
        x = ins[0]
        if v is not None and x.shape is not None and all(isinstance(d, int) and d > 0 for d in x.shape):
            return [float(o) / float(i) for o, i in zip(np.ravel(v), x.shape)]
    return None


# --------------------------------------------------------------------------------------------
# Model-level hazards checked on specific patterns (severity hang)
# --------------------------------------------------------------------------------------------


@constraint("depthwise_stride2_hang", tag="3P", severity="note", ops=("Conv",))
def depthwise_stride2_hang(node, ctx):
    """A depthwise Conv with stride 2 compiled with no SW epoch but hung the board in one
    board-verified third-party report; ST's own N6 models use stride-2 depthwise Convs, so the real
    trigger is narrower (unknown). If your board hangs, NAF008 (opt-in) moves the stride to the
    following 1x1 Conv."""
    if node.op != "Conv":
        return OK
    group = int(node.attrs.get("group", 1))
    strides = [int(s) for s in node.attrs.get("strides", [1, 1])]
    w = node.inputs[1] if len(node.inputs) > 1 else None
    if group > 1 and w is not None and w.shape is not None and w.shape[1] == 1 and any(s == 2 for s in strides):
        return Verdict(False, f"{_q(node)} is a depthwise Conv ({group} groups) with strides {strides}")
    return OK


@constraint("reshape_between_conv_relu_hang", tag="3P", severity="hang", ops=("Relu",))
def reshape_between_conv_relu_hang(node, ctx):
    """A Reshape between a Conv and its Relu compiles with no SW epoch but hangs the board: apply the
    Relu on the 4-D tensor, before the Reshape."""
    if node.op != "Relu":
        return OK
    p = ctx.view.producer(node.inputs[0])
    while p is not None and p.op in QDQ_OPS:
        p = ctx.view.producer(p.inputs[0])
    if p is not None and p.op in MOVEMENT_OPS - {"Identity"}:
        q = ctx.view.producer(p.inputs[0])
        while q is not None and q.op in QDQ_OPS:
            q = ctx.view.producer(q.inputs[0])
        if q is not None and q.op == "Conv":
            return Verdict(False, f"{_q(node)} follows '{p.op}' node '{p.name}' after Conv '{q.name}'")
    return OK


HAZARDS = ("depthwise_stride2_hang", "reshape_between_conv_relu_hang")
