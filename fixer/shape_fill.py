"""Static shapes where ONNX shape inference gives up, without running the model.

ONNX inference leaves two kinds of activation shapes unknown in the models nafix sees: outputs of a
Reshape (and what follows) whose target shape is computed from other shapes (``Shape -> Gather ->
Unsqueeze -> Concat``, in opsets whose schemas have no data propagation), and outputs of
``com.microsoft`` quantized operators, which ONNX has no schema for. :func:`infer_missing` resolves
both on a copy of the model: it folds the small integer shape arithmetic to ``Constant`` nodes,
gives the supported ``com.microsoft`` operators nafix's own shape rules (schemas in a private domain,
used only on the copy) and runs ONNX inference again, a few rounds while that makes progress.

It answers only when every asked-for tensor ends with a fully static shape; otherwise the caller
runs the model in onnxruntime as before (``shapes.fill_shapes_by_running``), so a model this
cannot resolve is treated exactly as it was. tests/test_shape_fill.py compares its shapes and
element types with what onnxruntime actually produces.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

#: Private domain the copy's ``com.microsoft`` nodes move to, so the schemas registered here never
#: meet a real model (nor the checker's view of ``com.microsoft``).
RULE_DOMAIN = "nafix.shape_rules"
#: Largest integer tensor folded to a constant: shape arithmetic, not data.
MAX_FOLD = 64
#: Inference rounds (each folds what the previous round's shapes made computable).
MAX_ROUNDS = 4

_INT = (TensorProto.INT64, TensorProto.INT32)


def infer_missing(model: onnx.ModelProto, missing: list[str]) -> list[onnx.ValueInfoProto] | None:
    """A value_info (element type and static shape) for every tensor in ``missing``, in that order,
    or None when some of them stays unknown (or anything here fails)."""
    try:
        return _infer_missing(model, missing)
    except Exception:  # noqa: BLE001 - the onnxruntime probe answers instead
        return None


def _infer_missing(model: onnx.ModelProto, missing: list[str]) -> list[onnx.ValueInfoProto] | None:
    work = onnx.ModelProto()
    work.CopyFrom(model)
    g = work.graph
    for t in g.initializer:  # the copy's large weights are never read here nor by inference (shapes._infer_apart)
        if t.data_type not in _INT and len(t.raw_data) >= 4096:
            t.ClearField("raw_data")
    ruled = _rule_nodes(work)
    if ruled is None:
        return None
    folded: dict[str, np.ndarray] = {}
    wanted = set(missing)
    wanted.update(n.input[0] for n in g.node if n.op_type == "Shape" and n.input)
    for _ in range(MAX_ROUNDS):
        shapes, types = _static_shapes(g, wanted)
        found = [shapes.get(n) is not None for n in missing]
        if all(found):
            return [helper.make_tensor_value_info(n, types[n], list(shapes[n])) for n in missing]
        new = _fold(g, shapes, folded)
        if not new and not (ruled and _ == 0):
            return None
        for node in g.node:
            if node.output and node.output[0] in new and node.op_type != "Constant":
                value = new[node.output[0]]
                del node.input[:]
                del node.attribute[:]
                node.op_type, node.domain = "Constant", ""
                node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))
        del g.value_info[:]
        for out in g.output:
            shape = out.type.tensor_type.shape
            if any(not d.HasField("dim_value") for d in shape.dim):
                out.type.tensor_type.ClearField("shape")
        work = shape_inference.infer_shapes(work, strict_mode=False, data_prop=True)
        g = work.graph
    shapes, types = _static_shapes(g, wanted)
    if all(shapes.get(n) is not None for n in missing):
        return [helper.make_tensor_value_info(n, types[n], list(shapes[n])) for n in missing]
    return None


def _static_shapes(g: onnx.GraphProto, wanted: set[str]) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Static shapes and element types of the tensors named in ``wanted`` that have one."""
    shapes: dict[str, tuple[int, ...]] = {}
    types: dict[str, int] = {}
    for t in g.initializer:
        if t.name in wanted:
            shapes[t.name] = tuple(t.dims)
            types[t.name] = t.data_type
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.name not in wanted:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape") or not tt.elem_type:
            continue
        dims = []
        for d in tt.shape.dim:
            if not d.HasField("dim_value"):
                break
            dims.append(d.dim_value)
        else:
            shapes[vi.name] = tuple(dims)
            types[vi.name] = tt.elem_type
    return shapes, types


