"""Large graphs made and run as consecutive onnxruntime sessions (fixer.segments) against one
session of the whole graph: the same values bit for bit, the same input and output descriptions,
the same errors, the same gate verdicts; and the graphs that stay whole.

The thresholds are lowered here (a graph of a few hundred nodes cut into segments of a few dozen):
what is checked is the cut, not its size."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer import runtime, segments
import fixer.gate.check as gate_check
import fixer.gate.runs as gate_runs
from fixer.api import FixOptions, fix
from fixer.rules import VerifyContract
from tests.builders.qdq import qdq_sub_chain


def _wide(blocks: int = 40, *, value_info: bool = True) -> onnx.ModelProto:
    """Two inputs; per block a 1x1 Conv (own weight), a skip Add to the output of the block 3 back,
    a Clip with its min left out (an empty input name), a scale initializer shared by every block,
    a Constant node; two outputs, one from the middle of the graph."""
    rng = np.random.default_rng(0)
    c = 4
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "shared_scale"),
             numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    nodes = [helper.make_node("Add", ["x", "y"], ["h0"], name="in_add")]
    hist = ["h0"]
    for i in range(blocks):
        w = (rng.standard_normal((c, c, 1, 1)) * 0.4).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("Conv", [hist[-1], f"w{i}"], [f"conv{i}"], name=f"conv{i}"),
            helper.make_node("Mul", [f"conv{i}", "shared_scale"], [f"mul{i}"], name=f"mul{i}"),
            helper.make_node("Add", [f"mul{i}", hist[max(0, len(hist) - 3)]], [f"skip{i}"], name=f"skip{i}"),
            helper.make_node("Constant", [], [f"k{i}"], name=f"const{i}",
                             value=numpy_helper.from_array(np.array(0.01 * i, np.float32))),
            helper.make_node("Sub", [f"skip{i}", f"k{i}"], [f"sub{i}"], name=f"sub{i}"),
            helper.make_node("Clip", [f"sub{i}", "", "six"], [f"h{i + 1}"], name=f"clip{i}"),
        ]
        hist.append(f"h{i + 1}")
    vi = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 5, 5]),
          helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 5, 5])]
    g = helper.make_graph(nodes, "wide", vi[::-1],
                          [helper.make_tensor_value_info(hist[-1], TensorProto.FLOAT, [1, c, 5, 5]),
                           helper.make_tensor_value_info(hist[blocks // 2], TensorProto.FLOAT, [1, c, 5, 5])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    return onnx.shape_inference.infer_shapes(m) if value_info else m


@pytest.fixture
def small_cuts(monkeypatch):
    monkeypatch.setattr(segments, "SEGMENT_FROM", 50)
    monkeypatch.setattr(segments, "SEGMENT_NODES", 30)


def _feeds(seed=1):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal((1, 4, 5, 5)).astype(np.float32) for n in ("x", "y")}


@pytest.mark.parametrize("value_info", [True, False], ids=["declared-boundaries", "inferred-boundaries"])
def test_segmented_session_same_values_and_descriptions(small_cuts, value_info):
    model = _wide(value_info=value_info)
    cut = segments.plan(model)
    assert cut is not None and len(cut.segments) >= 5
    assert sorted(k for seg in cut.segments for k in seg) == list(range(len(model.graph.node)))
    whole = runtime.session_as_written(model)
    seg = gate_runs.session(model)
    assert isinstance(seg, segments.SegmentedSession)
    describe = lambda args: [(a.name, a.type, a.shape) for a in args]  # noqa: E731
    assert describe(seg.get_inputs()) == describe(whole.get_inputs())
    assert describe(seg.get_outputs()) == describe(whole.get_outputs())
    names = [o.name for o in whole.get_outputs()]
    for seed in (1, 2):
        feed = _feeds(seed)
        for ask in (names, names[::-1], names[1:], None):
            want = whole.run(ask, feed)
            got = seg.run(ask, feed)
            assert len(got) == len(want)
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and np.array_equal(a, b)


def test_every_tensor_as_an_output_same_bits(small_cuts):
    """Extra outputs the gate asks for (tensors inside segments) come out as the whole graph computes them."""
    model = _wide()
    inner = [f"conv{i}" for i in range(0, 40, 7)] + ["k3", "h0"]
    m = gate_runs._with_outputs(model, inner)
    whole, seg = runtime.session_as_written(m), gate_runs.session(m)
    assert isinstance(seg, segments.SegmentedSession)
    feed = _feeds(3)
    for a, b in zip(seg.run(inner, feed), whole.run(inner, feed)):
        assert np.array_equal(a, b)


def test_run_errors_as_onnxruntime_says_them(small_cuts):
    seg = gate_runs.session(_wide())
    feed = _feeds()
    with pytest.raises(ValueError, match="Invalid input name: z"):
        seg.run(None, {**feed, "z": feed["x"]})
    with pytest.raises(ValueError, match="Invalid output name:nope"):
        seg.run(["nope"], feed)
    with pytest.raises(ValueError, match="missing from input feed"):
        seg.run(None, {"x": feed["x"]})


def test_a_node_onnxruntime_rejects_in_a_late_segment_is_rejected(small_cuts):
    model = _wide()
    late = next(n for n in reversed(model.graph.node) if n.op_type == "Mul")
    late.op_type = "NoSuchOp"
    with pytest.raises(Exception) as whole_err:
        runtime.session_as_written(model)
    assert segments.plan(model) is not None
    with pytest.raises(Exception) as seg_err:
        gate_runs.session(model)
    assert "NoSuchOp" in str(seg_err.value) and "NoSuchOp" in str(whole_err.value)
    # the gate: a fixed model onnxruntime rejects fails it, segmented or not
    v = gate_check.verify(_wide(), model, contract=VerifyContract("exact"))
    assert not v.ok and "does not load" in v.outputs[0].detail and "NoSuchOp" in v.outputs[0].detail


def test_a_declared_type_that_contradicts_a_segment_is_rejected(small_cuts):
    """value_info saying int8 for a float tensor made in one segment and read in the next: the whole
    graph is rejected by onnxruntime, and so is the segmented one (the maker checks the declaration)."""
    model = _wide()
    cut = segments.plan(model)
    crossing = next(t for t in cut.inputs[3] if t not in ("x", "y"))
    for v in model.graph.value_info:
        if v.name == crossing:
            v.type.tensor_type.elem_type = TensorProto.INT8
    with pytest.raises(Exception):
        runtime.session_as_written(model)
    with pytest.raises(Exception):
        gate_runs.session(model)


def _edit(model, fn):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    fn(m)
    return m


@pytest.mark.parametrize("why", ["small", "subgraph", "never-made", "made-twice", "input-initializer",
                                 "unused-input", "cycle", "output-is-input"])
def test_graphs_that_stay_whole(small_cuts, why, monkeypatch):
    model = _wide()
    g = model.graph
    if why == "small":
        monkeypatch.setattr(segments, "SEGMENT_FROM", len(g.node) + 1)
    elif why == "subgraph":
        branch = helper.make_graph([helper.make_node("Identity", ["h1"], ["b"])], "b", [],
                                   [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
        g.node.append(helper.make_node("If", ["cond"], ["iffed"], then_branch=branch, else_branch=branch))
        g.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    elif why == "never-made":
        g.node[5].input[0] = "ghost"
    elif why == "made-twice":
        g.node[7].output[0] = g.node[3].output[0]
    elif why == "input-initializer":
        g.input.append(helper.make_tensor_value_info("six", TensorProto.FLOAT, []))
    elif why == "unused-input":
        g.input.append(helper.make_tensor_value_info("unused", TensorProto.FLOAT, [1]))
    elif why == "cycle":
        g.node[1].input[0] = g.node[20].output[0]
    elif why == "output-is-input":
        g.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5]))
    assert segments.plan(model) is None
    if why in ("small", "subgraph", "unused-input", "output-is-input"):
        assert not isinstance(gate_runs.session(model), segments.SegmentedSession)


def test_topological_order_of_an_unsorted_graph(small_cuts):
    """Nodes listed out of order are cut in an order where each runs after what it reads."""
    model = _wide()
    shuffled = _edit(model, lambda m: (m.graph.ClearField("node"),
                                       m.graph.node.extend(reversed(list(model.graph.node)))))
    cut = segments.plan(shuffled)
    assert cut is not None
    made = {"x", "y"} | {t.name for t in shuffled.graph.initializer}
    for seg in cut.segments:
        for k in seg:
            assert all(t in made for t in cut.reads[k])
            made.update(cut.writes[k])
    seg, whole = gate_runs.session(shuffled), runtime.session_as_written(model)
    feed = _feeds(4)
    for a, b in zip(seg.run(None, feed), whole.run(None, feed)):
        assert np.array_equal(a, b)


def test_fix_of_a_large_graph_same_verdict_and_model_segmented_or_not(tmp_path, monkeypatch):
    path = tmp_path / "chain.onnx"
    onnx.save(qdq_sub_chain(24), path)
    whole = fix(path, FixOptions(dry_run=True))
    assert whole.engine.changes and whole.verification is not None and whole.verification.ok
    made = []
    real = segments.SegmentedSession.__init__

    def spy(self, *a, **k):
        made.append(1)
        real(self, *a, **k)

    monkeypatch.setattr(segments.SegmentedSession, "__init__", spy)
    monkeypatch.setattr(segments, "SEGMENT_FROM", 40)
    monkeypatch.setattr(segments, "SEGMENT_NODES", 25)
    seg = fix(path, FixOptions(dry_run=True))
    assert made  # the gate's sessions of the whole models were segmented
    assert seg.verification.as_dict() == whole.verification.as_dict()
    assert seg.engine.model.SerializeToString() == whole.engine.model.SerializeToString()



def test_fetching_inner_tensors_keeps_the_segments_made_by_the_shared_threads(small_cuts):
    """The gate adds inner tensors as outputs by name alone (untyped): a boundary tensor among them
    is still declared by its value_info, so the segments are handed to the shared threads at once
    rather than made one after the other in the caller's thread."""
    model = _wide()
    cut = segments.plan(model)
    crossing = [t for ins in cut.inputs for t in ins if t not in ("x", "y")]
    m = gate_runs._with_outputs(model, crossing[:5])
    begun = gate_runs.begin_session(m)
    assert isinstance(begun, segments.SegmentedSession) and begun._futures  # handed over, not made in order
    whole = runtime.session_as_written(m)
    feed = _feeds(5)
    for a, b in zip(begun.ready().run(crossing[:5], feed), whole.run(crossing[:5], feed)):
        assert np.array_equal(a, b)


