"""Shape inference of a loaded or rewritten model: ONNX shape inference (the large weights held
apart where the graph allows it), then, for what it leaves unknown, :mod:`fixer.shape_fill` and, last,
one onnxruntime run that records the shapes the tensors actually have.
"""

from __future__ import annotations

import itertools
import logging
from operator import methodcaller
from pathlib import Path

import onnx
from onnx import shape_inference

from .protomirror import model_class, onnx_schema
from .runtime import prepare_for_runtime, runtime_initializers, runtime_session, session_options

log = logging.getLogger(__name__)

_HAS_DIM_VALUE = methodcaller("HasField", "dim_value")


def infer_shapes(model: onnx.ModelProto, path: Path, warnings: list[str], *,
                 weights_apart: bool = False, static_out: list | None = None) -> onnx.ModelProto:
    """ONNX shape inference (data propagation on). ``weights_apart`` (a graph without subgraphs and
    functions): :func:`_infer_apart`, the same result without copying the weights through it; there
    ``static_out`` (a list) receives the set of value_info and output names inferred with a fully
    static tensor shape, when that path could read them (see :func:`unknown_shape_tensors`)."""
    # Stale value_info from the exporter can contradict pinned inputs; inference recomputes it.
    del model.graph.value_info[:]
    for out in model.graph.output:
        # Outputs keep their declared element type but drop symbolic dims so inference can fill them.
        shape = out.type.tensor_type.shape
        if any(not d.HasField("dim_value") for d in shape.dim):
            out.type.tensor_type.ClearField("shape")
    try:
        if weights_apart:
            return _infer_apart(model, static_out)
        return shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - inference errors on odd models must not abort an audit
        warnings.append(f"shape inference failed ({str(exc).splitlines()[0]}); some shapes are unknown")
        return model


#: Initializers whose bytes :func:`_infer_apart` keeps out of shape inference: at least this large
#: and not of an integer type shape arithmetic reads (inference reads the values of small int64/int32
#: tensors only: Reshape targets, Slice bounds... and a few float scales, far below this size).
_APART_MIN_BYTES = 4096
_SHAPE_DATA_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def _infer_apart(model: onnx.ModelProto, static_out: list | None = None) -> onnx.ModelProto:
    """``infer_shapes(model)`` for a graph without subgraphs or functions, with the large weights'
    bytes held apart: inference serializes the model, copies it in C++ and returns a new model, so
    every weight byte was copied four times for shapes that never depend on them. Returns ``model``
    itself with the inferred value_info and outputs (inference changes nothing else in such a graph;
    tests/test_shape_fill.py compares the bytes with plain inference on every shared model).

    Only the graph's outputs and value_info of what inference returns are read (:func:`_vi_mirror`:
    the rest of the model is not parsed again) and merged into ``model`` as serialized; ``static_out``
    (a list) then receives the names among them with a fully static tensor shape."""
    held = []
    for t in model.graph.initializer:
        if t.data_type not in _SHAPE_DATA_TYPES:
            data = t.raw_data
            if len(data) >= _APART_MIN_BYTES:
                held.append((t, data))
                t.ClearField("raw_data")
    mirror = _vi_mirror()
    try:
        if mirror is None:
            inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        else:  # what shape_inference.infer_shapes runs, without parsing its answer into a new model
            out = shape_inference.C.infer_shapes(model.SerializeToString(), False, False, True)
    finally:
        for t, data in held:
            t.raw_data = data
    g = model.graph
    del g.value_info[:]
    del g.output[:]
    if mirror is None:
        ig = inferred.graph
        g.value_info.extend(ig.value_info)
        g.output.extend(ig.output)
        return model
    typed = mirror.FromString(out)
    if static_out is not None:
        static_out.append(_static_names(typed.graph))
    typed.DiscardUnknownFields()  # the graph's outputs and value_info alone (merging appends them)
    model.MergeFromString(typed.SerializeToString())
    return model


_VI_MIRROR: list = []


