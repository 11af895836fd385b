"""fixer.shape_fill (shapes where ONNX inference gives up, without running the model) against what
onnxruntime actually produces: the folded shape arithmetic, every com.microsoft shape rule, and the
whole load path on the shared real models that used to need the onnxruntime probe."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer import model_io, shape_fill, shapes

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "models"
U8 = TensorProto.UINT8


def _ort_shapes(model: onnx.ModelProto, names: list[str], feeds: dict) -> dict[str, tuple[int, tuple]]:
    """(element type, shape) of each tensor in ``names`` in an actual onnxruntime run."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    declared = {o.name for o in probe.graph.output}
    for n in names:
        if n not in declared:
            probe.graph.output.append(helper.ValueInfoProto(name=n))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    values = sess.run(names, feeds)
    return {n: (helper.np_dtype_to_tensor_dtype(v.dtype), tuple(v.shape)) for n, v in zip(names, values)}


def _inferred(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    warnings: list[str] = []
    inferred = shapes.infer_shapes(model, Path("<test>"), warnings)
    return inferred, shapes.unknown_shape_tensors(inferred)


def _check_against_ort(model: onnx.ModelProto, feeds: dict) -> list[str]:
    inferred, missing = _inferred(model)
    assert missing, "the case must leave something unknown to ONNX inference"
    found = shape_fill.infer_missing(inferred, missing)
    assert found is not None, "fixer.shape_fill did not resolve the case"
    assert [vi.name for vi in found] == missing
    mine = {vi.name: (vi.type.tensor_type.elem_type, tuple(d.dim_value for d in vi.type.tensor_type.shape.dim))
            for vi in found}
    assert mine == _ort_shapes(model, missing, feeds)
    return missing


def _const(name: str, arr) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


# ------------------------------------------------------------------------------------------------
# shape arithmetic folded
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [9, 11, 13])
def test_computed_reshape_matches_onnxruntime(opset):
    """Shape -> Gather -> Unsqueeze -> Concat (and Cast, Slice, Mul, Div) computing a Reshape target,
    then ops after the Reshape: shapes and element types equal onnxruntime's."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 4, 5])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.INT32),
        helper.make_node("Cast", ["s32"], ["s64"], to=TensorProto.INT64),
        helper.make_node("Gather", ["s64", "i0"], ["n"], axis=0),
        helper.make_node("Gather", ["s64", "i_last"], ["w"], axis=0),
        helper.make_node("Mul", ["w", "two"], ["w2"]),
        helper.make_node("Div", ["w2", "two"], ["w1"]),
    ]
    inits = [_const("i0", np.array(0, np.int64)), _const("i_last", np.array(-1, np.int64)),
             _const("two", np.array(2, np.int64)), _const("minus1", np.array([-1], np.int64))]
    if opset >= 13:
        inits.append(_const("ax0", np.array([0], np.int64)))
        nodes += [helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
                  helper.make_node("Unsqueeze", ["w1", "ax0"], ["w11"])]
    else:
        nodes += [helper.make_node("Unsqueeze", ["n"], ["n1"], axes=[0]),
                  helper.make_node("Unsqueeze", ["w1"], ["w11"], axes=[0])]
    if opset >= 10:
        inits += [_const("st", np.array([1], np.int64)), _const("en", np.array([3], np.int64))]
        nodes.append(helper.make_node("Slice", ["s64", "st", "en"], ["mid"]))
    else:
        nodes.append(helper.make_node("Slice", ["s64"], ["mid"], starts=[1], ends=[3]))
    nodes += [
        helper.make_node("Concat", ["n1", "minus1", "w11"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Sigmoid", ["r"], ["sg"]),
        helper.make_node("Softmax", ["sg"], ["y"], axis=1),
        helper.make_node("Reshape", ["x", "mid2"], ["r2"]),
    ]
    nodes.insert(-1, helper.make_node("Concat", ["mid", "minus1"], ["mid2"], axis=0))
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                          helper.make_tensor_value_info("r2", TensorProto.FLOAT, None)],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    missing = _check_against_ort(m, {"x": np.zeros((2, 6, 4, 5), np.float32)})
    assert {"r", "y", "r2"} <= set(missing)


def test_second_round_folds_a_shape_known_only_after_the_first():
    """The Shape of a tensor whose shape the first computed Reshape fixes (the ten-vad pattern)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "keep"], ["head"], axis=0),
        helper.make_node("Concat", ["head", "eight"], ["t1"], axis=0),
        helper.make_node("Reshape", ["x", "t1"], ["a"]),          # [1, 3, 8]: computed
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Shape", ["b"], ["sb"]),                 # known after round 1 only
        helper.make_node("Gather", ["sb", "keep"], ["hb"], axis=0),
        helper.make_node("Concat", ["hb", "two_four"], ["t2"], axis=0),
        helper.make_node("Reshape", ["b", "t2"], ["y"]),          # [1, 3, 2, 4]
    ]
    inits = [_const("keep", np.array([0, 1], np.int64)), _const("eight", np.array([8], np.int64)),
             _const("two_four", np.array([2, 4], np.int64))]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    m.ir_version = 4
    assert "y" in _check_against_ort(m, {"x": np.zeros((1, 3, 8), np.float32)})