def test_an_original_onnxruntime_rejects_is_an_input_error_with_nothing_left_loading(small_cuts, monkeypatch):
    """Both models segmented: the original's segments rejected, the gate raises the input error only
    once every segment session it began (the fixed model's too) is made."""
    from fixer.errors import InputError

    bad = _wide()
    next(n for n in reversed(bad.graph.node) if n.op_type == "Mul").op_type = "NoSuchOp"
    fixed = _wide()
    fixed.graph.node[3].name = "renamed"
    started, ended = [], []
    real = runtime.runtime_session

    def spy(data, opts, **kw):  # (every session the gate makes, of a segment's bytes or of a model)
        started.append(len(data))
        try:
            return real(data, opts, **kw)
        finally:
            ended.append(len(data))

    monkeypatch.setattr(runtime, "runtime_session", spy)
    with pytest.raises(InputError):
        gate_check.verify(bad, fixed, contract=VerifyContract("exact"))
    assert len(ended) == len(started) >= 2 * len(segments.plan(bad).segments)


def test_no_segment_thread_outlives_the_gate_or_a_session(small_cuts):
    """Idle threads left behind would change what the process may do next (a zoo audit forks its
    workers only from a process with no other thread)."""
    import threading

    def segment_threads():
        return [t for t in threading.enumerate() if t.name.startswith("nafix-segment")]

    seg = gate_runs.session(_wide())
    assert isinstance(seg, segments.SegmentedSession) and not segment_threads()
    fixed = _wide()
    fixed.graph.node[3].name = "renamed"
    v = gate_check.verify(_wide(), fixed, contract=VerifyContract("exact"))
    assert v.ok and not segment_threads()