def _vi_mirror():
    """A message class reading, of a serialized ``onnx.ModelProto``, only ``graph.output`` and
    ``graph.value_info`` (every other field unknown to it), with a ValueInfoProto's ``type`` (and any
    other sub-message field of it) kept as its serialized bytes; None where it cannot be built.

    Serialized again (unknown fields discarded), it is a ModelProto holding those two lists alone,
    field for field as read: merged into a model, it appends them. A self-test decides it is usable."""
    if _VI_MIRROR:
        return _VI_MIRROR[0]
    cls = None
    try:
        from google.protobuf import descriptor_pb2

        fdp, old = onnx_schema()
        lite = descriptor_pb2.FileDescriptorProto(name="nafix_vi/" + fdp.name, package="nafix_vi." + fdp.package,
                                                  syntax="proto2")
        keep = {"ModelProto": ("graph",), "GraphProto": ("output", "value_info"), "ValueInfoProto": None}
        for m in fdp.message_type:
            if m.name not in keep:
                continue
            nm = lite.message_type.add(name=m.name)
            for f in m.field:
                if keep[m.name] is not None and f.name not in keep[m.name]:
                    continue
                nf = nm.field.add()
                nf.CopyFrom(f)
                if m.name == "ValueInfoProto" and nf.type == nf.TYPE_MESSAGE:
                    nf.type = nf.TYPE_BYTES  # the same wire format: kept as serialized
                    nf.ClearField("type_name")
                elif nf.type_name.startswith(old):
                    nf.type_name = ".nafix_vi" + nf.type_name
        mirror = model_class(lite)
        vi = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].message_type.fields_by_name["value_info"].message_type
        assert set(mirror.DESCRIPTOR.fields_by_name["graph"].message_type.fields_by_name["value_info"]
                   .message_type.fields_by_name) == set(vi.fields_by_name)
        # self-test: a model's outputs and value_info come back alone, byte for byte, and merge as extend() does
        from onnx import helper

        probe = helper.make_model(helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"], name="n")], "g",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, "n"])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2], doc_string="d")],
            value_info=[helper.make_tensor_value_info("z", onnx.TensorProto.INT8, None)]))
        helper.set_model_props(probe, {"k": "v"})
        probe.graph.value_info[0].metadata_props.add(key="a", value="b")
        typed = mirror.FromString(probe.SerializeToString())
        assert [(v.name, v.type) for v in typed.graph.output] == [("y", probe.graph.output[0].type.SerializeToString())]
        typed.DiscardUnknownFields()
        merged = onnx.ModelProto()
        merged.MergeFromString(typed.SerializeToString())
        want = onnx.ModelProto()
        want.graph.output.extend(probe.graph.output)
        want.graph.value_info.extend(probe.graph.value_info)
        assert merged.SerializeToString() == want.SerializeToString()
        # and the call _infer_apart makes answers as shape_inference.infer_shapes does
        probe.opset_import[0].version = 13
        probe.graph.output[0].type.tensor_type.ClearField("shape")
        answer = mirror.FromString(shape_inference.C.infer_shapes(probe.SerializeToString(), False, False, True))
        answer.DiscardUnknownFields()
        inferred = shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
        want = onnx.ModelProto()
        want.graph.output.extend(inferred.graph.output)
        want.graph.value_info.extend(inferred.graph.value_info)
        assert answer.SerializeToString() == want.SerializeToString()
        assert len(inferred.graph.output[0].type.tensor_type.shape.dim) == 2  # (inference really typed it)
        cls = mirror
    except Exception:  # noqa: BLE001 - any trouble: inference's answer is parsed as a whole model
        log.debug("no value_info mirror; inference's answer is parsed as a model", exc_info=True)
        cls = None
    _VI_MIRROR.append(cls)
    return cls


def _static_names(graph) -> set[str]:
    """The names of ``graph``'s value_info and outputs (of :func:`_vi_mirror`: types as bytes) whose
    tensor shape is fully static, each distinct type decoded once."""
    static: dict[bytes, bool] = {}
    names = set()
    for vi in itertools.chain(graph.value_info, graph.output):
        key = vi.type
        ok = static.get(key)
        if ok is None:
            tt = onnx.TypeProto.FromString(key).tensor_type
            ok = static[key] = tt.HasField("shape") and all(map(_HAS_DIM_VALUE, tt.shape.dim))
        if ok:
            names.add(vi.name)
    return names


