"""Placement: which node runs in HW (NPU), which in SW (Cortex-M55), which the compiler folds, and why.

The model works on the ONNX graph stedgeai would read:

1. Nodes the compiler evaluates at compile time (constants, ``Shape`` of static tensors) and pure
   data movement (Reshape, Flatten, Squeeze, Unsqueeze, Identity) are *folded*.
2. Every other node is looked up in the target profile's operator table. Ops not in the table run
   in SW ("not in the NPU operator table"); ``sw``-tier ops run in SW with the table's reason;
   ``hw``-tier ops run in HW when every constraint (generic + the op's own) passes, else in SW with
   *every* failing requirement.
3. A SW op runs with an int8 kernel when the profile lists one for it and its inputs and outputs are
   quantized; otherwise it runs in float, and the conversions around it become SW epochs too.
4. QuantizeLinear/DequantizeLinear are folded between quantized ops. They run in SW around float SW
   ops, and at float graph edges as the stedgeai options say: an ONNX model's input QuantizeLinear
   and ``Q -> DQ -> output`` are dropped by default (int8 I/O) and kept with
   ``--input-data-type``/``--output-data-type float32``; a TFLite model's float edges are SW unless
   those options give an integer type.
5. Nodes computed from constants only are evaluated at compile time; the layout Transposes a TFLite
   import inserts (``nafix.tflite.layout``) are not in the compiled graph.
6. Per stedgeai core version (``profile.core``) some constraints do not apply (``constraints_off``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable

import numpy as np
import onnx
from .. import ir

from ..graph import MOVEMENT_OPS, QDQ_OPS, GraphView, node_label, quantized_ops
from .constraints import GENERIC, HAZARDS, REGISTRY
from .profile import TargetProfile

HW, SW, FOLDED = "HW", "SW", "folded"
#: Activations the compiler fuses into the compute op before them (one epoch, one quantization).
ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid"})
_INT_KINDS = ("i", "u")
#: element type -> whether it is an 8-bit integer (QuantDomain._is_int, read for every tensor)
_INT8_DTYPES: dict = {}
#: element type -> whether it is uint8 (``np.dtype(d) == np.uint8``, remembered)
_UINT8_DTYPES: dict = {}


def _is_uint8(d) -> bool:
    """``np.dtype(d) == np.uint8`` (raising as np.dtype does), remembered per element type."""
    try:
        return _UINT8_DTYPES[d]
    except (KeyError, TypeError):
        pass
    u8 = np.dtype(d) == np.uint8
    with contextlib.suppress(TypeError):
        _UINT8_DTYPES[d] = u8
    return u8
DEFAULT_DOMAINS = ("", "ai.onnx")
CONTRIB_OK = frozenset({"QLinearAdd", "QLinearMul"})


@dataclass(frozen=True)
class Reason:
    """One failing NPU requirement on one node."""

    constraint: str
    requirement: str
    detail: str
    tag: str
    severity: str = "sw"

    def text(self) -> str:
        return f"{self.requirement} ({self.detail}) [{self.tag}]"


@dataclass(frozen=True, init=False)
class NodePlacement:
    name: str
    op_type: str
    unit: str  # HW | SW | folded
    reasons: tuple[Reason, ...] = ()
    notes: tuple[Reason, ...] = ()
    kernel: str | None = None  # for SW nodes: "int8" or "float"
    role: str = ""  # e.g. "graph-input conversion", "weights", "data movement"

    def __init__(self, name: str, op_type: str, unit: str, reasons: tuple[Reason, ...] = (),
                 notes: tuple[Reason, ...] = (), kernel: str | None = None, role: str = ""):
        # what the generated __init__ of a frozen dataclass does, in one store instead of one
        # object.__setattr__ per field (one placement is made per node of every analysed graph)
        _set_attr(self, "__dict__", {"name": name, "op_type": op_type, "unit": unit, "reasons": reasons,
                                     "notes": notes, "kernel": kernel, "role": role})


_set_attr = object.__setattr__


@dataclass
class Placement:
    """The placement of every node of one model."""

    nodes: list[NodePlacement]
    oe_export: bool
    profile: str
    model_findings: list[Reason] = field(default_factory=list)
    #: name of a node inside an If/Loop/Scan subgraph -> name of that top-level node
    nested: dict[str, str] = field(default_factory=dict)

    @cached_property
    def by_name(self) -> dict[str, NodePlacement]:
        """Placement by node name; a subgraph node maps to its If/Loop/Scan (which runs it)."""
        own = {n.name: n for n in self.nodes}
        if not self.nested:  # (no subgraph: the one table, not a merged copy of it)
            return own
        return {**{k: own[v] for k, v in self.nested.items() if v in own}, **own}

    def sw_nodes(self) -> list[NodePlacement]:
        return [n for n in self.nodes if n.unit == SW]


class QuantDomain:
    """Which float tensors carry int8 values (quantization info known to the compiler).

    ``sourced(t)``: ``t`` comes from a DequantizeLinear or an integer tensor through data movement.
    ``sunk(t)``: every reader of ``t`` is a QuantizeLinear (through data movement), or ``t`` stays integer.
    The one exception in a QDQ model is the fused activation: a compute op's float output read only by
    an activation (Conv -> Relu -> QuantizeLinear) counts as quantized on both sides, as the compiler
    runs the pair as one op. Every other float tensor between two ops has no quantization parameters:
    stedgeai warns "<tensor> is not quantized" and runs the ops around it in float (a float island).

    ST's own exports (``*_OE_*.onnx``) keep quantization in a side ``_Q.json``: there (``strict`` off)
    the int8 domain also passes through every op the NPU runs, without Q/DQ between them.
    """

    def __init__(self, view: GraphView, profile: TargetProfile, *, strict: bool = True):
        self.view = view
        self.profile = profile
        self.strict = strict
        #: ONNX QDQ: only tensors a Q/DQ touches have quantization parameters (not a TFLite import)
        self.onnx_qparams = source_format(view.model) != "tflite"
        passthrough = {op for op, r in profile.operators.items() if r.tier in ("hw", "movement")}
        passthrough |= set(profile.sw_int8_kernels) | MOVEMENT_OPS
        self._pass = frozenset(passthrough) if not strict else frozenset(MOVEMENT_OPS)
        self._hw_ops = frozenset(op for op, r in profile.operators.items() if r.tier == "hw")
        self._sourced: dict[str, bool] = {}
        self._sunk: dict[str, bool] = {}
        self._u8_src: dict[str, bool] = {}
        self._u8_sink: dict[str, bool] = {}
        self._acts: dict[str, list[ir.Tensor]] = {}
        self._compute()

    def _epilogue(self, c: ir.Node, t: ir.Tensor) -> bool:
        """``c`` is fused onto the op producing ``t``: an activation, or a bias/scale (Add, Sub, Mul,
        Div with a constant other operand), as a Conv/MatMul epilogue."""
        if c.op in ACTIVATIONS:
            return True
        if c.op in ("Add", "Sub", "Mul", "Div"):
            others = [x for x in c.inputs if x is not t and x.name]
            return len(others) == 1 and self.view.is_const_like(others[0])
        return False

    def _is_int(self, t: ir.Tensor) -> bool:
        d = t.dtype
        if d is None:
            return False
        try:
            return _INT8_DTYPES[d]
        except (KeyError, TypeError):
            dt = np.dtype(d)
            is_int = dt.kind in _INT_KINDS and dt.itemsize == 1
            with contextlib.suppress(TypeError):
                _INT8_DTYPES[d] = is_int
            return is_int

    def _compute(self) -> None:
        view = self.view
        nodes = view.nodes
        sourced = self._sourced
        u8_src = self._u8_src
        is_int = self._is_int
        for t in view.graph.inputs:
            sourced[t.name] = is_int(t)
            u8_src[t.name] = False
        known_acts = self._acts
        folded = view.folded
        passing = self._pass
        hw_ops = self._hw_ops
        strict = self.strict
        output_names = view.output_names
        Constant = ir.Constant
        get = sourced.get
        for node in nodes:
            # view.activations(node), inline (this runs for every node)
            acts = [t for t in node.inputs
                    if t.name and not (isinstance(t, Constant) or (t.inputs and t.inputs[0].name in folded))]
            known_acts[node.name] = acts
            op = node.op
            is_dq = op == "DequantizeLinear"
            for out in node.outputs:
                if is_int(out) or is_dq or node.name in folded:
                    sourced[out.name] = True
                elif op in passing and op != "QuantizeLinear":
                    ok = bool(acts)
                    for t in acts:
                        if not get(t.name, False):
                            ok = False
                            break
                    sourced[out.name] = ok
                elif (strict and op in hw_ops and acts
                      and all(get(t.name, False) for t in acts)
                      and out.outputs and all(self._epilogue(c, out) for c in out.outputs)
                      and out.name not in output_names):
                    sourced[out.name] = True  # a fused accumulator: Conv -> bias Add -> Relu -> Q
                else:
                    sourced[out.name] = False
                # uint8 activations: a DequantizeLinear of a uint8 tensor that is not a weight
                if is_dq:
                    x = node.inputs[0]
                    # (constness first: a weight's element type is read from its proto)
                    u8_src[out.name] = (not view.is_const(x) and (d := x.dtype) is not None and _is_uint8(d)
                                        and not view.is_graph_input(x))
                elif op in MOVEMENT_OPS:
                    u8_src[out.name] = any(u8_src.get(t.name, False) for t in acts)
                else:
                    u8_src[out.name] = False
        sunk = self._sunk
        sunk_of = self._sunk_of
        for node in reversed(nodes):
            for out in node.outputs:
                sunk[out.name] = sunk_of(out)
        self._u8_quantize = self._any_uint8_quantize()
        self._has_uint8 = self._u8_quantize or any(u8_src.values())

    def _any_uint8_quantize(self) -> bool:
        """Whether some QuantizeLinear could be one :meth:`_uint8_sink` looks for (a uint8 zero-point):
        with none among the graph's nodes, and no subgraph whose nodes read the graph's tensors, no
        tensor is a uint8 sink. True when in doubt (a subgraph, an element type numpy has no dtype for)."""
        if getattr(self.view, "nested_owner", True):
            return True
        for n in self.view.nodes:
            if n.op == "QuantizeLinear" and len(n.inputs) > 2:
                d = n.inputs[2].dtype
                try:
                    if d is not None and _is_uint8(d):
                        return True
                except TypeError:
                    return True
        return False

    def _sunk_of(self, t: ir.Tensor) -> bool:
        if self._is_int(t):
            return True
        view = self.view
        if t.name in view.output_names:  # (view.is_graph_output, inline: this runs for every tensor)
            return False
        ok = True
        producer = t.inputs[0] if t.inputs else None
        folded = view.folded
        for c in t.outputs:
            if c.op == "QuantizeLinear" or c.name in folded or c.op == "Shape":
                continue
            fused = (self.strict and producer is not None and producer.op in self._hw_ops
                     and self._epilogue(c, t))
            if (self.strict and self.onnx_qparams and c.op in MOVEMENT_OPS and producer is not None
                    and producer.op not in MOVEMENT_OPS and producer.op not in QDQ_OPS):
                # A computed tensor quantized only after a Reshape/Flatten has no quantization parameters
                # of its own: stedgeai runs its producer in float (MobileNetV2 4.0.1: DQ -> ReduceMean ->
                # Reshape -> Q became SW DequantizeLinear, GlobalAveragePool(float), QuantizeLinear; OBS).
                # A TFLite tensor carries its own quantization: the same MEAN -> Reshape ran on the NPU
                # (magnus baselines, rppg).
                ok = False
            elif (c.op in self._pass or fused) and c.op != "DequantizeLinear":
                if not all(self._sunk[o.name] if o.name in self._sunk else self._sunk_of(o)
                           for o in c.outputs if o.name):
                    ok = False
            else:
                ok = False
        return ok

    def activations(self, node: ir.Node) -> list[ir.Tensor]:
        """``view.activations(node)`` as it was when the domain was built (read, do not change, the
        list): placement, its constraints and the memory estimate read it for every node."""
        acts = self._acts.get(node.name)
        return acts if acts is not None else self.view.activations(node)

    def sourced(self, t: ir.Tensor) -> bool:
        return self._sourced.get(t.name, False) if not isinstance(t, ir.Constant) else True

    def sunk(self, t: ir.Tensor) -> bool:
        return self._sunk.get(t.name, self._is_int(t))

    def sourced_any(self, node: ir.Node) -> bool:
        return any(self.sourced(t) for t in self.activations(node))

    @property
    def has_uint8(self) -> bool:
        """Whether some tensor could be a :meth:`uint8_source` or a :meth:`uint8_sink` (False: none is)."""
        return self._has_uint8

    def uint8_source(self, t: ir.Tensor) -> bool:
        return self._u8_src.get(t.name, False)

    def uint8_sink(self, t: ir.Tensor) -> bool:
        # remembered per tensor: the domain reads a view that does not change while it is used
        # (one analysis), and int8_activations asks for every output of every op
        known = self._u8_sink.get(t.name)
        if known is None:
            known = self._u8_sink[t.name] = self._uint8_sink(t)
        return known

    def _uint8_sink(self, t: ir.Tensor) -> bool:
        if not self._u8_quantize:
            return False
        for c, _ in self.view.sinks(t):
            if c is not None and c.op == "QuantizeLinear" and len(c.inputs) > 2:
                zp = c.inputs[2]
                if zp.dtype is not None and np.dtype(zp.dtype) == np.uint8:
                    out = c.outputs[0]
                    if not self.view.is_graph_output(out):
                        return True
        return False

    def output_zero_point(self, t: ir.Tensor) -> int | None:
        """Zero-point of the QuantizeLinear that quantizes ``t`` (None when none, or per-axis)."""
        for c, _ in self.view.sinks(t):
            if c is not None and c.op == "QuantizeLinear":
                if len(c.inputs) < 3:
                    return 0
                v = self.view.const_value(c.inputs[2])
                if v is not None and v.size == 1:
                    return int(v.reshape(-1)[0])
        return None


@dataclass
class PlacementContext:
    view: GraphView
    profile: TargetProfile
    domain: QuantDomain
    oe_export: bool
    values: dict
    source_format: str = "onnx"
    #: (op, op constraints, constraints off) -> the Constraint objects _place_node checks, in order
    #: (made once per place(): the registry is read when placement starts)
    checks: dict = field(default_factory=dict)


def is_oe_export(model: onnx.ModelProto) -> bool:
    """ST's front end writes ``<model>_OE_x_y_z.onnx`` with producer 'Cube.AI'; its quantization of
    constants lives in a side ``_Q.json``, so float constants there are not float islands (INF)."""
    return model.producer_name.strip().lower() in ("cube.ai", "stedgeai", "st edge ai")


def place(view: GraphView, profile: TargetProfile, *, domain: QuantDomain | None = None) -> Placement:
    """Place every node of ``view`` on HW, SW or folded, with reasons. ``domain``: the view's
    :func:`quant_domain` when the caller has built it already (it is not built twice)."""
    oe = is_oe_export(view.model)
    if domain is None or domain.view is not view or domain.profile is not profile or domain.strict != (not oe):
        domain = quant_domain(view, profile)
    ctx = PlacementContext(view, profile, domain, oe, profile.values(), source_format(view.model))
    result: dict[str, NodePlacement] = {}
    model_findings: list[Reason] = []

    layout = _import_layout_nodes(view.model, view.nodes)
    const_derived = _const_derived(view)
    for node in view.nodes:
        if node.name in const_derived:
            result[node.name] = NodePlacement(node.name, node.op, FOLDED, role="evaluated at compile time")
            continue
        if node.op in QDQ_OPS:
            continue
        if node.name in layout:
            result[node.name] = NodePlacement(node.name, node.op, FOLDED, role="layout change of the TFLite import "
                                              "(the compiler reads the NHWC TFLite graph: no such op)")
            continue
        result[node.name] = _place_node(node, ctx)

    for node in view.nodes:
        if node.op in QDQ_OPS and node.name not in const_derived:
            result[node.name] = _place_qdq(node, ctx, result)

    nodes = [result[n.name] for n in view.nodes]
    # Model-level findings: one per compile-breaking or board-hanging constraint, with a count.
    grouped: dict[str, list[Reason]] = {}
    for np_ in nodes:
        for r in np_.reasons + np_.notes:
            # dynamic shapes are reported once per graph-input dimension by the analysis instead
            if r.severity in ("compile_error", "hang") and r.constraint != "static_shape":
                grouped.setdefault(r.constraint, []).append(r)
    for cid, rs in grouped.items():
        more = f" (and {len(rs) - 1} more node(s))" if len(rs) > 1 else ""
        first = rs[0]
        model_findings.append(Reason(cid, first.requirement, first.detail + more, first.tag, first.severity))
    if not quantized_ops(n.op for n in view.nodes) and any(
        p.unit == SW for p in nodes
    ):
        model_findings.append(Reason(
            "model_not_quantized",
            "The NPU runs only 8-bit quantized models (int8 activations per tensor, int8 symmetric "
            "per-channel weights, QDQ format); a float model runs entirely in SW.",
            "the model has no QuantizeLinear/DequantizeLinear at all",
            "DOC", "note"))
    return Placement(nodes=nodes, oe_export=oe, profile=profile.name, model_findings=model_findings,
                     nested={k: v.name for k, v in getattr(view, "nested_owner", {}).items()})


def quant_domain(view: GraphView, profile: TargetProfile) -> QuantDomain:
    """The :class:`QuantDomain` :func:`place` reads for ``view`` (strict unless an ST export)."""
    return QuantDomain(view, profile, strict=not is_oe_export(view.model))


def _reason(cid: str, detail: str, ctx: PlacementContext) -> Reason:
    c = REGISTRY[cid]
    return Reason(cid, c.requirement(ctx.values), detail, c.tag, c.severity)


def _place_node(node: ir.Node, ctx: PlacementContext) -> NodePlacement:
    view, profile = ctx.view, ctx.profile
    if node.name in view.folded:
        return NodePlacement(node.name, node.op, FOLDED, role="evaluated at compile time")
    domain = getattr(node, "domain", "") or ""
    rule = profile.operators.get(node.op)
    if rule is None or (domain not in DEFAULT_DOMAINS and node.op not in CONTRIB_OK and not node.op.startswith("QLinear")):
        label = node_label(node)
        why = Reason(
            "operator_table",
            "The op must be in the NPU operator table; other ops run in SW on the Cortex-M55.",
            f"'{label}' is a {node.op}{f' ({domain})' if domain not in DEFAULT_DOMAINS else ''}, not in the NPU operator table",
            "3P",
        )
        return NodePlacement(node.name, node.op, SW, (why,), kernel="float")
    if rule.tier == "movement":
        bad = REGISTRY["rank_limit"].func(node, ctx)
        if not bad.ok:
            return NodePlacement(node.name, node.op, SW, (_reason("rank_limit", bad.detail, ctx),), kernel="float")
        return NodePlacement(node.name, node.op, FOLDED, role="data movement")
    if rule.tier == "sw":
        if _enabled_by_option(node.op, profile):
            return NodePlacement(node.name, node.op, HW, role=f"on the NPU with {_OPTION_FOR[node.op]}")
        r = Reason(f"sw_op:{node.op}", rule.why or f"{node.op} runs in SW.", f"'{node_label(node)}' is a {node.op}", rule.tag)
        return NodePlacement(node.name, node.op, SW, (r,), kernel=_kernel(node, ctx, ()))
    failing: list[Reason] = []
    notes: list[Reason] = []
    off = profile.core.constraints_off if profile.core is not None else frozenset()
    key = (node.op, rule.constraints, off)
    checks = ctx.checks.get(key)
    if checks is None:
        checks = ctx.checks[key] = tuple(
            (cid, c) for cid in GENERIC + rule.constraints + HAZARDS if cid not in off
            for c in (REGISTRY[cid],) if c.ops is None or node.op in c.ops)
    for cid, c in checks:
        v = c.func(node, ctx)
        if v.ok:
            continue
        r = Reason(cid, c.requirement(ctx.values), v.detail, c.tag, c.severity)
        # compile errors and hazards are model-level findings: the node is placed as if they were fixed
        (failing if c.severity == "sw" else notes).append(r)
    if failing:
        return NodePlacement(node.name, node.op, SW, tuple(failing), tuple(notes), kernel=_kernel(node, ctx, failing))
    return NodePlacement(node.name, node.op, HW, (), tuple(notes))


_OPTION_FOR = {"Softmax": "--expand-softmax", "Gelu": "--GELU-recognition"}


def _enabled_by_option(op: str, profile: TargetProfile) -> bool:
    return _OPTION_FOR.get(op) in profile.options


def _kernel(node: ir.Node, ctx: PlacementContext, failing: Iterable[Reason]) -> str:
    """int8 when the compiler has an int8 SW kernel for the op and its I/O is quantized, else float.

    In an ONNX model, a DequantizeLinear of another op's int8 output (a QLinearConv's, not a QuantizeLinear's)
    and a QuantizeLinear read by an op rather than a DequantizeLinear are conversions of their own: the op
    between them runs in float (the QOperator MobileFaceNet: SW DQ -> PRelu -> Q; the QDQ per-channel one,
    whose PRelu sits between Q -> DQ pairs: SW PRelu alone; OBS)."""
    # (a float PRelu slope does not: the int8 SW PRelu kernel takes it, per-channel MobileFaceNet 2.1, OBS)
    if any(r.constraint == "quantized_activations" or r.constraint == "params_quantized" and node.op != "PRelu"
           for r in failing):
        return "float"
    if node.op not in ctx.profile.sw_int8_kernels:
        return "float"
    acts = ctx.domain.activations(node)
    if all(ctx.domain.sourced(t) for t in acts) and all(ctx.domain.sunk(t) for t in node.outputs if t.name):
        if ctx.domain.onnx_qparams and (any(_lone_dequantize(t, ctx.view) for t in acts)
                                        or any(_lone_quantize(t) for t in node.outputs if t.name)):
            return "float"
        return "int8"
    return "float"


def _lone_dequantize(t: ir.Tensor, view: GraphView) -> bool:
    """``t`` is the output of a DequantizeLinear of a computed int8 tensor that no QuantizeLinear made
    (the output of a QLinearConv/QLinearMatMul)."""
    p = t.inputs[0] if t.inputs else None
    if p is None or p.op != "DequantizeLinear" or not p.inputs:
        return False
    x = p.inputs[0]
    src = x.inputs[0] if x.inputs else None
    return src is not None and _qoperator(src.op) and not view.is_const_like(x)


def _lone_quantize(t: ir.Tensor) -> bool:
    """A QuantizeLinear of ``t`` is read by a QOperator op (a QLinearConv) rather than a DequantizeLinear."""
    for c in t.outputs:
        if c.op == "QuantizeLinear":
            for o in c.outputs:
                if any(_qoperator(d.op) for d in o.outputs):
                    return True
    return False


def _qoperator(op: str) -> bool:
    """An op of ONNX's QOperator format: it reads and writes int8 tensors with its own scales."""
    return op.startswith("QLinear") or op in ("ConvInteger", "MatMulInteger")