def test_leaving_the_shared_block_early_drops_the_segments_not_started(small_cuts):
    """An error (or Ctrl-C) inside the gate: the sessions nobody will wait for are not made, and the
    threads still end with the block."""
    import threading

    started = []

    def slow(m):
        started.append(m.graph.name)
        import time

        time.sleep(0.05)
        return runtime.session_as_written(m)

    with pytest.raises(RuntimeError, match="stop"):
        with segments.shared_workers():
            seg = segments.SegmentedSession(_wide(), segments.plan(_wide()), slow)
            raise RuntimeError("stop")
    assert len(started) < len(seg._futures)  # the queued ones were dropped, not made
    assert not [t for t in threading.enumerate() if t.name.startswith("nafix-segment")]


@pytest.mark.parametrize("what", ["shape", "type"])
def test_a_stale_declaration_of_a_crossing_tensor_gives_the_whole_graphs_answer(small_cuts, what):
    """value_info that says a wrong size (or type) for a tensor made in one segment and read in the
    next: the segments are made again with onnxruntime's own inference there, so the answer is the
    whole graph's (which loads and runs, or is rejected, as the whole graph is)."""
    model = _wide()
    cut = segments.plan(model)
    crossing = next(t for t in cut.inputs[2] if t not in ("x", "y"))
    for v in model.graph.value_info:
        if v.name == crossing:
            if what == "shape":
                v.type.tensor_type.shape.dim[1].dim_value = 7
            else:
                v.type.tensor_type.elem_type = TensorProto.DOUBLE
    try:
        whole = runtime.session_as_written(model)
    except Exception as exc:  # noqa: BLE001 - then the segmented graph must be rejected too
        with pytest.raises(type(exc)):
            gate_runs.session(model)
        return
    seg = gate_runs.session(model)
    feed = _feeds(6)
    for a, b in zip(seg.run(None, feed), whole.run(None, feed)):
        assert np.array_equal(a, b)


