"""Placement and estimate fast paths against the plain code they replace, on every shared and sample
model: the constant-derived nodes (view.is_const inline), the weight bytes (each constant's type and
shape read once) and the epoch estimate reading the quantization domain's activation lists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fixer import ir
from fixer.api import AnalysisOptions, resolve_profile
from fixer.graph import QDQ_OPS, GraphView
from fixer.model_io import load_model
from fixer.npu import memory, placement
from fixer.npu.estimate import estimate_epochs

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted((ROOT.parent / "shared" / "models").glob("*.onnx")) + sorted((ROOT / "sample_models").glob("*.onnx"))


def _const_derived_reference(view: GraphView) -> frozenset[str]:
    out: set[str] = set()
    derived: set[str] = set()
    for node in view.nodes:
        ins = [t for t in node.inputs if t.name]
        if not ins:
            continue
        if all(isinstance(t, ir.Constant) or t.name in derived or view.is_const(t) for t in ins):
            derived.update(o.name for o in node.outputs)
            if node.op not in QDQ_OPS or any(t.name in derived for t in ins):
                out.add(node.name)
    return frozenset(out)


def _weights_bytes_reference(view: GraphView) -> int:
    seen: set[str] = set()
    total = 0
    for node in view.nodes:
        for i, t in enumerate(node.inputs):
            if not isinstance(t, ir.Constant) or t.name in seen:
                continue
            if node.op in QDQ_OPS and i > 0:
                continue
            if t.dtype == np.int64 or t.size <= 1 and node.op not in QDQ_OPS:
                continue
            seen.add(t.name)
            total += t.nbytes
    return total


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_fast_paths_equal_the_plain_code(path):
    view = GraphView(load_model(path).model)
    assert placement._const_derived(view) == _const_derived_reference(view)
    assert memory.weights_bytes(view) == _weights_bytes_reference(view)
    consts = {t.name: t for n in view.nodes for t in n.inputs if isinstance(t, ir.Constant)}
    for t in consts.values():  # Constant.stored() (read from the proto) against its three properties
        dtype, size, nbytes = t.stored()
        assert (np.dtype(dtype) if not isinstance(dtype, int) else dtype, size, nbytes) == (t.dtype, t.size, t.nbytes)
    profile = resolve_profile(AnalysisOptions())
    domain = placement.quant_domain(view, profile)
    placed = placement.place(view, profile, domain=domain)
    assert estimate_epochs(view, placed, profile, domain=domain) == estimate_epochs(view, placed, profile)


def test_weights_bytes_of_decoded_and_undecoded_constants_agree():
    """A constant whose values were decoded counts the same bytes as one read from its proto."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    b = numpy_helper.from_array(np.ones((4,), np.int32), "b")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w, b])
    view = GraphView(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    lazy = memory.weights_bytes(view)
    for t in view.nodes[0].inputs:
        if isinstance(t, ir.Constant):
            t.values  # noqa: B018 - decode
    assert lazy == memory.weights_bytes(view) == _weights_bytes_reference(view) == 4 * 27 * 4 + 4 * 4


def _activations_reference(view: GraphView, node) -> list:
    return [t for t in node.inputs if t.name and not view.is_const(t)]


def _uint8_sink_reference(domain, t) -> bool:
    for c, _ in domain.view.sinks(t):
        if c is not None and c.op == "QuantizeLinear" and len(c.inputs) > 2:
            zp = c.inputs[2]
            if zp.dtype is not None and np.dtype(zp.dtype) == np.uint8 and not domain.view.is_graph_output(c.outputs[0]):
                return True
    return False


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_quant_domain_fast_paths_equal_the_plain_code(path):
    """The domain's activation lists are view.activations'; uint8_sink, answered at once when no
    QuantizeLinear has a uint8 zero-point, is what walking every tensor's readers says; the layout
    Transposes read from the imported nodes' protos are those of a walk of the model."""
    view = GraphView(load_model(path).model)
    domain = placement.quant_domain(view, resolve_profile(AnalysisOptions()))
    tensors = {t.name: t for n in view.nodes for t in (*n.inputs, *n.outputs) if t.name}
    for node in view.nodes:
        assert [t.name for t in domain.activations(node)] == [t.name for t in _activations_reference(view, node)]
    sinks = {name: _uint8_sink_reference(domain, t) for name, t in tensors.items()}
    assert {name: domain.uint8_sink(t) for name, t in tensors.items()} == sinks
    assert domain.has_uint8 or not any(sinks.values()) and not any(domain.uint8_source(t) for t in tensors.values())
    assert placement._import_layout_nodes(view.model, view.nodes) == placement._import_layout_nodes(view.model)


def _uint8_model(zp_type, marked: bool = False):
    """x -> Q(uint8 or int8 zero-point) -> DQ -> Relu -> Q -> DQ -> Transpose (marked as a TFLite
    layout change when ``marked``) -> y."""
    from onnx import TensorProto, helper, numpy_helper

    np_zp = np.uint8 if zp_type == TensorProto.UINT8 else np.int8
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             numpy_helper.from_array(np.array(3, np_zp), "z")]
    tr = helper.make_node("Transpose", ["d2"], ["y"], name="layout", perm=[0, 3, 1, 2])
    if marked:
        tr.doc_string = "nafix.tflite.layout"
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q1"], name="q1"),
             helper.make_node("DequantizeLinear", ["q1", "s", "z"], ["d1"], name="d1"),
             helper.make_node("Relu", ["d1"], ["r"], name="relu"),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q2"], name="q2"),
             helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["d2"], name="d2"), tr]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("uint8", [True, False])
