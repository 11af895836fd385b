"""What ``--quantize`` would remove, estimated without quantizing (:func:`quantize_gain`).

Placement reads where the Q/DQ nodes sit, never their scales: nafix's estimate of the model that
``nafix MODEL --quantize`` writes is that of the same graph with the QDQ structure onnxruntime's
``quantize_static`` gives it (:func:`fake_qdq`: every float activation input and output of the
nodes it quantizes behind QuantizeLinear -> DequantizeLinear, every float constant they read behind
a DequantizeLinear of an integer constant), with placeholder scales (1.0) and zero-points (0). No
calibration, no onnxruntime: one graph copy and one more placement. The nodes quantized are those
``--quantize`` gives to onnxruntime: in a float model every node of an op type the target runs on
the NPU or with an int8 kernel (:func:`fixer.quantize.ort.npu_op_types`), in a QDQ model its float
islands (the SW nodes failing a quantization constraint, as :func:`fixer.quantize.islands.island_nodes`
picks them). A float model first gets the rewrites ``--quantize`` makes before quantizing (the
default rules and the recurrent-cell unrolling, unguarded, as :mod:`fixer.quantize.flow` runs them);
the rules it runs on the quantized model are not estimated.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper

#: float element types quantization turns into int8
_FLOAT = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})
#: constraints whose SW nodes are float islands --quantize quantizes (fixer.quantize.islands)
_ISLAND_REASONS = frozenset({"quantized_activations", "params_quantized", "prelu_slope_quantized"})
#: input slots onnxruntime quantizes to int32 (a bias: input scale x weight scale)
_BIAS_SLOTS = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    g = model.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.input, *g.value_info, *g.output)
             if vi.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in g.initializer})
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            types[n.output[0]] = n.attribute[0].t.data_type
    return types


def fake_qdq(model: onnx.ModelProto, nodes: Iterable[int]) -> onnx.ModelProto:
    """A copy of ``model`` with the QDQ structure quantizing ``nodes`` (indices in its node list)
    would give it, with placeholder parameters: for placement, never to run (its values are not the
    model's)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    chosen = set(nodes)
    types = _elem_types(m)
    shapes = {vi.name: vi for vi in (*g.input, *g.value_info, *g.output)}
    consts = {t.name: t for t in g.initializer}
    consts.update({n.output[0]: n for n in g.node if n.op_type == "Constant"})
    taken = {t for n in g.node for t in (*n.input, *n.output)} | set(consts) | {vi.name for vi in g.input}
    new_nodes: dict[int, list[onnx.NodeProto]] = {}  # index of the node they go before -> nodes
    tail: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    infos: list[onnx.ValueInfoProto] = []
    scale, zero = "nafix_fq_scale", "nafix_fq_zero"
    inits += [helper.make_tensor(scale, TensorProto.FLOAT, [], [1.0]),
              helper.make_tensor(zero, TensorProto.INT8, [], [0])]

    def fresh(base: str) -> str:
        name, i = base, 0
        while name in taken:
            i += 1
            name = f"{base}_{i}"
        taken.add(name)
        return name

    def info(name: str, like: str, elem: int) -> None:
        vi = shapes.get(like)
        if vi is not None and vi.type.HasField("tensor_type"):
            new = onnx.ValueInfoProto()
            new.CopyFrom(vi)
            new.name = name
            new.type.tensor_type.elem_type = elem
            infos.append(new)

    def qdq(src: str, dst: str, base: str) -> list[onnx.NodeProto]:
        q = fresh(base + "_fq_q")
        info(q, src, TensorProto.INT8)
        info(dst, src, types.get(src, TensorProto.FLOAT))
        return [helper.make_node("QuantizeLinear", [src, scale, zero], [q], name=fresh(base + "_fq_Q")),
                helper.make_node("DequantizeLinear", [q, scale, zero], [dst], name=fresh(base + "_fq_DQ"))]

    producer = {o: i for i, n in enumerate(g.node) for o in n.output}
    dq_out = {o for n in g.node if n.op_type == "DequantizeLinear" for o in n.output}
    q_read = {n.input[0] for n in g.node if n.op_type == "QuantizeLinear" and n.input}
    # outputs first: a tensor between two quantized nodes gets one Q -> DQ pair
    for i, n in enumerate(g.node):
        if i not in chosen:
            continue
        for k, out in enumerate(n.output):
            if not out or types.get(out) not in _FLOAT or out in q_read:
                continue
            raw = fresh(out + "_fq_raw")
            info(raw, out, types[out])
            n.output[k] = raw
            new_nodes.setdefault(i + 1, []).extend(qdq(raw, out, out))
            dq_out.add(out)
    made: dict[str, str] = {}  # float activation or constant -> its dequantized twin
    for i, n in enumerate(g.node):
        if i not in chosen:
            continue
        for k, x in enumerate(n.input):
            if not x or x in dq_out or types.get(x) not in _FLOAT:
                continue
            if x not in made:
                if x in consts:
                    made[x] = _dequantized_const(consts[x], k == _BIAS_SLOTS.get(n.op_type), fresh, inits, tail,
                                                 info, x, scale)
                else:
                    made[x] = fresh(x + "_fq")
                    at = producer[x] + 1 if x in producer else 0
                    new_nodes.setdefault(at, []).extend(qdq(x, made[x], x))
            n.input[k] = made[x]
    ordered = []
    for i, n in enumerate(g.node):
        ordered += new_nodes.get(i, [])
        ordered.append(n)
    ordered += new_nodes.get(len(g.node), [])
    del g.node[:]
    g.node.extend(tail + ordered)
    g.initializer.extend(inits)
    g.value_info.extend(infos)
    return m


def _dequantized_const(src, bias: bool, fresh, inits, tail, info, name: str, scale: str) -> str:
    """The name of an integer constant of ``src``'s shape behind a DequantizeLinear (int32 for a bias)."""
    if isinstance(src, onnx.NodeProto):
        dims = list(src.attribute[0].t.dims)
    else:
        dims = list(src.dims)
    dtype, elem = (np.int32, TensorProto.INT32) if bias else (np.int8, TensorProto.INT8)
    q = fresh(name + "_fq_int")
    inits.append(onnx.numpy_helper.from_array(np.zeros(dims, dtype=dtype), q))
    zero = fresh(name + "_fq_zp")
    inits.append(helper.make_tensor(zero, elem, [], [0]))
    out = fresh(name + "_fq")
    info(out, name, TensorProto.FLOAT)
    tail.append(helper.make_node("DequantizeLinear", [q, scale, zero], [out], name=fresh(name + "_fq_DQ")))
    return out


def nodes_to_quantize(analysis, profile, model: onnx.ModelProto | None = None) -> tuple[str, list[int]]:
    """(kind, indices in ``model``'s node list, default the analysed one) of what ``--quantize`` would
    quantize: ``float`` and every node of an op type onnxruntime quantizes for the target;
    ``float_islands`` and the SW nodes of a QDQ model that run in float for want of quantization;
    ``none`` and [] otherwise (an ST export, a model with nothing float, a TFLite import)."""
    from ..graph import is_quantized
    from ..npu.placement import is_oe_export
    from .ort import npu_op_types

    model = analysis.loaded.model if model is None else model
    if model is None or is_oe_export(model) or getattr(analysis.loaded, "imported", None) is not None:
        return "none", []
    ops = set(npu_op_types(profile)[0])
    if not is_quantized(model):
        return "float", [i for i, n in enumerate(model.graph.node) if n.op_type in ops]
    index = _node_index(analysis.placement.nodes, model)
    if index is None:
        return "none", []
    out = []
    for p in analysis.placement.nodes:
        if p.unit != "SW" or p.op_type in ("QuantizeLinear", "DequantizeLinear") or p.op_type not in ops:
            continue
        if any(r.constraint in _ISLAND_REASONS for r in p.reasons) or (
                p.op_type in profile.sw_int8_kernels and p.kernel == "float"):
            out.append(index[p.name])
    return ("float_islands", sorted(out)) if out else ("none", [])


def _node_index(placed, model: onnx.ModelProto) -> dict[str, int] | None:
    """Placement node name -> index in ``model``'s node list: by name where the model names every
    node once, else by position where the placement lists the graph's nodes in order (the names of
    unnamed nodes are the view's own); None when neither holds."""
    names = [n.name for n in model.graph.node]
    if all(names) and len(set(names)) == len(names):
        index = {name: i for i, name in enumerate(names)}
        if all(p.name in index and model.graph.node[index[p.name]].op_type == p.op_type for p in placed):
            return index
    if len(placed) == len(names) and all(p.op_type == n.op_type for p, n in zip(placed, model.graph.node)):
        return {p.name: i for i, p in enumerate(placed)}
    return None


def _prepared(model: onnx.ModelProto, profile, *, prep: bool = True):
    """``model`` after the rewrites ``--quantize`` runs on a float model before quantizing it
    (:mod:`fixer.quantize.flow`: the default rules and, with ``prep``,
    :data:`~fixer.quantize.flow.QUANTIZE_PREP_RULES`, recurrent cells unrolled, with no never-worse
    guard: they pay off once quantized), and whether any of those prep rules changed it."""
    from ..engine import run_engine
    from ..rules import load_rules, select_rules
    from .flow import QUANTIZE_PREP_RULES

    every = load_rules()
    rules = select_rules(every)
    if prep:
        rules += [r for r in every if r.id in QUANTIZE_PREP_RULES and r not in rules]
    result = run_engine(model, rules, profile=profile, options={"input_type": "int8"}, guard=False)
    return result.model, any(c.rule in QUANTIZE_PREP_RULES for c in result.changes)


def _quantized_estimate(analysis, model, profile, pools):
    """(kind, node names, analysis) of ``model`` with the QDQ structure quantization gives it."""
    from ..analysis import analyze_model

    kind, names = nodes_to_quantize(analysis, profile, model)
    return kind, names, analyze_model(fake_qdq(model, names), profile=profile, pools=pools)


def quantize_gain(analysis, *, pools=None) -> dict[str, Any] | None:
    """What ``nafix MODEL --quantize`` is estimated to remove from the analysed model (which must
    still hold its model: before :meth:`~fixer.results.ModelAnalysis.released`), or None when it would
    quantize nothing, remove no SW epoch, or leave a model nafix's never-worse test refuses.

    ``{"kind": "float" | "float_islands", "nodes": N, "sw_epochs": {"before", "after", "removed"},
    "ms": {"before", "after", "removed"} (None where not estimated), "hw_ratio": {"before", "after"},
    "command": "nafix MODEL --quantize", "estimated": True}``."""
    from ..analysis import analyze_model
    from ..engine import worse_than_input

    profile = analysis.profile
    try:
        kind, names = nodes_to_quantize(analysis, profile)
        if not names:
            return None
        model = analysis.loaded.model
        if kind == "float":
            prepared, unrolled = _prepared(model, profile)
            kind, names, after = _quantized_estimate(analysis, prepared, profile, pools)
            if unrolled:  # as --quantize's guard: the unrolling is kept only when not estimated slower
                plain, _ = _prepared(model, profile, prep=False)
                kind0, names0, after0 = _quantized_estimate(analysis, plain, profile, pools)
                if worse_than_input(after0.estimate, after.estimate) is not None:
                    kind, names, after = kind0, names0, after0
        else:
            after = analyze_model(fake_qdq(model, names), profile=profile, pools=pools)
    except Exception:  # noqa: BLE001 - advice never fails an audit
        import logging

        logging.getLogger(__name__).debug("quantize estimate failed on %s", analysis.path, exc_info=True)
        return None
    b, a = analysis.estimate, after.estimate
    removed = b.sw_epochs - a.sw_epochs
    if removed <= 0 or worse_than_input(b, a) is not None:
        return None
    ms_b, ms_a = b.latency_ms, a.latency_ms
    return {
        "kind": kind,
        "nodes": len(names),
        "sw_epochs": {"before": b.sw_epochs, "after": a.sw_epochs, "removed": removed},
        "ms": {"before": _r(ms_b), "after": _r(ms_a),
               "removed": _r(ms_b - ms_a) if ms_b is not None and ms_a is not None else None},
        "hw_ratio": {"before": round(b.hw_ratio, 4), "after": round(a.hw_ratio, 4)},
        "command": "nafix MODEL --quantize",
        "estimated": True,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)
