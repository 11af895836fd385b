"""Checks of a quantized model against the NPU's scheme (:func:`check_npu_quantization`) and the float
islands that remain (:func:`float_islands`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .. import ir
from ..analysis import analyze_model
from ..graph import const_value, gc_paused, read_graph
from .modelproto import (
    _copy,
    _load_profile,
    _strip_initializer_inputs,
    _unique_names,
)

#: Weight input slots whose constants the NPU wants int8 symmetric per channel.
WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "PRelu")

#: Placement reasons that mean "this op would run on the NPU if it were quantized".
ISLAND_CONSTRAINTS = frozenset({"quantized_activations", "params_quantized", "prelu_slope_quantized", "float_island"})


def _weight_axis(op: str, attr, rank: int) -> int | None:
    """The output-channel axis of the weight (input 1) of an ``op`` node whose attributes ``attr(name,
    default)`` reads; None when per-channel does not apply."""
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1 if int(attr("group", 1)) == 1 else None
    if op == "Gemm":
        return 0 if int(attr("transB", 0)) else 1
    if op == "MatMul":
        return rank - 1 if rank == 2 else None
    if op == "PRelu":
        return 0 if rank >= 1 else None
    return None


def check_npu_quantization(model: onnx.ModelProto, *, allow_uint8_io: bool = False) -> list[str]:
    """What in ``model`` the NPU's scheme rejects, one sentence each (empty: all good).

    Checks: no uint8 tensor anywhere (with ``allow_uint8_io``, a uint8 graph input read by
    DequantizeLinear and a uint8 graph output written by QuantizeLinear are allowed); every weight of
    Conv/ConvTranspose/Gemm/MatMul and every PRelu slope goes through a DequantizeLinear of an int8
    constant with all zero-points 0, per channel (one scale per output channel, ``axis`` set) when
    the weight has more than one channel.
    """
    with gc_paused():  # the graph's objects are many and short-lived: no collector walks over them
        return _check_npu_quantization(model, allow_uint8_io)


def _check_npu_quantization(model: onnx.ModelProto, allow_uint8_io: bool) -> list[str]:
    g = model.graph
    graph = read_graph(model)
    tensors = graph.tensors()

    def consumers(name: str) -> list[ir.Node]:
        t = tensors.get(name)
        return list(t.outputs) if t is not None else []

    def producer(name: str) -> ir.Node | None:
        t = tensors.get(name)
        return t.inputs[0] if t is not None and t.inputs else None

    def const(name: str) -> np.ndarray | None:
        t = tensors.get(name)
        return const_value(t) if t is not None and name else None

    problems: list[str] = []
    from ..npu.placement import is_oe_export

    oe = is_oe_export(model)  # ST's own export keeps constant quantization in a side _Q.json
    io_ok: set[str] = set()
    if allow_uint8_io:
        for vi in g.input:
            readers = consumers(vi.name)
            if readers and all(c.op == "DequantizeLinear" for c in readers):
                io_ok.add(vi.name)
        for vi in g.output:
            p = producer(vi.name)
            if p is not None and p.op == "QuantizeLinear":
                io_ok.add(vi.name)
    edge_nodes = {n.name for n in graph.nodes if n.op == "DequantizeLinear" and n.inputs[0].name in io_ok}
    edge_nodes |= {n.name for n in graph.nodes if n.op == "QuantizeLinear" and n.outputs[0].name in io_ok}
    for t in g.initializer:  # the model's order of its initializers (the order of the findings)
        if t.data_type == TensorProto.UINT8 and any(c.name not in edge_nodes for c in consumers(t.name)):
            problems.append(f"the constant '{t.name}' is uint8")
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.UINT8 and vi.name not in io_ok:
            problems.append(f"the tensor '{vi.name}' is uint8")
    for n in graph.nodes:
        if n.op in ("QuantizeLinear", "DequantizeLinear"):
            zp_name = n.inputs[2].name if len(n.inputs) > 2 else ""
            io_name = n.inputs[0].name if n.op == "DequantizeLinear" else n.outputs[0].name
            if io_name in io_ok:
                continue
            zp = const(zp_name)
            if not zp_name and n.op == "QuantizeLinear":
                problems.append(f"'{n.name}' has no zero-point, so it produces uint8")
            elif zp is not None and zp.dtype == np.uint8:
                problems.append(f"'{n.name}' uses a uint8 zero-point")
    for n in graph.nodes:
        if n.op not in WEIGHT_OPS or len(n.inputs) < 2:
            continue
        w = n.inputs[1].name
        wv = const(w)
        if wv is not None:
            if wv.dtype.kind == "f" and not oe:
                problems.append(f"the weight '{w}' of '{n.name}' ({n.op}) is a float constant, not quantized")
            continue
        dq = producer(w)
        q = const(dq.inputs[0].name) if dq is not None and dq.op == "DequantizeLinear" else None
        if q is None:
            continue  # an activation (MatMul of two tensors) - not a weight
        scale = const(dq.inputs[1].name) if len(dq.inputs) > 1 else None
        zp = const(dq.inputs[2].name) if len(dq.inputs) > 2 and dq.inputs[2].name else None
        where = f"the weight '{w}' of '{n.name}' ({n.op})"
        if q.dtype != np.int8:
            problems.append(f"{where} is stored as {q.dtype.name}, not int8")
            continue
        if zp is not None and np.any(zp != 0):
            problems.append(f"{where} is asymmetric (non-zero zero-point)")
        axis = _weight_axis(n.op, n.attrs.get, q.ndim)
        if axis is None or scale is None:
            continue
        channels = q.shape[axis] if q.ndim > axis else 1
        if channels > 1 and scale.size == 1:
            problems.append(f"{where} is quantized per tensor, not per channel")
        elif scale.size > 1:
            dq_axis = int(dq.attrs.get("axis", 1))
            dq_axis = dq_axis + q.ndim if dq_axis < 0 else dq_axis
            if dq_axis != axis or scale.size != channels:
                problems.append(f"{where} is quantized along axis {dq_axis}, not its output-channel axis {axis}")
    return problems


_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _constant_tensors(graph: onnx.GraphProto):
    """Every constant tensor of ``graph`` and its subgraphs: initializers and Constant nodes' values."""
    yield from graph.initializer
    for n in graph.node:
        for a in n.attribute:
            if n.op_type == "Constant" and a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                t = onnx.TensorProto()
                t.CopyFrom(a.t)
                if not t.name:
                    t.name = n.output[0] if n.output else n.name
                yield t
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from _constant_tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _constant_tensors(g)


