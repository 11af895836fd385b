"""nafix's graph IR (:mod:`fixer.ir`): import/export round trips, synchronized producer/consumer
lists, lazy constants, toposort and cleanup."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixer import ir
from fixer.graph import GraphView

from .helpers import make_model

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample_models").glob("*.onnx"))


def tv(name, shape, elem=T.FLOAT):
    return h.make_tensor_value_info(name, elem, shape)


def chain_model() -> onnx.ModelProto:
    """x -> Conv(W, B) -> Relu -> Add(x2) -> y, with a side branch; weights 8x4x3x3."""
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "W")
    b = nh.from_array(rng.standard_normal(8).astype(np.float32), "B")
    nodes = [h.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1]),
             h.make_node("Relu", ["c"], ["r"], name="relu"),
             h.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             h.make_node("Add", ["r", "s"], ["y"], name="add")]
    return make_model(nodes, [tv("x", [1, 4, 6, 6])], [tv("y", None)], [w, b])


def if_model() -> onnx.ModelProto:
    """An If whose branches read the outer tensors ``a`` and ``x`` (implicit inputs)."""
    then_g = h.make_graph([h.make_node("Relu", ["a"], ["then_out"], name="then_relu")], "then", [],
                          [tv("then_out", [1, 4])])
    else_g = h.make_graph([h.make_node("Neg", ["x"], ["else_out"], name="else_neg")], "else", [],
                          [tv("else_out", [1, 4])])
    nodes = [h.make_node("Add", ["x", "k"], ["a"], name="pre"),
             h.make_node("ReduceSum", ["x"], ["r"], name="rs", keepdims=0),
             h.make_node("Greater", ["r", "zero"], ["cond"], name="gt"),
             h.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    return make_model(nodes, [tv("x", [1, 4])], [tv("y", [1, 4])],
                      [nh.from_array(np.full((1, 4), 0.5, np.float32), "k"), nh.from_array(np.array(0, np.float32), "zero")])


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def random_feeds(model: onnx.ModelProto) -> dict:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    types = {"tensor(float)": np.float32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8}
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        dt = types[i.type]
        out[i.name] = rng.standard_normal(shape).astype(dt) if dt == np.float32 else rng.integers(-20, 20, shape).astype(dt)
    return out


def node_protos(model: onnx.ModelProto) -> list[bytes]:
    out = []
    for n in model.graph.node:
        n = onnx.NodeProto.FromString(n.SerializeToString())
        n.ClearField("doc_string")
        for a in n.attribute:  # a subgraph may list the outer tensors it reads in its value_info
            if a.type == onnx.AttributeProto.GRAPH:
                a.g.ClearField("value_info")
        out.append(n.SerializeToString(deterministic=True))
    return out


# -- import / export -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SAMPLES + [None], ids=[p.name for p in SAMPLES] + ["if_model"])
def test_round_trip_keeps_the_model(path):
    model = onnx.load(path) if path is not None else if_model()
    g = ir.import_onnx(model)
    g.toposort()
    out = ir.export_onnx(g)
    onnx.checker.check_model(out, full_check=True)
    # the same nodes (in depth order, see test_toposort_*), the same weights byte for byte (in the
    # order the nodes read them)
    assert sorted(node_protos(out)) == sorted(node_protos(model))
    again = ir.import_onnx(out)
    assert [n.name for n in again.toposort().nodes] == [n.name for n in out.graph.node]
    used = {name for n in model.graph.node for name in n.input}
    assert sorted(t.SerializeToString() for t in out.graph.initializer) == sorted(
        t.SerializeToString() for t in model.graph.initializer if t.name in used)
    assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
    assert [o.SerializeToString() for o in out.graph.output] == [o.SerializeToString() for o in model.graph.output]
    feeds = random_feeds(model)
    for a, b in zip(run(model, feeds), run(out, feeds)):
        np.testing.assert_array_equal(a, b)
    # nothing was decoded to write the weights again
    assert not any(t.is_loaded for t in g.tensors().values() if isinstance(t, ir.Constant))


def test_import_types_and_attributes():
    model = if_model()
    g = ir.import_onnx(model)
    x = g.inputs[0]
    assert isinstance(x, ir.Variable) and x.dtype == np.dtype(np.float32) and isinstance(x.dtype, np.dtype)
    assert x.shape == [1, 4]
    ifn = next(n for n in g.nodes if n.op == "If")
    then_g = ifn.attrs["then_branch"]
    assert isinstance(then_g, ir.Graph) and then_g.nodes[0].name == "then_relu"
    assert {id(sg) for sg in ifn.subgraphs()} == {id(then_g), id(ifn.attrs["else_branch"])}
    # a node inside a subgraph that reads an outer tensor is one of its consumers
    a = next(n for n in g.nodes if n.name == "pre").outputs[0]
    assert [c.name for c in a.outputs] == ["then_relu"]
    assert "else_neg" in [c.name for c in x.outputs]
    conv = ir.import_onnx(chain_model()).nodes[0]
    assert conv.attrs["pads"] == [1, 1, 1, 1] and type(conv.attrs["pads"]) is list
    assert conv.domain is None
    k = make_model([h.make_node("Constant", [], ["c"], name="k", value=nh.from_array(np.arange(3, dtype=np.int64))),
                    h.make_node("LeakyRelu", ["x"], ["y"], name="lr", alpha=0.25),
                    h.make_node("Resize", ["x", "", "sc"], ["z"], name="rz", mode="nearest")],
                   [tv("x", [1, 1, 2, 2])], [tv("y", None), tv("z", None), tv("c", None, T.INT64)],
                   [nh.from_array(np.ones(4, np.float32), "sc")])
    g = ir.import_onnx(k)
    byname = {n.name: n for n in g.nodes}
    cval = byname["k"].attrs["value"]
    assert isinstance(cval, ir.Constant) and not cval.is_loaded
    assert cval.shape == (3,) and cval.dtype == np.int64 and not cval.is_loaded
    np.testing.assert_array_equal(cval.values, [0, 1, 2])
    assert type(byname["lr"].attrs["alpha"]) is float and byname["lr"].attrs["alpha"] == 0.25
    assert byname["rz"].attrs["mode"] == "nearest"
    empty = byname["rz"].inputs[1]
    # an omitted optional input: an unnamed tensor of its own, not one of the graph's tensors
    assert empty.is_empty() and empty.outputs == [byname["rz"]] and "" not in g.tensors()
    # an edited attribute is written from its new value, the others from the original protos
    byname["lr"].attrs["alpha"] = 0.5
    byname["rz"].attrs["mode"] = "linear"
    out = ir.export_onnx(g)
    attrs = {n.name: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in out.graph.node}
    assert attrs["lr"]["alpha"] == 0.5 and attrs["rz"]["mode"] == b"linear"


def test_tensor_equality_is_by_name():
    a, b = ir.Variable("t"), ir.Variable("t")
    assert a == b and a is not b and a != ir.Variable("u")
    with pytest.raises(TypeError):
        hash(a)


# -- synchronized lists ----------------------------------------------------------------------------


def test_lists_stay_in_sync():
    g = ir.import_onnx(chain_model())
    conv, relu, sig, add = g.nodes
    c = conv.outputs[0]
    assert c.inputs == [conv] and [n.name for n in c.outputs] == ["relu", "sig"]
    new = ir.Variable("new", dtype=np.float32)
    relu.inputs[0] = new  # consumer.inputs[i] = new
    assert [n.name for n in c.outputs] == ["sig"] and new.outputs == [relu]
    sig.inputs.clear()
    assert c.outputs == [] and sig.inputs == []
    n = ir.Node(op="Neg", name="neg", inputs=[c], outputs=[ir.Variable("m")])  # registers itself
    assert c.outputs == [n] and n.outputs[0].inputs == [n]
    n.inputs.append(new)
    assert new.outputs == [relu, n]
    assert n.inputs.pop() is new and new.outputs == [relu]
    n.inputs.insert(0, new)
    n.inputs.remove(new)
    assert new.outputs == [relu] and n.inputs == [c]
    n.inputs = [new, new]  # assigning replaces the contents
    assert c.outputs == [] and new.outputs == [relu, n, n]
    n.inputs[0:2] = [c]
    assert c.outputs == [n] and new.outputs == [relu]
    del n.inputs[0]
    assert c.outputs == [] and n.inputs == []
    # the tensor side edits the node side too
    c.outputs.append(n)
    assert n.inputs == [c]
    c.outputs.clear()
    assert n.inputs == []
    n.outputs[0].inputs.clear()
    assert n.outputs == []
    g.nodes.append(ir.Node(op="Identity", name="id", inputs=[new], outputs=[ir.Variable("o")]))
    assert [x.name for x in new.outputs] == ["relu", "id"]


# -- lazy constants ---------------------------------------------------------------------------------


def test_audit_does_not_decode_weights():
    from fixer.graph import QDQ_OPS

    from .helpers import analyze

    for path in SAMPLES:
        model = onnx.load(path)
        a = analyze(model)
        consts = [t for t in a.view.graph.tensors().values() if isinstance(t, ir.Constant)]
        big = [t for t in consts if t.size > 64]
        assert big, path.name
        assert not [t.name for t in big if t.is_loaded], path.name
        # the weight bytes, counted from the stored shapes and types, are those of the decoded arrays
        arrays = {t.name: nh.to_array(t) for t in model.graph.initializer}
        want, seen = 0, set()
        for n in model.graph.node:
            for i, name in enumerate(n.input):
                if name not in arrays or name in seen or (n.op_type in QDQ_OPS and i > 0):
                    continue
                arr = arrays[name]
                if arr.dtype == np.int64 or arr.size <= 1 and n.op_type not in QDQ_OPS:
                    continue
                seen.add(name)
                want += arr.nbytes
        assert a.memory.weights_bytes == want > 0, path.name
        a.released()


def test_constant_values_are_read_only_and_assignment_is_exported():
    g = ir.import_onnx(chain_model())
    w = g.nodes[0].inputs[1]
    assert w.shape == (8, 4, 3, 3) and w.nbytes == 8 * 4 * 9 * 4 and not w.is_loaded
    v = w.values
    assert w.is_loaded and not v.flags.writeable
    with pytest.raises(ValueError):
        v[0, 0, 0, 0] = 1.0
    w.values = np.zeros_like(v)
    out = ir.export_onnx(g)
    got = {t.name: nh.to_array(t) for t in out.graph.initializer}
    assert not got["W"].any() and got["B"].any()


def test_release_drops_the_model_references():
    model = chain_model()
    view = GraphView(model)
    g = view.graph
    w = g.nodes[0].inputs[1]
    view.release()
    assert view.graph is None and g._src.protos is None
    with pytest.raises(RuntimeError):
        w.values


# -- toposort / cleanup -----------------------------------------------------------------------------


def _assert_sorted(nodes):
    seen = set()
    for n in nodes:
        for t in n.inputs:
            for p in t.inputs:
                assert id(p) in seen, f"{n.name} before its producer {p.name}"
        seen.add(id(n))


def test_toposort_of_an_unsorted_graph():
    model = onnx.load(ROOT / "sample_models" / "movenet_like.onnx")
    g = ir.import_onnx(model)
    g.toposort()
    sorted_names = [n.name for n in g.nodes]
    g.toposort()
    assert [n.name for n in g.nodes] == sorted_names  # a sorted graph keeps its order
    for seed in range(3):
        random.Random(seed).shuffle(g.nodes)
        g.toposort()
        _assert_sorted(g.nodes)
        assert sorted(n.name for n in g.nodes) == sorted(sorted_names)
    # by depth; nodes of one depth in the order a depth-first walk from each node (in list order) to
    # the producers it reads (in input order) finishes them: from 'add', 'relu' (its first input)
    # before 'sig', whatever their list order
    chain = ir.import_onnx(chain_model())
    conv, relu, sig, add = chain.nodes
    chain.nodes = [add, sig, relu, conv]
    chain.toposort()
    assert [n.name for n in chain.nodes] == ["conv", "relu", "sig", "add"]
    chain.nodes = [conv, sig, relu, add]  # sorted already: kept
    chain.toposort()
    assert [n.name for n in chain.nodes] == ["conv", "sig", "relu", "add"]


def test_toposort_of_a_sorted_graph_is_by_depth_then_list_order():
    # random DAGs listed in a topological order: the one-pass path must give what the docstring
    # promises, the nodes by depth, each depth in list order
    for seed in range(20):
        rng = random.Random(seed)
        x = ir.Variable("x", np.float32, [1])
        made = [x]
        nodes = []
        for i in range(rng.randint(2, 40)):
            ins = rng.sample(made, k=min(len(made), rng.randint(1, 3)))
            out = ir.Variable(f"t{i}", np.float32, [1])
            nodes.append(ir.Node("Sum", f"n{i}", inputs=ins, outputs=[out]))
            made.append(out)
        g = ir.Graph(nodes=nodes, inputs=[x], outputs=[made[-1]])
        depth = {}
        for n in nodes:
            depth[n.name] = 1 + max((depth[p.name] for t in n.inputs for p in t.inputs), default=-1)
        want = [n.name for _, _, n in sorted((depth[n.name], i, n) for i, n in enumerate(nodes))]
        assert [n.name for n in g.toposort().nodes] == want
        assert [n.name for n in g.toposort().nodes] == want  # and sorting again keeps it


def test_toposort_sees_what_subgraphs_read():
    g = ir.import_onnx(if_model())
    g.nodes.reverse()
    g.toposort()
    names = [n.name for n in g.nodes]
    assert names.index("pre") < names.index("if")  # the If's then-branch reads 'a'
    out = ir.export_onnx(g)
    onnx.checker.check_model(out, full_check=True)


def test_toposort_rejects_a_cycle():
    a, b = ir.Variable("a"), ir.Variable("b")
    g = ir.Graph(nodes=[ir.Node("Relu", "n1", inputs=[a], outputs=[b]), ir.Node("Relu", "n2", inputs=[b], outputs=[a])])
    with pytest.raises(ValueError, match="cycle"):
        g.toposort()


def test_cleanup_removes_what_no_output_needs():
    g = ir.import_onnx(chain_model())
    conv, relu, sig, add = g.nodes
    x = g.inputs[0]
    dead = ir.Node("Neg", "dead", inputs=[relu.outputs[0]], outputs=[ir.Variable("unused")])
    g.nodes.append(dead)
    add.inputs[1] = relu.outputs[0]  # sig is no longer read
    g.cleanup(remove_unused_graph_inputs=False)
    assert [n.name for n in g.nodes] == ["conv", "relu", "add"]
    assert sig.inputs == [] and dead.inputs == [] and [n.name for n in relu.outputs[0].outputs] == ["add", "add"]
    assert g.inputs == [x]
    # an unused graph input stays unless asked
    extra = ir.Variable("extra", dtype=np.float32, shape=[1])
    g.inputs.append(extra)
    g.cleanup()
    assert extra in g.inputs
    g.cleanup(remove_unused_graph_inputs=True)
    assert extra not in g.inputs and x in g.inputs
    out = ir.export_onnx(g)
    onnx.checker.check_model(out, full_check=True)
    assert [n.name for n in out.graph.node] == ["conv", "relu", "add"]
    assert {t.name for t in out.graph.initializer} == {"W", "B"}


def test_cleanup_keeps_producers_of_what_a_subgraph_reads():
    g = ir.import_onnx(if_model())
    g.cleanup()
    assert sorted(n.name for n in g.nodes) == ["gt", "if", "pre", "rs"]
    ifn = next(n for n in g.nodes if n.op == "If")
    ifn.attrs["then_branch"].nodes[0].inputs[0] = g.inputs[0]  # the branch no longer reads 'a'
    g.cleanup()
    assert sorted(n.name for n in g.nodes) == ["gt", "if", "rs"]


# -- GraphView index ---------------------------------------------------------------------------------


def folding_model() -> onnx.ModelProto:
    """c -> Neg -> Relu (both folded at compile time) -> Add(x, .) -> y; an If reads 'r'."""
    then_g = h.make_graph([h.make_node("Identity", ["r"], ["t_out"], name="then_id")], "then", [], [tv("t_out", [1, 4])])
    else_g = h.make_graph([h.make_node("Identity", ["x"], ["e_out"], name="else_id")], "else", [], [tv("e_out", [1, 4])])
    nodes = [h.make_node("Neg", ["c"], ["n"], name="neg"),
             h.make_node("Relu", ["n"], ["r"], name="relu"),
             h.make_node("Add", ["x", "r"], ["y"], name="add"),
             h.make_node("If", ["flag"], ["z"], name="if", then_branch=then_g, else_branch=else_g)]
    return make_model(nodes, [tv("x", [1, 4])], [tv("y", [1, 4]), tv("z", [1, 4])],
                      [nh.from_array(np.ones((1, 4), np.float32), "c"), nh.from_array(np.array(True), "flag")])


def _index(view: GraphView) -> tuple:
    return dict(view.by_name), set(view.folded), {k: v.name for k, v in view.nested_owner.items()}


def _rebuilt(view: GraphView) -> tuple:
    g = view.graph
    nested = {n.name: top.name for top in g.nodes for sub in top.subgraphs() for n in sub.nodes}
    return {n.name: n for n in g.nodes}, view._constant_foldable(), nested


def test_graph_view_index_is_updated_in_place():
    from fixer.graph import Editor

    view = GraphView(folding_model())
    assert view.folded == {"neg", "relu", "if"} and view.nested_owner["then_id"].name == "if"
    assert _index(view) == _rebuilt(view)
    nodes = {n.name: n for n in view.nodes}
    x = view.graph.inputs[0]
    ed = Editor(view.graph, rule_id="T", anchor=nodes["relu"], provenance={}, taken=view.names_taken)
    # relu now reads x * 2 (not foldable): relu stops being folded
    mul = ed.node("Mul", [x, ed.const(np.full((1, 4), 2, np.float32))])
    view.remove_node(nodes["neg"])
    nodes["relu"].inputs[0] = mul.outputs[0]
    ed.remove(nodes["neg"])
    view.add_node(mul)
    view.refresh_folded(nodes["relu"])
    view.graph.cleanup().toposort()
    assert "neg" not in view.folded and "relu" not in view.folded and "Mul" in {n.op for n in view.nodes}
    assert mul.name in view.names_taken and view.by_name[mul.name] is mul
    assert _index(view) == _rebuilt(view)
    # a folded replacement spreads to its readers: relu reads a constant again
    ed2 = Editor(view.graph, rule_id="T", anchor=nodes["relu"], provenance={}, taken=view.names_taken)
    neg2 = ed2.node("Neg", [ed2.const(np.ones((1, 4), np.float32))])
    view.remove_node(mul)
    ed2.replace_uses(mul.outputs[0], neg2.outputs[0])
    ed2.remove(mul)
    view.add_node(neg2)
    view.graph.cleanup().toposort()
    assert {neg2.name, "relu"} <= view.folded
    assert _index(view) == _rebuilt(view)