def refresh_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Recompute value_info after a rewrite: ONNX shape inference, then (where it gives up on contrib
    ops or shape arithmetic) one onnxruntime run, as at load time."""
    warnings: list[str] = []
    model = infer_shapes(model, Path("<rewritten>"), warnings)
    fill_shapes_by_running(model, warnings)
    for w in warnings:
        log.debug("after rewrite: %s", w)
    return model


def unknown_shape_tensors(model: onnx.ModelProto, produced: list[str] | None = None,
                          static: set[str] | None = None, initializers: set[str] | None = None) -> list[str]:
    """Outputs of non-Constant nodes without a fully static shape in value_info, outputs or inputs
    (``produced``: those outputs' names, in node order, when the caller has them; ``static``: the
    value_info and output names with a fully static shape, when the caller has them: the inputs are
    still read here; ``initializers``: the initializers' names, when the caller has them)."""
    g = model.graph
    known = set(initializers) if initializers is not None else {t.name for t in g.initializer}
    static_of: dict[bytes, bool] = {}  # serialized TensorTypeProto -> fully static (few distinct per graph)
    if static is not None:
        known |= static
    for vi in (g.input if static is not None else itertools.chain(g.value_info, g.output, g.input)):
        tt = vi.type.tensor_type
        key = tt.SerializeToString()
        ok = static_of.get(key)
        if ok is None:
            ok = static_of[key] = tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)
        if ok:
            known.add(vi.name)
    if produced is None:
        produced = [o for node in g.node if node.op_type != "Constant" for o in node.output if o]
    if known.issuperset(produced):
        return []  # (the common case, decided in C)
    return [o for o in produced if o not in known]


def fill_shapes_by_running(model: onnx.ModelProto, warnings: list[str], *, produced: list[str] | None = None,
                           static: set[str] | None = None, initializers: set[str] | None = None) -> None:
    """Where ONNX shape inference gives up (contrib ops, shape arithmetic), run the model once in
    onnxruntime on seeded data and record the shapes and types it actually produced (``produced``,
    ``static``, ``initializers``: as for :func:`unknown_shape_tensors`)."""
    missing = unknown_shape_tensors(model, produced, static, initializers)
    if not missing:
        return
    # First without running anything: shape arithmetic folded and com.microsoft shape rules (exact
    # static shapes or nothing; fixer.shape_fill). The run below stays for what that leaves unknown.
    from .shape_fill import infer_missing

    found = infer_missing(model, missing)
    if found is not None:
        model.graph.value_info.extend(found)
        return
    import numpy as np
    from onnx import helper

    probe = onnx.ModelProto()
    probe.CopyFrom(prepare_for_runtime(model))
    declared = {o.name for o in probe.graph.output}
    for name in missing:
        if name not in declared:
            probe.graph.output.append(helper.ValueInfoProto(name=name))
    try:
        # one thread: the probe only reads shapes and element types, and a thread pool (spinning while
        # the run lasts) cost more to start than it saved: 5 probed shared models 0.15 -> 0.07 s
        opts = session_options(threads=1)
        sess = runtime_session(probe.SerializeToString(), opts, initializers=runtime_initializers(probe))
        rng = np.random.default_rng(0)
        feeds = {}
        for i in sess.get_inputs():
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            feeds[i.name] = _random_input(rng, i.type, shape)
        names = [o.name for o in sess.get_outputs()]
        values = sess.run(names, feeds)
    except Exception as exc:  # noqa: BLE001 - a model ORT cannot run keeps its unknown shapes
        warnings.append(f"{len(missing)} tensor shape(s) unknown; onnxruntime could not run the model to find them ({str(exc).splitlines()[0][:120]})")
        return
    from onnx import numpy_helper  # noqa: F401  (keeps helper import local)

    by_name = dict(zip(names, values))
    for name in missing:
        v = by_name.get(name)
        if v is None or not hasattr(v, "shape"):
            continue
        elem = helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype)
        model.graph.value_info.append(helper.make_tensor_value_info(name, elem, list(np.asarray(v).shape)))


def _random_input(rng, type_str: str, shape: list[int]):
    import numpy as np

    kind = type_str[len("tensor("):-1] if type_str.startswith("tensor(") else "float"
    dtype = {"float": np.float32, "double": np.float64, "float16": np.float16, "int8": np.int8,
             "uint8": np.uint8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
             "bool": np.bool_}.get(kind, np.float32)
    if np.dtype(dtype).kind == "f":
        return rng.random(shape, dtype=np.float64).astype(dtype)
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -128), min(info.max, 127) + 1, shape).astype(dtype)
