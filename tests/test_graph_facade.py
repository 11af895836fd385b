"""The one graph facade: the uint8 conversion and the island requantization edit nafix's IR through
:mod:`fixer.graph`; what stays at the protobuf level (for onnxruntime) has one implementation each."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer import ir
from fixer import quantize as Q
from fixer.errors import UsageError
from fixer.graph import Editor, GraphView, attr, qparams, read_graph, unique_node_names
from fixer.quantize.modelproto import _keep_initializer_order, _unique_names
from fixer.quantize.uint8 import _tensor_types, convert_uint8_graph

ROOT = Path(__file__).resolve().parent.parent


def _u8_model(dq_zero_point: np.ndarray) -> onnx.ModelProto:
    """x -> Q(uint8) -> Reshape -> DQ(zero-point given) -> y."""
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(100, np.uint8), "z"),
             numpy_helper.from_array(dq_zero_point, "z2"),
             numpy_helper.from_array(np.array([1, 8], np.int64), "shp")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
             helper.make_node("Reshape", ["xq", "shp"], ["xr"], name="r"),
             helper.make_node("DequantizeLinear", ["xr", "s", "z2"], ["y"], name="dq")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _convert_live(model: onnx.ModelProto):
    graph = ir.import_onnx(model)
    ed = Editor(graph, rule_id="t", anchor=None, provenance={})
    before = onnx.ModelProto.SerializeToString(ir.export_onnx(graph))
    return graph, ed, before


def test_uint8_conversion_of_the_live_graph_refuses_before_any_change():
    """A uint8 region read with a zero-point of another type is refused; the graph is left as it was
    (the NAF014 rewriter edits the engine's graph, so a refusal must not leave half a conversion)."""
    m = _u8_model(np.array(-28, np.int8))
    graph, ed, before = _convert_live(m)
    with pytest.raises(UsageError, match="mixes a uint8 tensor with a int8 zero-point"):
        convert_uint8_graph(graph, ed, _tensor_types(m), io="int8", model_name="m")
    assert ir.export_onnx(graph).SerializeToString() == before


def test_uint8_conversion_of_the_live_graph_matches_the_model_conversion():
    m = _u8_model(np.array(100, np.uint8))
    graph, ed, _ = _convert_live(m)
    conv = convert_uint8_graph(graph, ed, _tensor_types(m), io="int8", model_name="m")
    assert conv.model is None and conv.changes and conv.exact
    by_name = {n.name: n for n in graph.nodes}
    for name in ("q", "dq"):
        s, z = qparams(by_name[name])
        assert z.dtype == np.int8 and int(z) == -28 and float(s) == np.float32(0.05)
    assert conv.new_constants == ["z_int8__nafix_0", "z2_int8__nafix_0"]
    whole = Q.convert_uint8_to_int8(m, io="int8")
    assert [(n.op_type, n.name, list(n.input)) for n in whole.model.graph.node] == [
        (n.op, n.name, [t.name for t in n.inputs]) for n in graph.nodes]
    # the model keeps its initializer order, the new zero-point last (what the protobuf edits did)
    assert [t.name for t in whole.model.graph.initializer] == ["s", "shp", "z_int8__nafix_0", "z2_int8__nafix_0"]


def test_one_unique_name_rule_for_views_and_onnxruntime_models():
    nodes = [helper.make_node("Relu", ["a"], ["b"], name="n"), helper.make_node("Relu", ["b"], ["c"], name="n"),
             helper.make_node("Relu", ["c"], ["d"]), helper.make_node("Relu", ["d"], ["e"], name="n")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p = onnx.ModelProto()
    p.CopyFrom(m)
    assert _unique_names(p) == 3
    assert [n.name for n in p.graph.node] == ["n", "n__nafix_0", "Relu_2", "n__nafix_1"]
    assert [n.name for n in GraphView(m).nodes] == ["n", "n_1", "Relu_2", "n_2"]
    graph = ir.import_onnx(m)
    assert unique_node_names(graph.nodes) == 3 and [n.name for n in graph.nodes] == [n.name for n in p.graph.node]


def test_keep_initializer_order_puts_new_ones_last_in_their_order():
    g = helper.make_graph([], "g", [], [], [numpy_helper.from_array(np.zeros(1, np.float32), n) for n in "dbca"])
    m = helper.make_model(g)
    _keep_initializer_order(m, ["a", "b"])
    assert [t.name for t in m.graph.initializer] == ["a", "b", "d", "c"]


def test_attr_reads_strings_as_str():
    n = ir.Node("Resize", name="r", attrs={"mode": b"linear", "names": [b"x", "y"], "axis": 2})
    assert attr(n, "mode") == "linear" and attr(n, "names") == ["x", "y"] and attr(n, "axis") == 2
    assert attr(n, "missing", "nearest") == "nearest"


@pytest.mark.parametrize("pattern", [r"^class _Graph\b", r"^def _constants\(", r"^def _opset\(", r"^def _set_attr\(",
                                     r"^def _remove_dead\(", r"^def _attr\(node: ir\.Node"])
def test_no_second_graph_helper(pattern):
    """Structure is read through fixer.ir / fixer.graph: no private copy of these helpers in fixer/."""
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "fixer").rglob("*.py")
            if re.search(pattern, p.read_text(encoding="utf-8"), re.MULTILINE)]
    assert hits == []


def test_read_graph_has_the_structure_without_intermediate_types():
    m = _u8_model(np.array(100, np.uint8))
    m.graph.value_info.append(helper.make_tensor_value_info("xq", TensorProto.UINT8, [2, 4]))
    full, light = ir.import_onnx(m), read_graph(m)
    assert [(n.op, n.name, [t.name for t in n.inputs]) for n in light.nodes] == [
        (n.op, n.name, [t.name for t in n.inputs]) for n in full.nodes]
    assert full.tensors()["xq"].dtype == np.uint8 and light.tensors()["xq"].dtype is None
    assert light.inputs[0].dtype == np.float32  # graph inputs and outputs keep their types
    assert int(qparams(light.nodes[0])[1]) == 100


def test_loader_renames_duplicates_avoiding_every_name_and_leaves_unnamed_nodes():
    from fixer.model_io import make_node_names_unique

    names = ["a", "a", "a_1", "", "a"]
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=n) for i, n in enumerate(names)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("t5", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    view_names = [n.name for n in GraphView(m).nodes]
    assert make_node_names_unique(m) == 2
    assert [n.name for n in m.graph.node] == ["a", "a_2", "a_1", "", "a_3"]
    assert view_names == ["a", "a_1", "a_1_1", "Relu_3", "a_2"]  # a view only avoids the names before


def test_is_quantized_is_one_predicate_over_op_types():
    """QuantizeLinear/DequantizeLinear or any QLinear op makes a model quantized; integer ops alone or
    float ops do not (the question the engine's float guard, --quantize's input kind and the placement's finding ask)."""
    from fixer.graph import is_quantized, quantized_ops

    def model(*ops):
        nodes = [helper.make_node(op, ["x"], [f"y{i}"]) for i, op in enumerate(ops)]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [])
        return helper.make_model(g)

    assert not is_quantized(model("Conv", "Relu")) and not is_quantized(model("ConvInteger"))
    assert is_quantized(model("Conv", "DequantizeLinear")) and is_quantized(model("QLinearConv"))
    assert quantized_ops(["QuantizeLinear"]) and not quantized_ops(["MatMulInteger", "Add"])
