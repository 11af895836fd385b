"""Round-trip fidelity of nafix's IR (issue 32, item 2): what nafix did not edit is written back as it
was read, field by field (node doc strings and metadata, graph and model metadata, value infos and
their order, initializers and their metadata, functions, opset imports, ...), and a fix keeps the
marks the TFLite importer puts on its nodes, so that the fixed model is estimated like the import."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixer import ir
from fixer.graph import GraphView
from fixer.importers.tflite import read_tflite
from fixer.npu.estimate import estimate_epochs
from fixer.npu.placement import FOLDED, place
from fixer.npu.profile import load_profile
from tests.helpers import run_cli as run

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample_models").glob("*.onnx"))
SHARED = ROOT.parent / "shared" / "models"
SHARED_MODELS = sorted(SHARED.glob("*.onnx")) if SHARED.is_dir() else []
TFLITE = Path(__file__).resolve().parent / "data" / "tflite"


def field_diff(a, b, path: str = "model") -> list[str]:
    """Where two protobuf messages differ, field by field (set fields only: an unset field and a
    field set to its default differ)."""
    out = []
    fa = {fd.name: v for fd, v in a.ListFields()}
    fb = {fd.name: v for fd, v in b.ListFields()}
    for k in sorted(set(fa) | set(fb)):
        va, vb = fa.get(k), fb.get(k)
        if va == vb:
            continue
        if va is None or vb is None:
            out.append(f"{path}.{k}: {'lost' if vb is None else 'added'}")
        elif hasattr(va, "ListFields"):
            out += field_diff(va, vb, f"{path}.{k}")
        elif (not isinstance(va, (str, bytes, int, float)) and len(va) == len(vb) and len(va)
              and hasattr(va[0], "ListFields")):
            for i, (x, y) in enumerate(zip(va, vb)):
                if x != y:
                    out += field_diff(x, y, f"{path}.{k}[{i}]")
        else:
            out.append(f"{path}.{k}: {va!r:.60} != {vb!r:.60}")
    return out


def assert_exact(model: onnx.ModelProto, out: onnx.ModelProto) -> None:
    assert field_diff(model, out) == []
    assert out.SerializeToString(deterministic=True) == model.SerializeToString(deterministic=True)


def round_trip(model: onnx.ModelProto) -> onnx.ModelProto:
    return ir.export_onnx(ir.import_onnx(model))


def meta(msg, **kv) -> None:
    for k, v in kv.items():
        msg.metadata_props.add(key=k, value=v)


def rich_model() -> onnx.ModelProto:
    """A model using every field nafix's IR does not model itself."""
    w = nh.from_array(np.arange(8, dtype=np.float32).reshape(2, 4), "W")
    w.doc_string = "weights"
    meta(w, origin="w")
    unused = nh.from_array(np.ones(3, np.float32), "unused_init")
    bias = nh.from_array(np.zeros(2, np.float32), "bias_as_input")
    then_g = h.make_graph([h.make_node("Relu", ["m"], ["t_out"], name="then_relu", doc_string="in a branch")],
                          "then", [], [h.make_tensor_value_info("t_out", T.FLOAT, [1, 2])],
                          value_info=[h.make_tensor_value_info("m", T.FLOAT, [1, 2], doc_string="outer")])
    meta(then_g.node[0], branch="then")
    else_g = h.make_graph([h.make_node("Neg", ["m"], ["e_out"], name="else_neg")], "else", [],
                          [h.make_tensor_value_info("e_out", T.FLOAT, [1, 2])])
    nodes = [h.make_node("MatMul", ["x", "W"], ["mm"], name="matmul", doc_string="a matmul"),
             h.make_node("Add", ["mm", "bias_as_input"], ["m"], name="add", doc_string=""),
             h.make_node("ReduceSum", ["m"], ["r"], name="rs", keepdims=0),
             h.make_node("Greater", ["r", "zero"], ["cond"], name="gt"),
             h.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
             h.make_node("Twice", ["y"], ["z"], name="twice", domain="custom")]
    meta(nodes[0], **{"nafix.tflite.layout": "NHWC->NCHW", "note": "kept"})
    meta(nodes[3], a="1", b="2")
    vis = [h.make_tensor_value_info("mm", T.FLOAT, [1, 2], doc_string="mm info"),
           h.make_tensor_value_info("dangling", T.INT64, [5]),
           h.make_tensor_value_info("mm", T.FLOAT, [1, 2]),  # repeated
           h.make_tensor_value_info("W", T.FLOAT, [2, 4]),  # an initializer's
           h.make_tensor_value_info("x", T.FLOAT, [1, 4])]  # a graph input's
    meta(vis[0], k="v")
    graph = h.make_graph(nodes, "rich", [h.make_tensor_value_info("x", T.FLOAT, [1, 4], doc_string="the input"),
                                        h.make_tensor_value_info("bias_as_input", T.FLOAT, [2])],
                         [h.make_tensor_value_info("z", T.FLOAT, [1, 2])],
                         [w, unused, bias, nh.from_array(np.array(0, np.float32), "zero")], doc_string="graph doc",
                         value_info=vis)
    meta(graph, gk="gv")
    qa = graph.quantization_annotation.add(tensor_name="mm")
    qa.quant_parameter_tensor_names.add(key="SCALE_TENSOR", value="W")
    twice = h.make_function("custom", "Twice", ["a"], ["b"], [h.make_node("Add", ["a", "a"], ["b"])],
                            [h.make_opsetid("", 17)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("custom", 1)],
                         functions=[twice], producer_name="rich", doc_string="model doc", domain="org.example",
                         model_version=7)
    model.ir_version = 10
    meta(model, mk="mv")
    return model


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_sample_models_round_trip_exactly(path):
    model = onnx.load(path)
    assert_exact(model, round_trip(model))