def test_data_dependent_shape_is_left_to_the_probe():
    """NonZero's output size depends on the data: nothing here answers, so the onnxruntime probe
    still runs (and load_model records its shapes, as before)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Shape", ["nz"], ["s"]),
             helper.make_node("Reshape", ["x", "s4"], ["y"]), helper.make_node("Cast", ["s"], ["y2"], to=1)]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                            helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)],
                          initializer=[_const("s4", np.array([2, 2], np.int64))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    inferred, missing = _inferred(m)
    assert "nz" in missing
    assert shape_fill.infer_missing(inferred, missing) is None


def test_unknown_contrib_op_is_left_to_the_probe():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    inferred, missing = _inferred(m)
    assert missing == ["y"]
    assert shape_fill.infer_missing(inferred, missing) is None


# ------------------------------------------------------------------------------------------------
# com.microsoft shape rules
# ------------------------------------------------------------------------------------------------

def _q(name: str, value, dtype=np.float32):
    return _const(name, np.array(value, dtype))


def _contrib_model(nodes, inputs, outputs, inits, opset=13):
    g = helper.make_graph(nodes, "g", inputs, [helper.ValueInfoProto(name=o) for o in outputs],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 7
    return m


SCALES = [_q("s", 0.05), _q("z", 128, np.uint8), _q("s2", 0.1), _q("z2", 120, np.uint8)]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("shapes", [([1, 8, 5, 5], [1, 8, 5, 5]), ([1, 8, 5, 5], [8, 1, 1]), ([3, 1], [1, 4])])
def test_binary_rules_match_onnxruntime(op, shapes):
    a, b = shapes
    nodes = [helper.make_node(op, ["a", "s", "z", "b", "s", "z", "s2", "z2"], ["c"], domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["c", "s2", "z2"], ["y"])]
    m = _contrib_model(nodes, [helper.make_tensor_value_info("a", U8, a), helper.make_tensor_value_info("b", U8, b)],
                       ["y"], SCALES)
    feeds = {"a": np.zeros(a, np.uint8), "b": np.zeros(b, np.uint8)}
    assert set(_check_against_ort(m, feeds)) == {"c", "y"}


@pytest.mark.parametrize("op,attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1}),
                                      ("QLinearSoftmax", {"axis": -1, "opset": 13})])
def test_unary_rules_match_onnxruntime(op, attrs):
    nodes = [helper.make_node(op, ["x", "s", "z", "s2", "z2"], ["q"], domain="com.microsoft", **attrs),
             helper.make_node("DequantizeLinear", ["q", "s2", "z2"], ["y"])]
    m = _contrib_model(nodes, [helper.make_tensor_value_info("x", U8, [1, 3, 4, 5])], ["y"], SCALES)
    assert set(_check_against_ort(m, {"x": np.zeros((1, 3, 4, 5), np.uint8)})) == {"q", "y"}


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_concat_rule_matches_onnxruntime(axis):
    shapes = {1: ([1, 2, 4, 4], [1, 5, 4, 4]), -1: ([1, 2, 4, 3], [1, 2, 4, 6]), 0: ([2, 3, 4, 4], [1, 3, 4, 4])}[axis]
    nodes = [helper.make_node("QLinearConcat", ["s2", "z2", "a", "s", "z", "b", "s", "z"], ["q"], axis=axis,
                              domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["q", "s2", "z2"], ["y"])]
    m = _contrib_model(nodes, [helper.make_tensor_value_info("a", U8, shapes[0]),
                               helper.make_tensor_value_info("b", U8, shapes[1])], ["y"], SCALES)
    feeds = {"a": np.zeros(shapes[0], np.uint8), "b": np.zeros(shapes[1], np.uint8)}
    assert set(_check_against_ort(m, feeds)) == {"q", "y"}


@pytest.mark.parametrize("channels_last", [0, 1])
def test_global_average_pool_rule_matches_onnxruntime(channels_last):
    nodes = [helper.make_node("QLinearGlobalAveragePool", ["x", "s", "z", "s2", "z2"], ["q"],
                              channels_last=channels_last, domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["q", "s2", "z2"], ["y"])]
    m = _contrib_model(nodes, [helper.make_tensor_value_info("x", U8, [1, 6, 5, 7])], ["y"], SCALES)
    assert set(_check_against_ort(m, {"x": np.zeros((1, 6, 5, 7), np.uint8)})) == {"q", "y"}


@pytest.mark.parametrize("trans_a,trans_b,quantized_out", [(0, 0, True), (1, 1, True), (0, 1, False)])
def test_qgemm_rule_matches_onnxruntime(trans_a, trans_b, quantized_out):
    a_shape = [5, 3] if trans_a else [3, 5]
    b_shape = [4, 5] if trans_b else [5, 4]
    inits = SCALES + [_const("B", np.ones(b_shape, np.uint8)), _q("bz", 128, np.uint8)]
    ins = ["a", "s", "z", "B", "s", "bz", ""] + (["s2", "z2"] if quantized_out else [])
    nodes = [helper.make_node("QGemm", ins, ["q"], transA=trans_a, transB=trans_b, domain="com.microsoft"),
             helper.make_node("Relu", ["q"], ["r"]) if not quantized_out else
             helper.make_node("DequantizeLinear", ["q", "s2", "z2"], ["r"])]
    m = _contrib_model(nodes, [helper.make_tensor_value_info("a", U8, a_shape)], ["r"], inits)
    assert set(_check_against_ort(m, {"a": np.zeros(a_shape, np.uint8)})) == {"q", "r"}


def test_rule_schemas_never_reach_the_real_model():
    """The rules run on a copy moved to a private domain: the model keeps its com.microsoft nodes and
    opset imports, and the checker's view of com.microsoft is untouched."""
    nodes = [helper.make_node("QLinearSigmoid", ["x", "s", "z", "s2", "z2"], ["y"], domain="com.microsoft")]
    m = _contrib_model(nodes, [helper.make_tensor_value_info("x", U8, [1, 3])], ["y"], SCALES)
    inferred, missing = _inferred(m)
    before = inferred.SerializeToString()
    assert shape_fill.infer_missing(inferred, missing) is not None
    assert inferred.SerializeToString() == before
    with pytest.raises(onnx.defs.SchemaError):
        onnx.defs.get_schema("QLinearSigmoid", 1, "com.microsoft")


