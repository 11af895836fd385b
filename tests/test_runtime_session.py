"""onnxruntime sessions of models with many initializers (fixer.runtime.runtime_session).

From ``MANY_INITIALIZERS`` on, a session is created asking onnxruntime to save its optimized model
(to a temporary directory removed at once): onnxruntime then keeps the initializers in its graph
instead of finding and moving each out by name (quadratic in their number). These tests hold the
fast path to the usual one: same outputs bit for bit, same verdict of the gate, same error for a
model onnxruntime rejects, the usual session when the copy cannot be written, nothing left behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer import runtime
from fixer.runtime import runtime_initializers, runtime_session
from fixer.gate import make_inputs, session

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"


def _add_chain(n: int, *, constants: int = 0) -> onnx.ModelProto:
    """x -> Add(c0) -> Add(c1) -> ...: one scalar initializer per Add, the last ``constants`` of
    them Constant nodes instead."""
    nodes, inits = [], []
    x = "x"
    for i in range(n):
        value = np.array(0.25 * (i % 7) - 0.5, np.float32)
        if i >= n - constants:
            nodes.append(helper.make_node("Constant", [], [f"c{i}"], value=numpy_helper.from_array(value)))
        else:
            inits.append(numpy_helper.from_array(value, f"c{i}"))
        nodes.append(helper.make_node("Add", [x, f"c{i}"], [f"a{i}"], name=f"add{i}"))
        x = f"a{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _options():
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return opts


class _Spy:
    """Records the optimized-model path of every onnxruntime session created (and whether the
    file was there when the session returned)."""

    def __init__(self, monkeypatch, fail_with_path: bool = False):
        self.paths: list[str] = []
        self.written: list[bool] = []
        real = ort.InferenceSession

        def create(data, opts, *a, **k):
            path = opts.optimized_model_filepath
            self.paths.append(path)
            if fail_with_path and path:
                raise RuntimeError("cannot save the optimized model")
            sess = real(data, opts, *a, **k)
            self.written.append(bool(path) and os.path.exists(path))
            return sess

        monkeypatch.setattr(ort, "InferenceSession", create)


def _leftovers() -> set[str]:
    tmp = Path(tempfile.gettempdir())
    return {p.name for p in tmp.glob("nafix-ort-*")}


def test_runtime_initializers_counts_constant_nodes():
    assert runtime_initializers(_add_chain(12, constants=5)) == 12
    assert runtime_initializers(_add_chain(12)) == 12


def test_the_threshold_picks_the_path(monkeypatch):
    model = _add_chain(30, constants=10)
    data = model.SerializeToString()
    spy = _Spy(monkeypatch)
    monkeypatch.setattr(runtime, "MANY_INITIALIZERS", 31)
    runtime_session(data, _options(), initializers=runtime_initializers(model))
    monkeypatch.setattr(runtime, "MANY_INITIALIZERS", 30)
    runtime_session(data, _options(), initializers=runtime_initializers(model))
    assert spy.paths[0] == "" and spy.paths[1].endswith("session.onnx")
    assert spy.written == [False, True]  # onnxruntime did write its copy (so it kept the initializers)


def test_fast_path_same_outputs_and_nothing_left(monkeypatch):
    model = _add_chain(200, constants=40)
    data = model.SerializeToString()
    x = {"x": np.linspace(-3, 3, 4, dtype=np.float32).reshape(1, 4)}
    before = _leftovers()
    plain = runtime_session(data, _options(), initializers=0)
    monkeypatch.setattr(runtime, "MANY_INITIALIZERS", 1)
    opts = _options()
    fast = runtime_session(data, opts, initializers=runtime_initializers(model))
    assert opts.optimized_model_filepath == ""  # the caller's options are left as they were
    a = plain.run(None, x)[0]
    b = fast.run(None, x)[0]
    assert a.dtype == b.dtype and np.array_equal(a, b)
    assert _leftovers() == before


def test_fallback_when_the_copy_cannot_be_saved(monkeypatch):
    model = _add_chain(20)
    spy = _Spy(monkeypatch, fail_with_path=True)
    monkeypatch.setattr(runtime, "MANY_INITIALIZERS", 1)
    sess = runtime_session(model.SerializeToString(), _options(), initializers=runtime_initializers(model))
    assert [bool(p) for p in spy.paths] == [True, False]  # the fast path failed: the usual session
    assert sess.run(None, {"x": np.ones((1, 4), np.float32)})[0].shape == (1, 4)


def test_rejected_model_same_error(monkeypatch):
    """A model onnxruntime refuses fails the same way on both paths (the usual session's error)."""
    model = _add_chain(20)
    model.graph.initializer[3].data_type = TensorProto.INT32  # Add(float, int32): a type error
    model.graph.initializer[3].raw_data = np.zeros((), np.int32).tobytes()
    data = model.SerializeToString()
    with pytest.raises(Exception) as plain:
        runtime_session(data, _options(), initializers=0)
    spy = _Spy(monkeypatch)
    monkeypatch.setattr(runtime, "MANY_INITIALIZERS", 1)
    with pytest.raises(Exception) as fast:
        runtime_session(data, _options(), initializers=runtime_initializers(model))
    assert type(fast.value) is type(plain.value)
    assert str(fast.value) == str(plain.value)
    assert [bool(p) for p in spy.paths] == [True, False]


@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLES.glob("*.onnx")))
def test_gate_sessions_same_outputs_on_sample_models(monkeypatch, name):
    """verify.session on each sample model: every graph output bit for bit the same on both paths."""
    model = onnx.load(SAMPLES / name)
    feeds = make_inputs(model, seed=0, samples=2)
    plain = session(model)
    monkeypatch.setattr(runtime, "MANY_INITIALIZERS", 0)
    spy = _Spy(monkeypatch)
    fast = session(model)
    assert spy.paths and spy.paths[0]
    for feed in feeds:
        for a, b in zip(plain.run(None, feed), fast.run(None, feed)):
            a, b = np.asarray(a), np.asarray(b)
            assert a.dtype == b.dtype and a.shape == b.shape
            assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def test_fix_verdict_and_figures_same_on_both_paths(monkeypatch):
    """The whole gate of a fix (original, fixed model, isolated part) with every session on the fast
    path: the same verification, figure for figure."""
    from fixer.api import FixOptions, fix

    path = SAMPLES / "movenet_like.onnx"
    ref = fix(path, FixOptions(dry_run=True))
    assert ref.verification is not None
    monkeypatch.setattr(runtime, "MANY_INITIALIZERS", 0)
    spy = _Spy(monkeypatch)
    got = fix(path, FixOptions(dry_run=True))
    assert spy.paths and all(spy.paths)
    assert got.verification.as_dict() == ref.verification.as_dict()
    assert [c.as_dict() if hasattr(c, "as_dict") else repr(c) for c in got.engine.changes] == \
        [c.as_dict() if hasattr(c, "as_dict") else repr(c) for c in ref.engine.changes]


def test_session_options_are_the_callers_own():
    """Each caller's options, made in one place: no graph optimization and log level 3 always; the
    gate's idle threads sleep; the shape probe's one thread; the accuracy probe without the arena."""
    gate = runtime.gate_options()
    assert gate.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert gate.log_severity_level == 3
    assert gate.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert gate.enable_cpu_mem_arena and gate.intra_op_num_threads == 0
    probe = runtime.session_options(threads=1)
    assert probe.intra_op_num_threads == 1 and probe.enable_cpu_mem_arena
    with pytest.raises(RuntimeError):  # (spinning left as onnxruntime's default: the entry is not set)
        probe.get_session_config_entry("session.intra_op.allow_spinning")
    lean = runtime.session_options(arena=False, spinning=False)
    assert not lean.enable_cpu_mem_arena
    assert lean.get_session_config_entry("session.intra_op.allow_spinning") == "0"