@pytest.mark.skipif(not SHARED_MODELS, reason=f"{SHARED} (the shared real models) is not available")
def test_shared_models_round_trip_exactly():
    for path in SHARED_MODELS:
        model = onnx.load(path, load_external_data=False)
        assert field_diff(model, round_trip(model)) == [], path.name


def test_every_unmodelled_field_round_trips():
    model = rich_model()
    onnx.checker.check_model(model)
    out = round_trip(model)
    assert_exact(model, out)
    onnx.checker.check_model(out)


def test_an_edit_keeps_the_rest_and_the_edited_node_metadata():
    """Editing one node's attribute and adding a node: every other node, the value infos and the
    metadata are as they were; the edited node keeps its doc string and metadata."""
    model = rich_model()
    g = ir.import_onnx(model)
    gt = next(n for n in g.nodes if n.name == "rs")
    gt.attrs["keepdims"] = 1
    src = next(t for t in g.tensors().values() if t.name == "z")
    extra = ir.Variable("z2", np.float32, [1, 2])
    g.nodes.append(ir.Node("Identity", "new_identity", inputs=[src], outputs=[extra]))
    g.outputs.append(extra)
    out = ir.export_onnx(g)
    before = {n.name: n for n in model.graph.node}
    after = {n.name: n for n in out.graph.node}
    for name, n in before.items():
        if name != "rs":
            assert after[name] == n, name
    assert after["rs"].attribute[0].i == 1
    assert after["new_identity"].doc_string == "" and not after["new_identity"].metadata_props
    for f in ("value_info", "initializer", "metadata_props", "quantization_annotation", "doc_string", "input"):
        assert getattr(out.graph, f) == getattr(model.graph, f), f
    for f in ("functions", "metadata_props", "doc_string", "domain", "model_version", "opset_import"):
        assert getattr(out, f) == getattr(model, f), f


def test_removed_tensors_leave_no_value_info_or_initializer():
    """What nafix removed is not written back: only what no node used at import is kept unused."""
    model = rich_model()
    g = ir.import_onnx(model)
    matmul = next(n for n in g.nodes if n.name == "matmul")
    add = next(n for n in g.nodes if n.name == "add")
    x = matmul.inputs[0]
    add.inputs[0] = x  # the MatMul (and its weights) no longer feed anything; x: [1, 4] + [2] is wrong
    add.inputs[1] = ir.Constant("b4", np.zeros(4, np.float32))
    g.cleanup()
    out = ir.export_onnx(g)
    assert "matmul" not in {n.name for n in out.graph.node}
    names = [t.name for t in out.graph.initializer]
    assert "W" not in names and "unused_init" in names and "b4" in names
    # mm (listed twice) and W went with their tensors; the graph input x is still there
    assert [v.name for v in out.graph.value_info] == ["dangling", "x"]
    assert [a.tensor_name for a in out.graph.quantization_annotation] == []