def test_segments_assembled_from_bytes_equal_those_built_of_messages(small_cuts, monkeypatch):
    """A segment's model is assembled from its nodes', initializers' and value_info's serialized
    bytes (segments._wire_classes); where that view cannot be made, of the messages themselves: the
    two give the same models, byte for byte (two model outputs, a Constant node, an empty input name,
    an initializer read by every segment)."""
    model = _wide()
    cut = segments.plan(model)
    assert len(cut.segments) > 3

    def built():
        s = segments.SegmentedSession(model, cut, lambda m: m)
        return [f.result().SerializeToString() for f in s._futures]

    assert segments._wire_classes() is not None  # the fast path is the one this runtime takes
    from_bytes = built()
    real = segments._wire_classes()

    class Unreadable:  # as for a graph over protobuf's 2 GiB, which cannot be serialized whole
        @staticmethod
        def FromString(data):
            raise ValueError("Message onnx.GraphProto exceeds maximum protobuf size of 2GB")

    monkeypatch.setattr(segments, "_WIRE", [(Unreadable, real[1])])
    too_large = built()
    monkeypatch.setattr(segments, "_WIRE", [None])
    assert segments._wire_classes() is None
    of_messages = built()
    assert from_bytes == of_messages == too_large
    first = onnx.ModelProto.FromString(from_bytes[0])
    assert first.graph.name == "wide_segment0" and first.opset_import == model.opset_import
    assert {t.name for t in first.graph.initializer} == {
        t for k in cut.segments[0] for t in cut.reads[k] if t in {i.name for i in model.graph.initializer}}


def test_segments_handed_over_serialized_are_the_models_bytes(small_cuts):
    """With ``make_serialized`` (the gate's), a segment is handed over as the bytes it is assembled
    of: the model ``make`` would get, serialized, with a bound at least its initializers and Constant
    nodes; the gate's maker loads them at the IR version onnxruntime accepts, as the model's session."""
    from fixer.runtime import runtime_initializers

    model = _wide()
    assert model.ir_version > runtime.MAX_RUNTIME_IR_VERSION  # (the cap is exercised)
    cut = segments.plan(model)
    as_models = [f.result() for f in segments.SegmentedSession(model, cut, lambda m: m)._futures]
    got = [f.result() for f in segments.SegmentedSession(model, cut, lambda m: m,
                                                         make_serialized=lambda d, n: (d, n))._futures]
    assert [onnx.ModelProto.FromString(d) for d, _ in got] == as_models  # (the fields in another order)
    assert all(n >= runtime_initializers(m) for (_, n), m in zip(got, as_models))
    assert any(runtime_initializers(m) > len(m.graph.initializer) for m in as_models)  # Constant nodes counted
    make = runtime.serialized_sessions(model.ir_version)
    serialized, of_model = make(*got[0]), runtime.session_as_written(as_models[0])
    assert [(a.name, a.type, a.shape) for a in serialized.get_outputs()] == \
        [(a.name, a.type, a.shape) for a in of_model.get_outputs()]
    feed = {i.name: v for i, v in zip(of_model.get_inputs(), _feeds(3).values())}
    for a, b in zip(serialized.run(None, feed), of_model.run(None, feed)):
        assert np.array_equal(a, b)


