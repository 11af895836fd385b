"""The load checks' fast paths refuse exactly what the field-by-field checks refuse.

``fixer.model_io`` checks the UTF-8 of every text field with one parse of the file bytes (a proto3
mirror of the ONNX schema) and walks the nodes once for the external-data, cycle, reference,
text-attribute and duplicate-name checks; the onnx checker reads the file bytes when loading changed
nothing. These tests hold each fast path against the slow one it replaces.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixer import model_io
from fixer.errors import InputError
from fixer.model_io import _all_nodes, _check_strings, _NodeScan, load_model, text_fields_are_utf8


def tv(name, shape, elem=T.FLOAT):
    return h.make_tensor_value_info(name, elem, shape)


def marked_model() -> onnx.ModelProto:
    """A model with a distinct 8-letter marker in every kind of text field (graph, node, subgraph,
    value_info, dims, initializer, metadata, opset, function)."""
    then_g = h.make_graph([h.make_node("Identity", ["xa"], ["ta"], name="SUBNODEA", doc_string="SUBDOCAA")],
                          "SUBGRAPH", [], [tv("ta", [1, 4])])
    else_g = h.make_graph([h.make_node("Neg", ["xa"], ["ea"], name="ELSENODE")], "ELSEGRPH", [], [tv("ea", [1, 4])])
    nodes = [
        h.make_node("Relu", ["x"], ["xa"], name="NODENAME", doc_string="NODEDOCS"),
        h.make_node("Constant", [], ["cond"], name="CONDNODE", value=nh.from_array(np.array(True), "CONDVALU")),
        h.make_node("If", ["cond"], ["y"], name="IFNODEAA", then_branch=then_g, else_branch=else_g),
        h.make_node("Resize", ["xa", "", "sc"], ["r"], name="RESIZEAA", mode="nearest"),
    ]
    g = h.make_graph(nodes, "GRAPHNAM", [tv("x", [1, 4])], [tv("y", [1, 4]), tv("r", None)],
                     [nh.from_array(np.array([1, 1], np.float32), "sc")], doc_string="GRAPHDOC",
                     value_info=[tv("VINFONAM", ["DIMPARAM", 4])])
    g.initializer[0].doc_string = "INITDOCS"
    fn = h.make_function("FUNCDOMN", "FUNCNAME", ["a"], ["b"], [h.make_node("Relu", ["a"], ["b"], name="FUNCNODE")],
                         [h.make_opsetid("", 17)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("FUNCDOMN", 1)], functions=[fn],
                     producer_name="PRODNAME", doc_string="MODELDOC")
    h.set_model_props(m, {"METAKEYS": "METAVALU"})
    m.ir_version = 8
    return m


MARKERS = ["NODENAME", "NODEDOCS", "CONDNODE", "CONDVALU", "IFNODEAA", "SUBNODEA", "SUBDOCAA", "SUBGRAPH",
           "ELSENODE", "ELSEGRPH", "RESIZEAA", "GRAPHNAM", "GRAPHDOC", "VINFONAM", "DIMPARAM", "INITDOCS",
           "FUNCDOMN", "FUNCNAME", "FUNCNODE", "PRODNAME", "MODELDOC", "METAKEYS", "METAVALU"]


def test_the_bytes_level_utf8_check_runs_here():
    assert model_io._utf8_mirror() is not None  # else every load walks the descriptors (slow, still correct)


def test_clean_text_passes_both_checks():
    data = marked_model().SerializeToString()
    assert text_fields_are_utf8(data)
    _check_strings(onnx.load_from_string(data), Path("m.onnx"))


@pytest.mark.parametrize("marker", MARKERS)
def test_bytes_check_rejects_what_the_field_walk_rejects(marker):
    data = marked_model().SerializeToString()
    assert data.count(marker.encode()) >= 1  # (the function domain is also an opset import)
    bad = data.replace(marker.encode(), b"\xff\xfe" + marker.encode()[2:])
    assert not text_fields_are_utf8(bad)
    with pytest.raises(InputError, match="not UTF-8 text"):
        _check_strings(onnx.load_from_string(bad), Path("m.onnx"))


@pytest.mark.parametrize("marker", ["NODENAME", "DIMPARAM", "SUBNODEA", "METAVALU", "FUNCNAME"])
def test_load_refuses_non_utf8_text_with_the_field_named(tmp_path, marker):
    data = marked_model().SerializeToString()
    src = tmp_path / "m.onnx"
    src.write_bytes(data.replace(marker.encode(), b"\xff\xfe" + marker.encode()[2:]))
    with pytest.raises(InputError, match=r"model\.\S+ is not UTF-8 text"):
        load_model(src)


def test_load_of_clean_marked_model_works(tmp_path):
    src = tmp_path / "m.onnx"
    src.write_bytes(marked_model().SerializeToString())
    loaded = load_model(src)
    assert loaded.model is not None and loaded.opset == 17


# ------------------------------------------------------------------------------------------------
# the shared node walk
# ------------------------------------------------------------------------------------------------


def _reference_bad_text(graph):
    """The former _check_text_attributes loop: the first non-UTF-8 STRING(S) attribute."""
    for node in _all_nodes(graph):
        for attr in node.attribute:
            values = [attr.s] if attr.type == onnx.AttributeProto.STRING else (
                list(attr.strings) if attr.type == onnx.AttributeProto.STRINGS else [])
            for v in values:
                try:
                    v.decode("utf-8")
                except UnicodeDecodeError:
                    return node.name, attr.name
    return None


def _nested_bad_text_model() -> onnx.ModelProto:
    """An If whose subgraph holds a bad attribute, and whose own attribute after the subgraph is bad
    too: the node's own attributes come first (as _all_nodes yields the node before its subgraph)."""
    inner = h.make_graph([h.make_node("Resize", ["x", "", "sc"], ["t"], name="inner", mode="BADINNER")],
                         "then", [], [tv("t", [1, 1, 4, 4])])
    other = h.make_graph([h.make_node("Identity", ["x"], ["e"], name="other")], "else", [], [tv("e", [1, 1, 4, 4])])
    ifn = h.make_node("If", ["c"], ["y"], name="if", then_branch=inner, else_branch=other)
    ifn.attribute.append(h.make_attribute("tag", "BADOUTER"))
    first = h.make_node("Resize", ["x", "", "sc"], ["z"], name="first", mode="nearest")
    g = h.make_graph([first, ifn], "g", [tv("x", [1, 1, 2, 2]), tv("c", [], T.BOOL)],
                     [tv("y", [1, 1, 4, 4]), tv("z", [1, 1, 4, 4])],
                     [nh.from_array(np.array([1, 1, 2, 2], np.float32), "sc")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("bad", [(), ("BADOUTER",), ("BADINNER",), ("BADOUTER", "BADINNER")])
def test_node_scan_matches_the_former_walks(bad):
    data = _nested_bad_text_model().SerializeToString()
    for marker in bad:
        data = data.replace(marker.encode(), b"\xff" + marker.encode()[1:])
    m = onnx.load_from_string(data)
    scan = _NodeScan(m.graph, m.functions)
    assert [n.name for n in scan.nodes] == [n.name for n in _all_nodes(m.graph)] == ["first", "if", "other", "inner"]
    assert scan.inputs == [list(n.input) for n in m.graph.node]
    assert scan.outputs == [list(n.output) for n in m.graph.node]
    got = (scan.bad_text[0].name, scan.bad_text[1].name) if scan.bad_text else None
    assert got == _reference_bad_text(m.graph)
    assert got == ({"BADOUTER": ("if", "tag"), "BADINNER": ("inner", "mode")}[bad[0]] if bad else None)
    assert not scan.external


# ------------------------------------------------------------------------------------------------
# external data wherever onnx would load it: the scan must see it, so the escape checks run
# ------------------------------------------------------------------------------------------------


def _external(t: onnx.TensorProto, location: str) -> onnx.TensorProto:
    t.ClearField("raw_data")
    t.data_location = T.EXTERNAL
    t.external_data.add(key="location", value=location)
    return t


def _escape_models():
    w = nh.from_array(np.ones((2,), np.float32), "w")
    relu = h.make_node("Relu", ["x"], ["y"], name="r")

    # a Constant's tensor attribute
    const = h.make_node("Constant", [], ["k"], name="k", value=_external(nh.from_array(np.ones(2, np.float32), "kv"),
                                                                         "../escape.bin"))
    yield "constant attribute", [const, h.make_node("Add", ["x", "k"], ["y"], name="a")], [], []
    # an attribute declared INT that carries a tensor anyway (onnx's loader visits it whatever the type)
    odd = h.make_node("Relu", ["x"], ["y"], name="r")
    a = odd.attribute.add()
    a.name, a.type, a.i = "odd", onnx.AttributeProto.INT, 1
    a.t.CopyFrom(_external(nh.from_array(np.ones(2, np.float32), "ov"), "../escape.bin"))
    yield "mistyped attribute", [odd], [], []
    # an initializer of an If subgraph
    sub = h.make_graph([h.make_node("Add", ["x", "sw"], ["t"], name="sa")], "then", [], [tv("t", [1, 2])],
                       [_external(nh.from_array(np.ones(2, np.float32), "sw"), "../escape.bin")])
    other = h.make_graph([h.make_node("Identity", ["x"], ["e"], name="si")], "else", [], [tv("e", [1, 2])])
    cond = h.make_node("Constant", [], ["c"], name="c", value=nh.from_array(np.array(True), "cv"))
    yield "subgraph initializer", [cond, h.make_node("If", ["c"], ["y"], name="if", then_branch=sub,
                                                     else_branch=other)], [], []
    # a tensor attribute of a function's node
    fconst = h.make_node("Constant", [], ["b"], name="fk", value=_external(nh.from_array(np.ones(2, np.float32), "fv"),
                                                                           "../escape.bin"))
    fn = h.make_function("custom", "F", ["a"], ["b"], [fconst], [h.make_opsetid("", 17)])
    yield "function attribute", [relu], [fn], []
    # a plain initializer
    yield "initializer", [h.make_node("Add", ["x", "w"], ["y"], name="a")], [], [_external(w, "../escape.bin")]


@pytest.mark.parametrize("case", [c[0] for c in _escape_models()])
def test_external_data_escapes_are_refused_wherever_the_tensor_is(tmp_path, case):
    _, nodes, functions, inits = next(c for c in _escape_models() if c[0] == case)
    g = h.make_graph(nodes, "g", [tv("x", [1, 2])], [tv("y", [1, 2])], inits)
    opsets = [h.make_opsetid("", 17)] + ([h.make_opsetid("custom", 1)] if functions else [])
    m = h.make_model(g, opset_imports=opsets, functions=functions)
    m.ir_version = 8
    (tmp_path / "escape.bin").write_bytes(np.ones(2, np.float32).tobytes())
    folder = tmp_path / "models"
    folder.mkdir()
    src = folder / "m.onnx"
    src.write_bytes(m.SerializeToString())
    assert _NodeScan(m.graph, m.functions).external
    with pytest.raises(InputError, match="outside the model's folder"):
        load_model(src)


def test_external_data_inside_the_folder_still_loads(tmp_path):
    m = h.make_model(h.make_graph([h.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g", [tv("x", [1, 8])],
                                  [tv("y", [1, 8])], [nh.from_array(np.ones((8, 8), np.float32), "W")]),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    loaded = load_model(tmp_path / "ext.onnx")
    w = next(t for t in loaded.model.graph.initializer if t.name == "W")
    assert nh.to_array(w).shape == (8, 8) and float(nh.to_array(w).sum()) == 64.0


# ------------------------------------------------------------------------------------------------
# the onnx checker on the file bytes vs on the loaded model
# ------------------------------------------------------------------------------------------------


def test_checker_warning_is_the_same_from_the_file_bytes_and_from_the_model(tmp_path, monkeypatch):
    m = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"], name="r")], "g", [tv("x", [1, "d"])],
                                  [tv("y", [1, "d"])]), opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 2  # IR < 3 with an opset import: the checker refuses it (a warning, not fatal)
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    seen: list[type] = []
    check = onnx.checker.check_model

    def spy(model, *a, **k):
        seen.append(type(model))
        return check(model, *a, **k)

    monkeypatch.setattr(onnx.checker, "check_model", spy)
    as_file = load_model(src)  # nothing pinned or renamed: the checker reads the file bytes
    pinned = load_model(src, input_shapes={"x": (1, 4)})  # the pinned model: the checker reads it
    assert seen == [bytes, onnx.ModelProto]
    lines = [[w for w in lm.warnings if w.startswith("onnx checker")] for lm in (as_file, pinned)]
    assert lines[0] and lines[0] == lines[1]


@pytest.mark.parametrize("ir_version", [8, 2], ids=["valid", "refused (IR < 3)"])
@pytest.mark.parametrize("batch", ["N", None, -1], ids=["named batch", "unset batch", "negative batch"])
def test_a_pinned_batch_is_checked_from_the_file_bytes(tmp_path, monkeypatch, ir_version, batch):
    # a symbolic batch pinned to 1 (no --input-shape): the checker reads the file's bytes, and says
    # what it says of the pinned model
    x = tv("x", [1, 4])
    d = x.type.tensor_type.shape.dim[0]
    if batch == "N":
        d.dim_param = "N"
    elif batch is None:
        d.Clear()
    else:
        d.dim_value = batch
    m = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"], name="r")], "g", [x], [tv("y", [1, 4])]),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = ir_version
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    seen: list = []
    check = onnx.checker.check_model

    def spy(model, *a, **k):
        seen.append(model)
        return check(model, *a, **k)

    monkeypatch.setattr(onnx.checker, "check_model", spy)
    lm = load_model(src)
    assert [(dd.axis, dd.pinned_to) for dd in lm.dynamic_dims] == [(0, 1)]
    assert [type(s) for s in seen] == [bytes] and seen[0] == src.read_bytes()
    pinned = onnx.ModelProto()
    pinned.CopyFrom(m)
    pinned.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    try:
        check(pinned)
        want = []
    except onnx.checker.ValidationError as exc:
        want = [f"onnx checker: {str(exc).strip().splitlines()[0]}"]
    assert [w for w in lm.warnings if w.startswith("onnx checker")] == want
    assert bool(want) == (ir_version == 2)


def test_duplicate_node_names_are_renamed_once(tmp_path):
    nodes = [h.make_node("Relu", ["x"], ["a"], name="n"), h.make_node("Relu", ["a"], ["b"], name="n"),
             h.make_node("Relu", ["b"], ["y"], name="n_1")]
    m = h.make_model(h.make_graph(nodes, "g", [tv("x", [1, 4])], [tv("y", [1, 4])]),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    loaded = load_model(src)
    assert [n.name for n in loaded.model.graph.node] == ["n", "n_2", "n_1"]
    assert any("1 node(s) shared their name" in w for w in loaded.warnings)
    assert os.path.getsize(src) == len(m.SerializeToString())  # the input file is never rewritten


# ------------------------------------------------------------------------------------------------
# placement and the memory estimate share one QuantDomain
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["classifier_softmax", "movenet_like", "denoiser_257", "big_activations_float"])
def test_a_shared_quant_domain_places_and_sizes_as_fresh_ones(name, monkeypatch):
    from fixer.api import AnalysisOptions, resolve_profile
    from fixer.graph import GraphView
    from fixer.npu import placement as pl
    from fixer.npu.memory import estimate_memory
    from fixer.npu.placement import QuantDomain, is_oe_export, place, quant_domain

    src = Path(__file__).resolve().parents[1] / "sample_models" / f"{name}.onnx"
    profile = resolve_profile(AnalysisOptions())
    model = load_model(src).model
    view, other = GraphView(model), GraphView(model)
    domain = quant_domain(view, profile)
    shared = place(view, profile, domain=domain)
    fresh = place(view, profile)
    assert shared == fresh
    built = []
    monkeypatch.setattr(pl, "quant_domain", lambda v, p: built.append(v) or quant_domain(v, p))
    place(view, profile, domain=domain)
    assert built == []  # the caller's domain is used
    assert place(other, profile, domain=domain) == place(other, profile)
    assert built == [other, other]  # another view's domain is not: one is built for the view placed
    strict = QuantDomain(view, profile, strict=not is_oe_export(model))
    assert estimate_memory(view, shared, domain) == estimate_memory(view, fresh, strict)


def _kahn_acyclic(graph: onnx.GraphProto) -> bool:
    """The plain topological-sort test (no sorted-graph fast path) _check_acyclic holds to."""
    producers = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    indeg = [len({producers[t] for t in n.input if t in producers}) for n in graph.node]
    users: list[list[int]] = [[] for _ in graph.node]
    for i, n in enumerate(graph.node):
        for d in {producers[t] for t in n.input if t in producers}:
            users[d].append(i)
    ready = [i for i, d in enumerate(indeg) if d == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    return seen == len(graph.node)


@pytest.mark.parametrize("case", ["sorted", "unsorted", "self_loop", "two_cycle", "reads_later_duplicate"])
def test_acyclic_check_agrees_with_the_plain_topological_sort(case):
    n = h.make_node
    nodes = {
        "sorted": [n("Relu", ["x"], ["a"]), n("Relu", ["a"], ["b"]), n("Add", ["a", "b"], ["y"])],
        "unsorted": [n("Add", ["a", "b"], ["y"]), n("Relu", ["a"], ["b"]), n("Relu", ["x"], ["a"])],
        "self_loop": [n("Add", ["x", "y"], ["y"])],
        "two_cycle": [n("Relu", ["x"], ["a"]), n("Add", ["a", "c"], ["b"]), n("Relu", ["b"], ["c"]),
                      n("Identity", ["c"], ["y"])],
        # two producers of 'a': the later one counts (as in the topological sort); the reader sits between
        "reads_later_duplicate": [n("Relu", ["x"], ["a"]), n("Relu", ["a"], ["y"]), n("Neg", ["x"], ["a"])],
    }[case]
    g = h.make_graph(nodes, "g", [tv("x", [1, 4])], [tv("y", [1, 4])])
    expected = _kahn_acyclic(g)
    assert expected == (case in ("sorted", "unsorted", "reads_later_duplicate"))
    if expected:
        model_io._check_acyclic(g, Path("m.onnx"))
    else:
        with pytest.raises(InputError, match="cycle"):
            model_io._check_acyclic(g, Path("m.onnx"))


# ------------------------------------------------------------------------------------------------
# the cycle and reference checks are skipped behind a clean onnx checker: same refusals, same order
# ------------------------------------------------------------------------------------------------

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "models"
SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"


def test_the_checker_self_test_passes_here():
    """The skip is live with this onnx (else every load runs the checks and the tests below only
    compare the plain path with itself)."""
    assert model_io._checker_checks_order()


def _order_case(case: str) -> onnx.ModelProto:
    n = h.make_node
    nodes = {
        "cycle": [n("Relu", ["x"], ["a"], name="r"), n("Add", ["a", "c"], ["b"], name="add"),
                  n("Relu", ["b"], ["c"], name="back"), n("Identity", ["c"], ["y"], name="out")],
        "self loop": [n("Add", ["x", "y"], ["y"], name="loop")],
        "undefined": [n("Relu", ["x"], ["a"], name="r"), n("Add", ["a", "ghost"], ["y"], name="add")],
        "undefined, custom domain": [n("Op", ["x", "ghost"], ["y"], name="custom", domain="nafix.test")],
        "sparse initializer": [n("Add", ["x", "sp"], ["y"], name="add")],
        "unsorted": [n("Add", ["a", "x"], ["y"], name="add"), n("Relu", ["x"], ["a"], name="r")],
        "two producers": [n("Relu", ["x"], ["a"], name="r"), n("Relu", ["a"], ["y"], name="r2"),
                          n("Neg", ["x"], ["a"], name="neg")],
        "clean": [n("Relu", ["x"], ["a"], name="r"), n("Add", ["a", "x"], ["y"], name="add")],
    }[case]
    g = h.make_graph(nodes, "g", [tv("x", [1, 4])], [tv("y", [1, 4])])
    if case == "sparse initializer":  # defined for the checker, not for nafix's reference check
        sp = g.sparse_initializer.add()
        sp.dims.extend([1, 4])
        sp.values.CopyFrom(nh.from_array(np.ones(1, np.float32), "sp"))
        sp.indices.CopyFrom(nh.from_array(np.zeros(1, np.int64), "sp_idx"))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("nafix.test", 1)])
    m.ir_version = 8
    return m


def _plain_order_error(m: onnx.ModelProto, path: Path) -> str | None:
    """What the cycle and reference checks say on their own (the former unconditional calls)."""
    try:
        model_io._check_acyclic(m.graph, path)
        model_io._check_references(m.graph, path)
    except InputError as exc:
        return str(exc)
    return None


ORDER_CASES = ["cycle", "self loop", "undefined", "undefined, custom domain", "sparse initializer", "unsorted",
               "two producers", "clean"]


@pytest.mark.parametrize("skip", [True, False], ids=["checker first", "checks always"])
@pytest.mark.parametrize("case", ORDER_CASES)
def test_order_checks_refuse_as_before(tmp_path, monkeypatch, case, skip):
    m = _order_case(case)
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    want = _plain_order_error(m, src)
    assert (want is None) == (case in ("unsorted", "two producers", "clean"))
    if not skip:
        monkeypatch.setattr(model_io, "_ORDER_CHECKED", [False])
    ran = []
    real = model_io._check_order
    monkeypatch.setattr(model_io, "_check_order", lambda *a: ran.append(1) or real(*a))
    if want is None:
        load_model(src)
    else:
        with pytest.raises(InputError) as err:
            load_model(src)
        assert str(err.value) == want
    # the checks ran unless the checker passed the graph clean
    assert bool(ran) == (not skip or case != "clean")


@pytest.mark.parametrize("other", ["bad --input-shape", "shared node names", "non-UTF-8 attribute"])
def test_order_checks_still_speak_before_later_errors(tmp_path, other):
    """A cyclic graph that fails a later step too: the cycle is what nafix reports, as before, and
    its message names the nodes as the file does."""
    m = _order_case("cycle")
    if other == "shared node names":
        for node in m.graph.node:
            node.name = "same"
    data = m.SerializeToString()
    if other == "non-UTF-8 attribute":
        m.graph.node[3].attribute.append(h.make_attribute("tag", "BADVALUE"))
        data = m.SerializeToString().replace(b"BADVALUE", b"\xffADVALUE")
    src = tmp_path / "m.onnx"
    src.write_bytes(data)
    want = _plain_order_error(onnx.load_from_string(data), src)
    assert want and "cycle" in want
    shapes = {"nosuch": (1, 4)} if other == "bad --input-shape" else None
    with pytest.raises(InputError) as err:
        load_model(src, input_shapes=shapes)
    assert str(err.value) == want


REAL = sorted(SHARED.glob("*.onnx")) + sorted(SAMPLES.glob("*.onnx"))


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_models_load_the_same_with_the_checks_skipped(path, monkeypatch):
    ran = []
    real = model_io._check_order
    monkeypatch.setattr(model_io, "_check_order", lambda *a: ran.append(1) or real(*a))
    fast = load_model(path)
    skipped = not ran
    monkeypatch.setattr(model_io, "_ORDER_CHECKED", [False])
    plain = load_model(path)
    assert ran  # the plain path ran the checks
    assert fast.model.SerializeToString() == plain.model.SerializeToString()
    assert fast.warnings == plain.warnings
    assert skipped == (not any(w.startswith("onnx checker") for w in fast.warnings))