@pytest.mark.parametrize("name", ["movenet_like.tflite", "int8_layout.tflite", "int8_cnn.tflite"])
def test_tflite_import_round_trips_exactly(name):
    model = read_tflite(TFLITE / name).model
    assert any(len(n.metadata_props) for n in model.graph.node)
    assert_exact(model, round_trip(model))
    view = GraphView(model)  # what the engine edits: sorted by depth (the same nodes in another order)
    out = ir.export_onnx(view.graph)
    assert {n.name: n for n in out.graph.node} == {n.name: n for n in model.graph.node}
    out.graph.ClearField("node")
    model.graph.ClearField("node")
    assert_exact(model, out)


def test_fix_keeps_node_metadata_on_untouched_nodes(tmp_path, capsys):
    model = onnx.load(ROOT / "sample_models" / "denoiser_257.onnx")
    for i, n in enumerate(model.graph.node):
        n.doc_string = f"doc {i}"
        meta(n, origin=f"node {i}")
    model.ir_version = 10
    path = tmp_path / "denoiser_meta.onnx"
    onnx.save(model, path)
    # without nafix's own node annotations (on by default: nafix.placement / nafix.reason are added
    # beside the user's entries, see tests/test_pictures.py)
    code, out, err = run([path, "--no-annotate"], capsys)
    assert code == 0, err
    written = onnx.load(tmp_path / "denoiser_meta.nafix.onnx")
    report = json.loads((tmp_path / "denoiser_meta.nafix.json").read_text())
    assert report["changes"]
    before = {n.name: n for n in model.graph.node}
    untouched = [n for n in written.graph.node if n.name in before and before[n.name] == n]
    created = [n for n in written.graph.node if n.name not in before]
    assert created and all(n.doc_string.startswith("nafix.rule=") for n in created)
    # every original node still in the written model kept its doc string and metadata
    kept = [n for n in written.graph.node if n.name in before]
    assert len(untouched) >= len(before) - 3 * len(report["changes"]) and len(untouched) > 20
    for n in kept:
        assert n.doc_string == before[n.name].doc_string, n.name
        assert list(n.metadata_props) == list(before[n.name].metadata_props), n.name


def _layout_units(model: onnx.ModelProto, profile) -> tuple[dict[str, str], object]:
    view = GraphView(model)
    placement = place(view, profile)
    units = {p.name: p.unit for p in placement.nodes if p.op_type == "Transpose"}
    return units, estimate_epochs(view, placement, profile)


def test_fixed_tflite_model_estimates_its_layout_transposes_as_the_import(tmp_path, capsys):
    src = tmp_path / "movenet_like.tflite"
    shutil.copy(TFLITE / "movenet_like.tflite", src)
    profile = load_profile()
    imported = read_tflite(src).model
    layout = {n.name for n in imported.graph.node if n.op_type == "Transpose"
              and any(p.key == "nafix.tflite.layout" for p in n.metadata_props)}
    assert layout
    units_in, _ = _layout_units(imported, profile)
    assert all(units_in[name] == FOLDED for name in layout)
    code, out, err = run([src], capsys)
    assert code == 0, err
    written = onnx.load(tmp_path / "movenet_like.nafix.onnx")
    kept = layout & {n.name for n in written.graph.node}
    assert kept, "the fix removed every layout Transpose: the test no longer checks anything"
    units_out, est = _layout_units(written, profile)
    assert {name: units_out[name] for name in kept} == {name: units_in[name] for name in kept}
    after = json.loads((tmp_path / "movenet_like.nafix.json").read_text())["estimate"]["after"]
    assert (after["epochs"], after["sw_epochs"]) == (est.epochs, est.sw_epochs)