def test_extra_outputs_without_a_copy_are_the_copys_segments(small_cuts):
    """``extra`` outputs (the gate's boundary and captured tensors), given to the plan and the session
    instead of added to a copy of the model: the same cut, the same segment bytes, the same answers;
    names given by the caller are those the plan reads; an extra name no node makes keeps the graph
    whole, as such a graph output does."""
    model = _wide()
    extra = ["conv7", "h0", "k3", "conv7", model.graph.output[1].name, "sub30"]
    copy = gate_runs._with_outputs(model, extra)
    nodes = list(model.graph.node)
    given = segments.plan(model, extra=extra,
                          names=lambda: ([n.input[:] for n in nodes], [n.output[:] for n in nodes]))
    assert segments.plan(model, extra=extra) == segments.plan(copy) == given
    assert segments.plan(model) != given  # (the extra outputs are cut out of their segments)

    def segment_bytes(m, cut, **k):
        s = segments.SegmentedSession(m, cut, lambda x: x, make_serialized=lambda d, n: (d, n), **k)
        return [f.result() for f in s._futures]

    assert segment_bytes(model, given, extra=extra) == segment_bytes(copy, segments.plan(copy))
    feed = _feeds(4)
    a = gate_runs.begin_session(model, extra=extra).ready()
    b = runtime.session_as_written(copy)
    assert isinstance(a, segments.SegmentedSession)
    assert [o.name for o in a.get_outputs()] == [o.name for o in b.get_outputs()]
    for x, y in zip(a.run(None, feed), b.run(None, feed)):
        assert np.array_equal(x, y)
    assert segments.plan(model, extra=["x"]) is None  # a graph input fetched as an output: made whole
    whole = gate_runs.begin_session(model, extra=["x", "conv7"]).ready()
    assert not isinstance(whole, segments.SegmentedSession)
    assert [o.name for o in whole.get_outputs()][-2:] == ["x", "conv7"]


@pytest.mark.parametrize("value_info", [True, False], ids=["made-by-threads", "made-in-order"])
def test_segments_only_checked_to_load_hold_no_session_and_run_as_kept_ones(small_cuts, value_info):
    """``keep=False`` (the gate's fixed model where something else may run in its place): each
    segment's session is dropped once made, what it loaded as is still described as a kept session
    describes it, and running it makes the sessions again, with the same values."""
    model = _wide(value_info=value_info)
    kept = gate_runs.begin_session(model).ready()
    checked = gate_runs.begin_session(model, keep=False).ready()
    assert isinstance(checked, segments.SegmentedSession)
    assert checked._ordered is (not value_info)  # without boundary declarations: made one after another
    assert checked._sessions and all(type(s) is segments.Loaded for s in checked._sessions)
    describe = lambda args: [(a.name, a.type, a.shape) for a in args]  # noqa: E731
    assert describe(checked.get_inputs()) == describe(kept.get_inputs())
    assert describe(checked.get_outputs()) == describe(kept.get_outputs())
    feed = _feeds(7)
    for a, b in zip(checked.run(None, feed), kept.run(None, feed)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert not any(type(s) is segments.Loaded for s in checked._sessions)  # made again, and kept


def test_a_segment_onnxruntime_rejects_is_rejected_when_only_checked_to_load(small_cuts):
    model = _wide()
    next(n for n in reversed(model.graph.node) if n.op_type == "Mul").op_type = "NoSuchOp"
    with pytest.raises(Exception, match="NoSuchOp"):
        gate_runs.begin_session(model, keep=False).ready()


def test_the_gate_holds_the_fixed_models_segments_only_where_it_runs_them(tmp_path, monkeypatch):
    """A QDQ chain cut into segments: its rewritten nodes prove every input set, so the fixed model's
    segments are only checked to load (none is kept), and the verdict is that of the whole graphs."""
    path = tmp_path / "chain.onnx"
    onnx.save(qdq_sub_chain(24), path)
    whole = fix(path, FixOptions(dry_run=True))
    made: list = []
    real = segments.SegmentedSession.__init__

    def spy(self, *a, **k):
        made.append(self)
        real(self, *a, **k)

    monkeypatch.setattr(segments.SegmentedSession, "__init__", spy)
    monkeypatch.setattr(segments, "SEGMENT_FROM", 40)
    monkeypatch.setattr(segments, "SEGMENT_NODES", 25)
    seg = fix(path, FixOptions(dry_run=True))
    assert seg.verification.as_dict() == whole.verification.as_dict() and seg.verification.ok
    assert [s._keep for s in made] == [True, False]  # the original's kept, the fixed model's checked
    assert all(type(s) is segments.Loaded for s in made[1]._sessions)