# ------------------------------------------------------------------------------------------------
# the shared real models: identical to the onnxruntime probe
# ------------------------------------------------------------------------------------------------

PROBED = ["hpc203__yolo_fastestv2_model.onnx", "linzaer__version-RFB-320.onnx",
          "pele__mobilefacenet__PerChannel_quant.onnx", "pele__mobilefacenet_int8_faces.onnx",
          "tenvad__ten-vad.onnx"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is absent")
@pytest.mark.parametrize("name", PROBED)
def test_real_models_load_exactly_as_with_the_onnxruntime_probe(name, monkeypatch):
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{name} is absent")
    fast = model_io.load_model(path)
    calls = []
    real = shape_fill.infer_missing
    monkeypatch.setattr(shape_fill, "infer_missing", lambda m, miss: calls.append(real(m, miss)) or None)
    slow = model_io.load_model(path)  # the fast path answered (calls[0]) but the probe's result is kept
    assert calls and calls[0] is not None, "the fast path no longer resolves this model"
    assert fast.model.SerializeToString() == slow.model.SerializeToString()
    assert fast.warnings == slow.warnings


# ------------------------------------------------------------------------------------------------
# shape inference with the weights held apart (shapes._infer_apart)
# ------------------------------------------------------------------------------------------------

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
APART_MODELS = sorted(SHARED.glob("*.onnx")) + sorted(SAMPLES.glob("*.onnx"))


@pytest.mark.parametrize("path", APART_MODELS, ids=lambda p: p.name)
def test_inference_with_weights_apart_equals_plain_inference(path):
    """Byte for byte, with the weights back in place, on every shared and sample model without
    subgraphs or functions (what load_model gives it)."""
    model = onnx.load(str(path))
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for n in model.graph.node for a in n.attribute) or len(model.functions):
        pytest.skip("subgraphs or functions: load_model uses plain inference")
    warnings: list[str] = []
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    plain = shapes.infer_shapes(model, path, warnings)
    apart = shapes.infer_shapes(twin, path, warnings, weights_apart=True)
    assert not warnings
    assert apart.SerializeToString() == plain.SerializeToString()