EDGE_QUANTIZE = ("The graph input should already be int8: a QuantizeLinear on a float graph input runs in SW "
                 "(give the model an int8 input and quantize in the application, or let stedgeai convert it).")
EDGE_DEQUANTIZE = ("Graph outputs should stay int8: a trailing DequantizeLinear runs in SW (drop it and "
                   "dequantize in the application).")
ISLAND_Q = ("Quantized ops must stay int8 end to end: a QuantizeLinear after an op that runs in float is a SW "
            "epoch of its own.")
ISLAND_DQ = ("Quantized ops must stay int8 end to end: a DequantizeLinear feeding an op that runs in float is a "
             "SW epoch of its own.")


def _conversion(node: ir.Node, cid: str, requirement: str, detail: str, role: str) -> NodePlacement:
    """A QuantizeLinear/DequantizeLinear that runs as a SW epoch (seen in real reports: OBS)."""
    return NodePlacement(node.name, node.op, SW, (Reason(cid, requirement, detail, "OBS"),), kernel="float", role=role)


def _place_qdq(node: ir.Node, ctx: PlacementContext, placed: dict[str, NodePlacement]) -> NodePlacement:
    view = ctx.view
    x = node.inputs[0]
    if view.is_const_like(x):
        return NodePlacement(node.name, node.op, FOLDED, role="weights")
    label = node_label(node)
    if node.op == "QuantizeLinear":
        src = view.source(x)
        if src is None and view.is_graph_input(view.source_tensor(x)) and not _edge_conversion_kept(ctx, "input"):
            return NodePlacement(node.name, node.op, FOLDED, role=_EDGE_DROPPED["input"])
        if src is None and view.is_graph_input(view.source_tensor(x)) or src is not None and src.op == "Transpose" and _float_prologue(src, view):
            return _conversion(node, "graph_edge_quantize", EDGE_QUANTIZE,
                               f"'{label}' quantizes the float graph input '{_prologue_input(x, view).name}'",
                               "graph-input conversion")
        if src is not None and src.name in placed and placed[src.name].unit == SW and placed[src.name].kernel == "float":
            return _conversion(node, "float_island", ISLAND_Q,
                               f"'{label}' re-quantizes the output of float SW op '{src.name}'", "conversion")
        return NodePlacement(node.name, node.op, FOLDED, role="quantization (folded)")
    # DequantizeLinear
    float_users = []
    to_output = _feeds_graph_output(node.outputs[0], view)
    for c, t in view.sinks(node.outputs[0]):
        if c is not None and c.name in placed and placed[c.name].unit == SW and placed[c.name].kernel == "float":
            float_users.append(c.name)
    direct = view.is_graph_output(node.outputs[0]) and (
        ctx.source_format == "tflite" or view.producer(x) is not None and view.producer(x).op == "QuantizeLinear")
    if direct and not float_users and not _edge_conversion_kept(ctx, "output"):
        return NodePlacement(node.name, node.op, FOLDED, role=_EDGE_DROPPED["output"])
    if to_output:
        return _conversion(node, "graph_edge_dequantize", EDGE_DEQUANTIZE,
                           f"'{label}' dequantizes into the graph output", "graph-output conversion")
    if float_users:
        return _conversion(node, "float_island", ISLAND_DQ,
                           f"'{label}' feeds float SW op(s) {', '.join(repr(u) for u in float_users[:2])}",
                           "conversion")
    return NodePlacement(node.name, node.op, FOLDED, role="dequantization (folded)")