# ------------------------------------------------------------------------------------------------
# folding of shape arithmetic
# ------------------------------------------------------------------------------------------------

def _fold(g: onnx.GraphProto, shapes: dict, folded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate, in node order, every node whose output is a small integer tensor computable from
    static shapes, integer constants and what is already folded; returns the newly folded values."""
    values: dict[str, np.ndarray] = dict(folded)
    for t in g.initializer:
        if t.data_type in _INT and _size(t.dims) <= MAX_FOLD and t.data_location != TensorProto.EXTERNAL:
            values.setdefault(t.name, numpy_helper.to_array(t))
    new: dict[str, np.ndarray] = {}
    for node in g.node:
        if (node.op_type not in _FOLDABLE or len(node.output) != 1 or node.domain not in ("", "ai.onnx")
                or node.output[0] in values):
            continue
        try:
            v = _eval(node, values, shapes)
        except Exception:  # noqa: BLE001 - anything unexpected: not folded
            v = None
        if v is None:
            continue
        v = np.asarray(v)
        if v.dtype not in (np.int64, np.int32) or v.size > MAX_FOLD:
            continue
        values[node.output[0]] = folded[node.output[0]] = v
        if node.op_type != "Constant":
            new[node.output[0]] = v
    return new


_FOLDABLE = frozenset(("Constant", "Shape", "Identity", "Cast", "Gather", "Unsqueeze", "Squeeze", "Concat",
                       "Slice", "Add", "Sub", "Mul", "Div"))


def _size(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _eval(node, values: dict, shapes: dict):
    op = node.op_type
    a = _attrs(node)
    ins = list(node.input)

    def val(i):
        return values.get(ins[i]) if i < len(ins) and ins[i] else None

    def opt(i):  # an optional input: absent is fine, present but unknown stops the fold
        if i >= len(ins) or not ins[i]:
            return True, None
        v = values.get(ins[i])
        return v is not None, v

    if op == "Constant":
        if "value" in a and isinstance(a["value"], onnx.TensorProto):
            t = a["value"]
            return numpy_helper.to_array(t) if t.data_type in _INT and _size(t.dims) <= MAX_FOLD else None
        if "value_int" in a:
            return np.array(a["value_int"], dtype=np.int64)
        if "value_ints" in a:
            return np.array(a["value_ints"], dtype=np.int64)
        return None
    if op == "Shape":
        shape = shapes.get(ins[0])
        if shape is None:
            return None
        s = np.array(shape, dtype=np.int64)
        start, end = a.get("start", 0), a.get("end")
        return s[start:end] if end is not None else s[start:]
    if op == "Identity":
        return val(0)
    if op == "Cast":
        x = val(0)
        if x is None or x.dtype.kind not in "iu" or a.get("to") not in _INT:
            return None
        return x.astype(np.int64 if a["to"] == TensorProto.INT64 else np.int32)
    if op == "Gather":
        x, idx = val(0), val(1)
        if x is None or idx is None:
            return None
        axis = a.get("axis", 0)
        n = x.shape[axis]
        if np.any(idx < -n) or np.any(idx >= n):
            return None
        return np.take(x, idx, axis=axis)
    if op in ("Unsqueeze", "Squeeze"):
        x = val(0)
        if x is None:
            return None
        if "axes" in a:
            axes = list(a["axes"])
        else:
            ok, ax = opt(1)
            if not ok:
                return None
            axes = None if ax is None else [int(v) for v in ax.reshape(-1)]
        if op == "Squeeze":
            if axes is None:
                return np.squeeze(x)
            axes = [v + x.ndim if v < 0 else v for v in axes]
            if any(x.shape[v] != 1 for v in axes):
                return None
            return np.squeeze(x, axis=tuple(axes))
        if axes is None:
            return None
        rank = x.ndim + len(axes)
        axes = sorted(v + rank if v < 0 else v for v in axes)
        for v in axes:
            x = np.expand_dims(x, v)
        return x
    if op == "Concat":
        parts = [values.get(i) for i in ins]
        if any(p is None for p in parts) or "axis" not in a:
            return None
        if len({p.dtype for p in parts}) != 1:
            return None
        return np.concatenate(parts, axis=a["axis"])
    if op == "Slice":
        x = val(0)
        if x is None or x.ndim != 1:
            return None
        if "starts" in a:  # opset < 10: attributes
            starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
        else:
            starts, ends = val(1), val(2)
            ok_a, axes = opt(3)
            ok_s, steps = opt(4)
            if starts is None or ends is None or not (ok_a and ok_s):
                return None
        starts, ends = [int(v) for v in np.reshape(starts, -1)], [int(v) for v in np.reshape(ends, -1)]
        axes = [0] * len(starts) if axes is None else [int(v) for v in np.reshape(axes, -1)]
        steps = [1] * len(starts) if steps is None else [int(v) for v in np.reshape(steps, -1)]
        if len(starts) != 1 or axes not in ([0], [-1]) or steps != [1]:
            return None
        return x[starts[0]:ends[0]]
    if op in ("Add", "Sub", "Mul", "Div"):
        x, y = val(0), val(1)
        if x is None or y is None or x.dtype != y.dtype:
            return None
        if op == "Add":
            return x + y
        if op == "Sub":
            return x - y
        if op == "Mul":
            return x * y
        if np.any(x < 0) or np.any(y <= 0):  # integer division: floor and truncation agree here
            return None
        return x // y
    return None


# ------------------------------------------------------------------------------------------------
# shape rules of com.microsoft quantized operators
# ------------------------------------------------------------------------------------------------

def _static(tp) -> tuple[int, list[int]] | None:
    """(element type, dims) of a TypeProto with a fully static tensor shape, else None."""
    if tp is None or not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    if not tt.elem_type or not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    return tt.elem_type, dims


def _broadcast(a: list[int], b: list[int]) -> list[int] | None:
    out = []
    for x, y in zip([1] * (len(b) - len(a)) + a, [1] * (len(a) - len(b)) + b):
        if x != y and 1 not in (x, y):
            return None
        out.append(x if y == 1 else y)
    return out


def _set(ctx, elem: int, dims: list[int]) -> None:
    ctx.set_output_type(0, helper.make_tensor_type_proto(elem, dims))


def _in(ctx, i):
    return _static(ctx.get_input_type(i)) if i < ctx.get_num_inputs() else None


def _rule_binary(ctx) -> None:
    """QLinearAdd, QLinearMul (A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp): C has A's type
    and the broadcast shape of A and B."""
    a, b = _in(ctx, 0), _in(ctx, 3)
    if a and b:
        dims = _broadcast(a[1], b[1])
        if dims is not None:
            _set(ctx, a[0], dims)


def _rule_unary(ctx) -> None:
    """QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax (X, X_scale, X_zp, Y_scale, Y_zp): Y is X's
    type and shape."""
    x = _in(ctx, 0)
    if x:
        _set(ctx, *x)


def _rule_concat(ctx) -> None:
    """QLinearConcat (Y_scale, Y_zp, then (X, X_scale, X_zp) per input; ``axis``): Y has Y_zp's
    type; the inputs' shapes joined along ``axis``."""
    axis = None
    yz = _in(ctx, 1)
    xs = [_in(ctx, i) for i in range(2, ctx.get_num_inputs(), 3)]
    axis = _attr_int(ctx, "axis")
    if yz is None or axis is None or not xs or any(x is None for x in xs):
        return
    rank = len(xs[0][1])
    if any(len(x[1]) != rank for x in xs) or not -rank <= axis < rank:
        return
    axis %= rank
    dims = list(xs[0][1])
    for x in xs[1:]:
        if any(x[1][k] != dims[k] for k in range(rank) if k != axis):
            return
        dims[axis] += x[1][axis]
    _set(ctx, yz[0], dims)


def _rule_global_pool(ctx) -> None:
    """QLinearGlobalAveragePool (X, x_scale, x_zp, y_scale, y_zp; ``channels_last``): Y has X's type;
    spatial dims become 1."""
    x = _in(ctx, 0)
    if not x or len(x[1]) < 3:
        return
    last = _attr_int(ctx, "channels_last") or 0
    dims = list(x[1])
    spatial = range(1, len(dims) - 1) if last else range(2, len(dims))
    for k in spatial:
        dims[k] = 1
    _set(ctx, x[0], dims)


def _rule_gemm(ctx) -> None:
    """QGemm (A, a_scale, a_zp, B, b_scale, b_zp, C, y_scale, y_zp; ``transA``, ``transB``): Y is
    [M, N], of y_zp's type when y_scale is given, else float."""
    a, b = _in(ctx, 0), _in(ctx, 3)
    if not a or not b or len(a[1]) != 2 or len(b[1]) != 2:
        return
    m = a[1][1] if _attr_int(ctx, "transA") else a[1][0]
    n = b[1][0] if _attr_int(ctx, "transB") else b[1][1]
    if ctx.get_num_inputs() > 7 and ctx.get_input_type(7) is not None:
        yz = _in(ctx, 8)
        if yz is None:
            return
        elem = yz[0]
    else:
        elem = TensorProto.FLOAT
    _set(ctx, elem, [m, n])


def _attr_int(ctx, name: str) -> int | None:
    a = ctx.get_attribute(name)
    return None if a is None else int(a.i)


RULES = {
    "QLinearAdd": _rule_binary,
    "QLinearMul": _rule_binary,
    "QLinearSigmoid": _rule_unary,
    "QLinearLeakyRelu": _rule_unary,
    "QLinearSoftmax": _rule_unary,
    "QLinearConcat": _rule_concat,
    "QLinearGlobalAveragePool": _rule_global_pool,
    "QGemm": _rule_gemm,
}

_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from onnx import defs

    types = ["tensor(float)", "tensor(float16)", "tensor(double)", "tensor(int8)", "tensor(uint8)",
             "tensor(int16)", "tensor(uint16)", "tensor(int32)", "tensor(uint32)", "tensor(int64)",
             "tensor(uint64)", "tensor(bool)"]
    P = defs.OpSchema.FormalParameter
    V = defs.OpSchema.FormalParameterOption.Variadic
    for name, rule in RULES.items():
        s = defs.OpSchema(name, RULE_DOMAIN, 1,
                          inputs=[P("inputs", "T", param_option=V, is_homogeneous=False, min_arity=0)],
                          outputs=[P("Y", "T")], type_constraints=[("T", types, "")])
        s.set_type_and_shape_inference_function(rule)
        defs.register_schema(s)
    _registered = True


def _rule_nodes(work: onnx.ModelProto) -> bool | None:
    """Move the copy's com.microsoft nodes that have a rule here to RULE_DOMAIN; True when some did,
    None when a com.microsoft node has no rule (ONNX inference cannot pass it: not resolvable)."""
    moved = False
    for node in work.graph.node:
        if node.domain == "com.microsoft":
            if node.op_type not in RULES:
                return None
            node.domain = RULE_DOMAIN
            moved = True
    if moved:
        _register()
        work.opset_import.append(helper.make_opsetid(RULE_DOMAIN, 1))
    return moved