@pytest.mark.parametrize("mirror", [True, False], ids=["value_info mirror", "whole answer parsed"])
def test_weights_apart_really_strips_large_weights(monkeypatch, mirror):
    """The fast path is taken (inference sees no large float weight) and the weights come back."""
    w = np.arange(16 * 8 * 3 * 3, dtype=np.float32).reshape(16, 8, 3, 3)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    seen = []
    if mirror:
        assert shapes._vi_mirror() is not None
        real_c = shapes.shape_inference.C.infer_shapes
        monkeypatch.setattr(shapes.shape_inference.C, "infer_shapes", lambda b, *a: seen.append(
            len(onnx.load_from_string(b).graph.initializer[0].raw_data)) or real_c(b, *a))
    else:
        monkeypatch.setattr(shapes, "_VI_MIRROR", [None])
    real = shapes.shape_inference.infer_shapes
    monkeypatch.setattr(shapes.shape_inference, "infer_shapes",
                        lambda m, **k: seen.append(len(m.graph.initializer[0].raw_data)) or real(m, **k))
    static: list = []
    out = shapes.infer_shapes(model, Path("<test>"), [], weights_apart=True, static_out=static)
    assert seen == [0]
    np.testing.assert_array_equal(numpy_helper.to_array(out.graph.initializer[0]), w)
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [1, 16, 3, 3]
    assert static == ([{"y"}] if mirror else [])


def _unknown_reference(model: onnx.ModelProto) -> list[str]:
    """The plain per-dimension walk shapes.unknown_shape_tensors replaces (no caching)."""
    g = model.graph
    known = {t.name for t in g.initializer}
    for vi in (*g.value_info, *g.output, *g.input):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            known.add(vi.name)
    return [o for n in g.node if n.op_type != "Constant" for o in n.output if o and o not in known]