_EDGE_DROPPED = {
    "input": "graph-input conversion (dropped by stedgeai: the input becomes integer)",
    "output": "graph-output conversion (dropped by stedgeai: the output stays integer)",
}


def _const_derived(view: GraphView) -> frozenset[str]:
    """Non-QDQ nodes computed from constants only, looking through Q/DQ of constants, and the Q/DQ
    between them: the compiler evaluates them at compile time (fallguard SSD: its anchor boxes, TILE ->
    RESHAPE -> CONCATENATION of constants, made no epoch; OBS)."""
    out: set[str] = set()
    derived: set[str] = set()  # tensors computed from constants only
    folded = view.folded
    Constant = ir.Constant
    for node in view.nodes:
        named = False
        for t in node.inputs:  # every named input constant (view.is_const inline: this runs per node)
            name = t.name
            if not name:
                continue
            named = True
            if isinstance(t, Constant) or name in derived:
                continue
            producers = t.inputs
            if producers and producers[0].name in folded:
                continue
            break
        else:
            if named:
                derived.update(o.name for o in node.outputs)
                if node.op not in QDQ_OPS or any(t.name in derived for t in node.inputs if t.name):
                    out.add(node.name)  # (a weight's own Q/DQ stays visible: placed as 'weights')
    return frozenset(out)