def test_uint8_shortcut_agrees_with_the_walk(uint8):
    """With and without a uint8 QuantizeLinear the shortcut gives the walk's answers, and the uint8
    model's Relu is still flagged by int8_activations."""
    from onnx import TensorProto

    view = GraphView(_uint8_model(TensorProto.UINT8 if uint8 else TensorProto.INT8, marked=True))
    profile = resolve_profile(AnalysisOptions())
    domain = placement.quant_domain(view, profile)
    assert domain.has_uint8 is uint8
    relu_out = next(n for n in view.nodes if n.op == "Relu").outputs[0]
    assert domain.uint8_sink(relu_out) is _uint8_sink_reference(domain, relu_out) is uint8
    placed = placement.place(view, profile, domain=domain).by_name
    flagged = any(r.constraint == "int8_activations" for r in placed["relu"].notes + placed["relu"].reasons)
    assert flagged is uint8
    assert placement._import_layout_nodes(view.model, view.nodes) == frozenset({"layout"})
    assert placed["layout"].role.startswith("layout change")


def test_import_value_info_types_match_their_protos():
    """Each typed tensor the importer builds has the dtype, shape and kind its ValueInfoProto
    decodes to (a fresh shape list each), and refers to that proto."""
    from onnx import TensorProto, helper

    model = _uint8_model(TensorProto.UINT8)
    model = __import__("onnx").shape_inference.infer_shapes(model)
    model.graph.value_info.append(helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2, "n"]))
    model.graph.value_info.append(helper.make_empty_tensor_value_info("untyped"))
    g = ir.import_onnx(model)
    built = {}
    imp = ir._Importer(ir._Source())
    for vi in model.graph.value_info:
        local: dict = {}
        t = imp._value_info(vi, local, [], update=True)
        built[vi.name] = t
        if vi.type.ByteSize():
            dtype, shape, kind = ir._vi_type(vi)
        else:
            dtype, shape, kind = None, None, "tensor_type"
        assert type(t) is ir.Variable and t.name == vi.name
        assert (t.dtype, t.shape, t.type) == (dtype, shape, kind)
        assert t._src.get(t._pi) is vi
    shapes = [t.shape for t in built.values() if t.shape is not None]
    assert len({id(s) for s in shapes}) == len(shapes)  # no shared shape list
    tensors = g.tensors()
    for name in ("q1", "d1", "r"):
        assert (tensors[name].dtype, tensors[name].shape) == (built[name].dtype, built[name].shape)


def test_by_name_maps_every_node_and_nested_names_to_their_owner():
    a = placement.NodePlacement("a", "Relu", placement.HW)
    b = placement.NodePlacement("b", "If", placement.SW)
    flat = placement.Placement(nodes=[a, b], oe_export=False, profile="p")
    assert flat.by_name == {"a": a, "b": b} and list(flat.by_name) == ["a", "b"]
    nested = placement.Placement(nodes=[a, b], oe_export=False, profile="p",
                                 nested={"inner": "b", "gone": "missing", "a": "b"})
    # a subgraph node maps to its If; a top-level name wins over a nested one; an owner not placed is left out
    assert nested.by_name == {"inner": b, "a": a, "b": b}


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_checks_declared_for_some_ops_are_skipped_only_where_they_pass(path, monkeypatch):
    """A constraint that declares the ops it can fail on (``ops``) is not called for other ops: the
    placement is the same as with every check called for every node."""
    import dataclasses

    from fixer.npu.constraints import REGISTRY

    profile = resolve_profile(AnalysisOptions())
    model = load_model(path).model
    skipped = placement.place(GraphView(model), profile)
    for cid, c in list(REGISTRY.items()):
        if c.ops is not None:
            monkeypatch.setitem(REGISTRY, cid, dataclasses.replace(c, ops=None))
    assert any(c.ops is None for c in REGISTRY.values())
    called = placement.place(GraphView(model), profile)
    assert skipped.nodes == called.nodes
    assert skipped.model_findings == called.model_findings