@pytest.mark.parametrize("path", APART_MODELS, ids=lambda p: p.name)
def test_unknown_shape_tensors_equal_the_plain_walk(path, monkeypatch):
    """What load_model asks the probe for (from its node scan and the static names read from
    inference's answer, types decoded once per distinct type) is what the plain walk finds, on every
    shared and sample model; so is what the walk over the model itself finds (with the initializer
    names read by the node scan, and the common all-known answer decided by a set comparison)."""
    asked = []
    monkeypatch.setattr(model_io, "fill_shapes_by_running",
                        lambda m, w, produced=None, static=None, initializers=None: asked.append(
                            (static is not None, shapes.unknown_shape_tensors(m, produced, static, initializers),
                             shapes.unknown_shape_tensors(m), _unknown_reference(m),
                             initializers == {t.name for t in m.graph.initializer})))
    model_io.load_model(path)
    for from_answer, got, walked, want, same_initializers in asked:
        assert got == walked == want
        assert same_initializers  # the names load_model's scan read are the loaded model's
        flat = not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for n in onnx.load(str(path)).graph.node for a in n.attribute)
        assert from_answer == flat  # the fast path really ran where it can


def test_unknown_shape_tensors_tells_symbolic_and_zero_dims_apart():
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], [n]) for n in ("a", "b", "c", "d")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [1, 2])],
        value_info=[helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2]),
                    helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, "n"]),
                    helper.make_tensor_value_info("c", TensorProto.FLOAT, [0, 2])])
    m = helper.make_model(g)
    assert shapes.unknown_shape_tensors(m) == ["b"] == _unknown_reference(m)


def test_a_graph_with_subgraphs_gets_plain_inference(tmp_path, monkeypatch):
    """Even empty If branches: inference may type a subgraph, which _infer_apart would not copy back."""
    then_g = helper.make_graph([], "then", [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([], "else", [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True), "cv")),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    p = tmp_path / "if.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), p)

    def refuse(model):
        raise AssertionError("_infer_apart on a graph with subgraphs")

    monkeypatch.setattr(shapes, "_infer_apart", refuse)
    loaded = model_io.load_model(p)
    assert not any("shape inference failed" in w for w in loaded.warnings)


@pytest.mark.parametrize("opset", [11, 13])
def test_more_folded_ops_match_onnxruntime(opset):
    """Negative Gather index and Unsqueeze axes, Squeeze, Sub, Add, a negative Slice start, an int32
    Cast round trip and Identity: the folded Reshape targets give onnxruntime's shapes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4, 5])
    inits = [_const("im2", np.array(-2, np.int64)), _const("one", np.array(1, np.int64)),
             _const("neg2", np.array([-2], np.int64)), _const("big", np.array([100], np.int64))]
    if opset >= 13:
        inits += [_const("axm1", np.array([-1], np.int64)), _const("ax0", np.array([0], np.int64))]
        unsq = [helper.make_node("Unsqueeze", ["c", "axm1"], ["c1"]),
                helper.make_node("Unsqueeze", ["c1", "ax0"], ["c2"]),   # [[c]]
                helper.make_node("Squeeze", ["c2", "ax0"], ["c3"])]     # [c]
    else:
        unsq = [helper.make_node("Unsqueeze", ["c"], ["c1"], axes=[-1]),
                helper.make_node("Unsqueeze", ["c1"], ["c2"], axes=[0]),
                helper.make_node("Squeeze", ["c2"], ["c3"], axes=[0])]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "im2"], ["a"], axis=0),          # 4
        helper.make_node("Sub", ["a", "one"], ["b"]),                     # 3
        helper.make_node("Add", ["b", "one"], ["c"]),                     # 4
        *unsq,
        helper.make_node("Slice", ["s", "neg2", "big"], ["tail"]) if opset >= 10 else None,
        helper.make_node("Identity", ["tail"], ["tail_i"]),
        helper.make_node("Cast", ["tail_i"], ["tail32"], to=TensorProto.INT32),
        helper.make_node("Cast", ["tail32"], ["tail64"], to=TensorProto.INT64),  # [4, 5]
        helper.make_node("Concat", ["c3", "tail64"], ["t"], axis=0),     # [4, 4, 5]
        helper.make_node("Reshape", ["x", "t2"], ["y"]),
    ]
    nodes.insert(-1, helper.make_node("Concat", ["minus1", "t"], ["t2"], axis=0))  # [-1, 4, 4, 5]
    inits.append(_const("minus1", np.array([-1], np.int64)))
    g = helper.make_graph([n for n in nodes if n is not None], "g", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    assert "y" in _check_against_ort(m, {"x": np.zeros((2, 4, 4, 5), np.float32)})


def test_an_impossible_computed_reshape_is_left_to_the_probe():
    """A folded target that does not divide the element count: ONNX inference gives no shape, so
    nothing is answered here (onnxruntime's own run then reports it cannot run the model)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "st", "en"], ["tail"]),          # [4, 5]
             helper.make_node("Concat", ["m1", "tail", "tail"], ["t"], axis=0),  # [-1, 4, 5, 4, 5]
             helper.make_node("Reshape", ["x", "t"], ["y"])]
    inits = [_const("st", np.array([2], np.int64)), _const("en", np.array([4], np.int64)),
             _const("m1", np.array([-1], np.int64))]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    inferred, missing = _inferred(m)
    assert missing == ["y"]
    assert shape_fill.infer_missing(inferred, missing) is None


def test_static_names_read_from_the_answer_equal_the_plain_walk():
    """_static_names (types kept serialized by the value_info mirror) against the plain per-dimension
    walk, on static, symbolic, zero, rank-unknown and non-tensor types, outputs included."""
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [1, 2])
    g = helper.make_graph(
        [], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("o1", TensorProto.FLOAT, [3, 2]),
         helper.make_tensor_value_info("o2", TensorProto.FLOAT, ["n", 2])],
        value_info=[helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2]),
                    helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, "n"]),
                    helper.make_tensor_value_info("c", TensorProto.FLOAT, [0, 2]),
                    helper.make_tensor_value_info("d", TensorProto.FLOAT, None),
                    helper.make_tensor_value_info("e", TensorProto.INT8, []),
                    helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 2]), seq])
    m = helper.make_model(g)
    m.graph.value_info[-2].type.tensor_type.shape.dim[1].ClearField("dim_value")  # a dim with neither field
    typed = shapes._vi_mirror().FromString(m.SerializeToString())
    want = {vi.name for vi in (*m.graph.value_info, *m.graph.output)
            if vi.type.tensor_type.HasField("shape")
            and all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)}
    assert shapes._static_names(typed.graph) == want == {"o1", "a", "c", "e"}