def _import_layout_nodes(model: onnx.ModelProto, nodes: list | None = None) -> frozenset[str]:
    """Names of the layout Transposes an importer inserted (``nafix.tflite.layout`` on the node).
    ``nodes``: the model's top-level nodes as imported (:mod:`fixer.ir`, one per NodeProto), whose
    protos are read for the Transposes only instead of walking every NodeProto."""
    protos = None
    if nodes is not None and len(nodes) == len(model.graph.node):
        protos = []
        for n in nodes:
            if n.op == "Transpose":
                p = n._src.get(n._pi) if n._src is not None else None
                if p is None or p.op_type != "Transpose":
                    protos = None  # not as imported: read the model
                    break
                protos.append(p)
    if protos is None:
        protos = [n for n in model.graph.node if n.op_type == "Transpose"]
    out = set()
    for n in protos:
        if "nafix.tflite.layout" in n.doc_string or any(p.key == "nafix.tflite.layout" for p in n.metadata_props):
            out.add(n.name)
    return frozenset(out)


def source_format(model: onnx.ModelProto) -> str:
    """``tflite`` for a model nafix imported from TFLite (metadata ``nafix.source_format``), else ``onnx``."""
    for p in model.metadata_props:
        if p.key == "nafix.source_format":
            return p.value.strip().lower() or "onnx"
    return "onnx"