def _weight_names(graph: onnx.GraphProto, out: set[str]) -> set[str]:
    """Names read as weights, biases or slopes (inputs after the first of :data:`WEIGHT_OPS`) or as
    quantization scales, in ``graph`` and its subgraphs."""
    for n in graph.node:
        if n.op_type in WEIGHT_OPS or n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            out.update(i for i in n.input[1:] if i)
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _weight_names(g, out)
    return out


def non_finite_constants(model: onnx.ModelProto) -> list[tuple[str, int, int, int]]:
    """The float constants of ``model`` (initializers, Constant nodes, in subgraphs too) that hold NaN,
    and the weights, biases, slopes and scales that hold an infinity (elsewhere -inf is a legitimate
    constant: an attention mask's): (name, NaN count, Inf count, element count) each, in the
    model's order."""
    from onnx import numpy_helper

    weights = _weight_names(model.graph, set())
    out = []
    for t in _constant_tensors(model.graph):
        if t.data_type not in _FLOAT_TYPES:
            continue
        try:
            a = numpy_helper.to_array(t)
        except Exception:  # noqa: BLE001 - data nafix cannot read here is reported where it is used
            continue
        if a.dtype.kind != "f":  # bfloat16: ml_dtypes' type (kind 'V'), or its raw 16 bits in older onnx
            a = (a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a.astype(np.float32)
        finite = np.isfinite(a)
        if finite.all():
            continue
        nan = int(np.isnan(a).sum())
        inf = int(a.size - finite.sum()) - nan if t.name in weights else 0
        if nan or inf:
            out.append((t.name, nan, inf, int(a.size)))
    return out


def check_finite_constants(model: onnx.ModelProto, model_name: str = "the model") -> None:
    """Raise :class:`~fixer.errors.InputError` naming every float constant that holds NaN or Inf:
    no scale can represent them (onnxruntime's quantizer fails with ``AssertionError: scale issue``)."""
    from ..errors import InputError

    bad = non_finite_constants(model)
    if not bad:
        return

    def one(name, nan, inf, size) -> str:
        what = " and ".join(w for w in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "") if w)
        return f"'{name}' ({what} of {size} values)"

    listed = ", ".join(one(*b) for b in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    kinds = " or ".join(k for k, hit in (("NaN", any(b[1] for b in bad)), ("Inf", any(b[2] for b in bad))) if hit)
    raise InputError(f"{model_name}: cannot quantize: the float constant(s) {listed} hold {kinds}, which no "
                     f"quantization scale can represent; replace those values in the model.")


def _analysis_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for nafix's placement: unique node names, dynamic input dimensions pinned to 1 (as
    calibration runs them), shapes re-inferred."""
    m = _copy(model)
    _unique_names(m)
    _strip_initializer_inputs(m)
    for vi in m.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value") or d.dim_value <= 0:
                d.dim_value = 1
    del m.graph.value_info[:]
    for out in m.graph.output:
        if any(not d.HasField("dim_value") for d in out.type.tensor_type.shape.dim):
            out.type.tensor_type.ClearField("shape")
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - shapes only refine the placement
        pass
    return m


def float_islands(model: onnx.ModelProto, *, profile=None) -> list[dict]:
    """Nodes nafix's placement puts in SW because something around them is not quantized.

    Each entry: ``{"name", "op_type", "constraints", "reasons"}`` (from :func:`fixer.analysis.analyze_model`,
    SW nodes failing ``quantized_activations``, ``params_quantized``, ``prelu_slope_quantized`` or
    marked ``float_island``).
    """
    profile = _load_profile(profile)
    analysis = analyze_model(_analysis_copy(model), profile=profile)
    out = []
    for row in analysis.sw_nodes():
        hit = [c for c in row["constraints"] if c in ISLAND_CONSTRAINTS]
        if hit:
            out.append({"name": row["name"], "op_type": row["op_type"], "constraints": hit, "reasons": row["reasons"]})
    return out