def test_unknown_shape_tensors_keeps_node_order_with_given_names():
    """With the caller's produced/static/initializer names: the unknown ones in produced order, as
    the plain walk gives them (and none when all are known)."""
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], [n]) for n in ("d", "a", "c", "b")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 2])],
        value_info=[helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2])])
    m = helper.make_model(g)
    produced = ["d", "a", "c", "b"]
    assert shapes.unknown_shape_tensors(m, produced, {"a", "b"}, set()) == ["d", "c"] == _unknown_reference(m)
    assert shapes.unknown_shape_tensors(m, produced, {"a", "b"}, {"c", "d"}) == []


def test_a_mirror_failing_its_self_test_leaves_the_plain_path(monkeypatch):
    """Should onnx's inference binding not answer as infer_shapes does (here: it fails), no mirror
    is used and inference with the weights apart still gives the plain result, without a warning."""
    monkeypatch.setattr(shapes, "_VI_MIRROR", [])
    monkeypatch.setattr(shapes.shape_inference.C, "infer_shapes", lambda *a: b"\xff")
    assert shapes._vi_mirror() is None
    monkeypatch.undo()  # (the plain path calls infer_shapes, which needs the real binding)
    monkeypatch.setattr(shapes, "_VI_MIRROR", [None])
    path = SHARED / "tenvad__ten-vad.onnx"
    if not path.exists():
        pytest.skip("tenvad__ten-vad.onnx is absent")
    model, twin = onnx.load(str(path)), onnx.load(str(path))
    warnings: list[str] = []
    static: list = []
    apart = shapes.infer_shapes(model, path, warnings, weights_apart=True, static_out=static)
    plain = shapes.infer_shapes(twin, path, warnings)
    assert not warnings and not static
    assert apart.SerializeToString() == plain.SerializeToString()