def _edge_conversion_kept(ctx: PlacementContext, edge: str) -> bool:
    """Whether stedgeai keeps the float->int8 QuantizeLinear of a graph input (``edge="input"``) or the
    int8->float DequantizeLinear of a graph output as a SW epoch, per the stedgeai options (OBS, NPU_FACTS.md#real-reports):

    - ONNX QDQ model: a QuantizeLinear reading the graph input and a ``QuantizeLinear -> DequantizeLinear
      -> output`` are dropped by default (the I/O become int8); kept with ``--input-data-type float32`` /
      ``--output-data-type float32`` (MobileFaceNet: a SW QuantizeLinear with the option, none without;
      a face detector's 12 ``Q -> DQ -> output`` made none). A conversion behind a Transpose stays SW
      (MoveNet ``Q -> Transpose -> DQ -> output``, YAMNet ``input -> Transpose -> Q``);
    - TFLite model: a float input's QUANTIZE and each float output's DEQUANTIZE are SW epochs unless
      ``--input-data-type``/``--output-data-type`` give an integer type (face_landmark: float I/O 3 SW
      conversions, none with ``uint8``/``int8``).
    """
    opt = ctx.profile.option_value("--input-data-type" if edge == "input" else "--output-data-type")
    if ctx.source_format == "tflite":
        return opt in (None, "float32")
    return opt == "float32"


_EPILOGUE_OPS = MOVEMENT_OPS | {"Transpose"}


def _feeds_graph_output(t: ir.Tensor, view: GraphView) -> bool:
    """True when ``t`` reaches a graph output through data movement or Transpose only (the float
    epilogue of a graph output)."""
    return any(c is None for c, _ in view.sinks(t, through=_EPILOGUE_OPS))


def _prologue_input(t: ir.Tensor, view: GraphView) -> ir.Tensor:
    """The graph input at the start of a float prologue (data movement and Transpose) ending in ``t``."""
    p = view.producer(t)
    while p is not None and (p.op in MOVEMENT_OPS or p.op == "Transpose") and p.inputs:
        t = p.inputs[0]
        p = view.producer(t)
    return t


def _float_prologue(node: ir.Node, view: GraphView) -> bool:
    """True when ``node`` only moves a float graph input (Transpose/Reshape chain from the input)."""
    t = node.inputs[0]
    while True:
        p = view.producer(t)
        if p is None:
            return view.is_graph_input(t) and t.dtype is not None and np.dtype(t.dtype).kind == "f"
        if p.op not in MOVEMENT_OPS and p.op != "Transpose":
            return False
        t = p.inputs[0]
