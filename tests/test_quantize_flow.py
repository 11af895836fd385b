"""The --quantize flow runs each model as few times as it can without changing a figure.

* onnxruntime's calibration runs the float model on every calibration sample; the float outputs of
  the first samples are recorded there (``QuantizeResult.reference``) and are the accuracy report's
  reference: bit for bit what a session of the float model gives, and the quantized model is byte
  for byte the one quantized without recording.
* the per-tensor SQNR makes only the matched tensors graph outputs (not every float tensor through a
  Reshape, as ``qdq_loss_debug`` does) and its quantized runs give those feeds' outputs too: the
  figures are those of onnxruntime's augmented models, exactly.
* those two sessions (float, quantized) give every figure: the quantized model runs once per feed,
  the float model once per per-tensor feed; a probe run writes its intermediate tensors into the
  previous run's arrays (same bits); dequantized values are computed arithmetically (same bits as
  onnxruntime's DequantizeLinear for all 256 codes).
* ``fix --quantize`` uses the recorded reference when the float model it quantized computes what
  the original does (no float rewrite, or only bit-exact ones) and reports the figures a report
  computed from scratch gives.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer import quantize as Q
from fixer.api import FixOptions, fix
from fixer.gate import session

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"


def _conv_sub_model(opset: int = 17) -> onnx.ModelProto:
    """x -> Conv -> Sub(c, .) -> Relu -> Conv -> y, plus a second output after a Sigmoid: NAF006
    rewrites the Sub before quantizing (bit-exact), two outputs to record."""
    rng = np.random.default_rng(5)

    def init(name, arr):
        return numpy_helper.from_array(np.asarray(arr, np.float32), name)

    inits = [init("w1", rng.standard_normal((8, 3, 3, 3)) * 0.3), init("b1", rng.standard_normal(8) * 0.1),
             init("c", 1 + 0.5 * rng.standard_normal((1, 8, 1, 1))),
             init("w2", rng.standard_normal((4, 8, 1, 1)) * 0.3), init("b2", rng.standard_normal(4) * 0.1)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Sub", ["c", "h"], ["d"], name="sub"),
             helper.make_node("Relu", ["d"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="conv2"),
             helper.make_node("Sigmoid", ["y"], ["s"], name="sigmoid")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16]),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def test_calibration_records_the_float_outputs_without_changing_the_quantized_model():
    fm = onnx.load(SAMPLES / "big_activations_float.onnx")
    calib = Q.CalibrationOptions(seed=3, random_samples=6)
    plain = Q.quantize_float_model(fm, calib=calib)
    rec = Q.quantize_float_model(fm, calib=calib, keep_reference=4)
    assert plain.reference == [] and len(rec.reference) == 4
    assert rec.model.SerializeToString() == plain.model.SerializeToString()
    assert rec.as_dict() == plain.as_dict()
    feeds = Q.open_calibration(fm, calib).take(4)
    s = session(fm)
    names = [o.name for o in fm.graph.output]
    for (feed, outs), want_feed in zip(rec.reference, feeds):
        assert set(feed) == set(want_feed) and all(np.array_equal(feed[k], want_feed[k]) for k in feed)
        want = dict(zip(names, s.run(names, want_feed)))
        assert list(outs) == names
        for n in names:  # bit for bit: the same kernels on the same inputs
            assert outs[n].dtype == want[n].dtype and outs[n].tobytes() == want[n].tobytes()
    # more than there are samples: one per sample
    assert len(Q.quantize_float_model(fm, calib=calib, keep_reference=50).reference) == 6


def test_no_reference_when_the_opset_was_converted():
    m = _conv_sub_model(opset=11)
    res = Q.quantize_float_model(m, calib=Q.CalibrationOptions(random_samples=3), keep_reference=3)
    assert any("converted from opset 11" in w for w in res.warnings)
    assert res.reference == []


def _old_worst_tensors(float_model, quant_model, feeds, tmp_path) -> dict[str, float]:
    """The per-tensor SQNR as the accuracy report computed it before: onnxruntime's qdq_loss_debug
    augmented models (every float tensor saved through a Reshape), its matching, the same sums."""
    from onnxruntime.quantization.qdq_loss_debug import (
        _TENSOR_SAVE_POSTFIX as SAVED,
        create_activation_matching,
        modify_model_output_intermediate_tensors,
    )

    sessions = {}
    for tag, m in (("f", float_model), ("q", quant_model)):
        onnx.save(m, tmp_path / f"{tag}.onnx")
        modify_model_output_intermediate_tensors(str(tmp_path / f"{tag}.onnx"), str(tmp_path / f"{tag}_aug.onnx"))
        sessions[tag] = session(onnx.load(tmp_path / f"{tag}_aug.onnx"))

    def saved(sess):
        return {o.name[: -len(SAVED)]: [o.name] for o in sess.get_outputs() if o.name.endswith(SAVED)}

    matching = create_activation_matching(saved(sessions["q"]), saved(sessions["f"]))
    pairs = [(k, v["float"][0], v["post_qdq"][0]) for k, v in matching.items() if v.get("float") and v.get("post_qdq")]
    sums: dict[str, list[float]] = {}
    for feed in feeds:
        fv = dict(zip([f for _, f, _ in pairs], sessions["f"].run([f for _, f, _ in pairs], feed)))
        qv = dict(zip([q for _, _, q in pairs], sessions["q"].run([q for _, _, q in pairs], feed)))
        for name, f, q in pairs:
            x, y = np.asarray(fv[f], np.float32).ravel(), np.asarray(qv[q], np.float32).ravel()
            d = x - y
            acc = sums.setdefault(name, [0.0, 0.0])
            acc[0] += float(np.dot(x, x))
            acc[1] += float(np.dot(d, d))
    eps = float(np.finfo("float").eps)
    return {k: 20 * math.log10(max(math.sqrt(a), eps) / max(math.sqrt(b), eps)) for k, (a, b) in sums.items()}


@pytest.mark.parametrize("name", ["big_activations_float", "classifier_softmax_float"])
def test_per_tensor_sqnr_and_quantized_outputs_are_the_augmented_models(tmp_path, name):
    from fixer.quantize.accuracy import _per_tensor_dequantizers, _ProbeRunner

    fm = onnx.load(SAMPLES / f"{name}.onnx")
    calib = Q.CalibrationOptions(seed=1, random_samples=4)
    qm = Q.quantize_float_model(fm, calib=calib).model
    # most dequantized tensors are computed from the int8 ones the probe outputs
    assert len(_per_tensor_dequantizers(qm, [n.output[0] for n in qm.graph.node])) >= 3
    feeds = Q.open_calibration(fm, calib).take(3)
    outputs = [o.name for o in qm.graph.output]
    runs = _ProbeRunner(fm, qm, feeds, 10_000, outputs=outputs).finish()
    rows, got = runs.rows, runs.quantized
    old = _old_worst_tensors(fm, qm, feeds, tmp_path)
    assert len(old) >= 3 and {r["tensor"]: r["sqnr_db"] for r in rows} == old  # exactly, every tensor
    assert [r["sqnr_db"] for r in rows] == sorted(r["sqnr_db"] for r in rows)
    s_q = session(qm)
    assert sorted(got) == list(range(len(feeds)))
    for i, feed in enumerate(feeds):
        for n, v in zip(outputs, s_q.run(outputs, feed)):
            assert got[i][n].tobytes() == v.tobytes()


def test_a_recorded_reference_gives_the_same_report():
    fm = _conv_sub_model()
    calib = Q.CalibrationOptions(seed=2, random_samples=8)
    res = Q.quantize_float_model(fm, calib=calib, keep_reference=6)
    feeds = [f for f, _ in res.reference]
    fresh = Q.accuracy_report(fm, res.model, feeds, calibration=res.calibration)
    reused = Q.accuracy_report(fm, res.model, feeds, calibration=res.calibration,
                               reference=[r for _, r in res.reference])
    assert reused.as_dict() == fresh.as_dict()
    assert [o["name"] for o in fresh.outputs] == ["y", "s"] and fresh.worst_tensors
    # no per-tensor view: the quantized model is run on its own, same figures
    assert (Q.accuracy_report(fm, res.model, feeds, worst=0).outputs == fresh.outputs)
    with pytest.raises(ValueError):
        Q.accuracy_report(fm, res.model, feeds, reference=[r for _, r in res.reference][:2])


def _spy(monkeypatch):
    import fixer.quantize.flow as flow

    calls = []
    real = flow.accuracy_report

    def spy(float_model, quant_model, feeds, **kw):
        calls.append((float_model, quant_model, list(feeds), kw))
        return real(float_model, quant_model, feeds, **kw)

    monkeypatch.setattr(flow, "accuracy_report", spy)
    return calls


@pytest.mark.parametrize("build, reused", [("big_activations_float", True), ("conv_sub", True),
                                           ("movenet_like_float", False)])
def test_fix_reports_the_figures_of_a_report_computed_from_scratch(tmp_path, monkeypatch, build, reused):
    """No float rewrite (big_activations), only the bit-exact NAF006 (conv_sub): the recorded float
    outputs are the reference; NAF003 (movenet_like, an LSB contract): the original model is run."""
    path = tmp_path / "m.onnx"
    if build == "conv_sub":
        onnx.save(_conv_sub_model(), path)
    else:
        shutil.copy(SAMPLES / f"{build}.onnx", path)
    calls = _spy(monkeypatch)
    r = fix(path, FixOptions(quantize=True, dry_run=True))
    q = r.quantization
    if build == "conv_sub":
        assert [c["rule"] for c in q["float_rewrites"]["changes"]] == ["NAF006"]
        assert q["float_rewrites"]["verification"]["contract"] == "exact"
    (float_model, quant_model, feeds, kw), = calls
    assert (kw.get("reference") is not None) == reused
    assert float_model.SerializeToString() == onnx.load(path).SerializeToString()  # the original model
    want = Q.open_calibration(float_model, Q.CalibrationOptions(seed=0)).take(8)
    assert len(feeds) == len(want) == 8
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(feeds, want) for k in b)
    fresh = Q.accuracy_report(float_model, quant_model, want, calibration=q["calibration"]).as_dict()
    for key in ("outputs", "worst_tensors", "accuracy_samples"):
        assert q[key] == fresh[key], key


@pytest.mark.parametrize("dtype, zero, scale", [(np.int8, -3, 0.0173), (np.int8, 127, 3.1e-5), (np.uint8, 128, 0.5),
                                                (np.uint8, 0, 7.25e3), (np.int8, -128, np.float32(1) / 3)])
def test_dequantizers_are_onnxruntimes_dequantize_bit_for_bit(dtype, zero, scale):
    from fixer.quantize.accuracy import _per_tensor_dequantizers

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "s"), numpy_helper.from_array(np.array(zero, dtype), "z")]
    g = helper.make_graph([helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")], "g",
                          [helper.make_tensor_value_info("q", elem, [256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    (dq,) = _per_tensor_dequantizers(m, ["y"]).values()
    assert dq.src == "q" and dq.elem == elem
    codes = np.arange(256, dtype=np.uint8).view(dtype)  # every value the input can take
    want = session(m).run(["y"], {"q": codes})[0]
    got = dq(codes)
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    # the 256-entry table the report used before (float32(int32(x) - zero) * scale): the same bits
    table = (codes.astype(np.int32) - np.int32(zero)).astype(np.float32) * np.float32(scale)
    assert got.tobytes() == table.tobytes()
    assert dq(codes.reshape(16, 16)).shape == (16, 16) and dq(codes.reshape(16, 16)).tobytes() == want.tobytes()
    # per-axis scales, float16 scales, a missing zero-point: left to onnxruntime (the tensor is fetched)
    per_axis = helper.make_graph([helper.make_node("DequantizeLinear", ["q", "s2", "z2"], ["y"], axis=0)], "g",
                                 list(g.input), list(g.output),
                                 [numpy_helper.from_array(np.full(2, scale, np.float32), "s2"),
                                  numpy_helper.from_array(np.full(2, zero, dtype), "z2")])
    assert _per_tensor_dequantizers(helper.make_model(per_axis), ["y"]) == {}
    no_zero = helper.make_graph([helper.make_node("DequantizeLinear", ["q", "s"], ["y"])], "g", list(g.input),
                                list(g.output), inits[:1])
    assert _per_tensor_dequantizers(helper.make_model(no_zero), ["y"]) == {}
    assert _per_tensor_dequantizers(m, ["other"]) == {}


def _dynamic_model() -> onnx.ModelProto:
    """x [1, 4, H, W] (H, W dynamic) -> Conv -> Relu -> Mul -> y: intermediate tensors whose shape
    follows the feed."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(np.float32(1.5), "k")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Mul", ["r", "k"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_probe_reuse_writes_the_same_bits_into_the_last_arrays():
    """A reuse run writes the intermediate tensors into the previous run's arrays (I/O binding): the
    values are a plain session's bit for bit; the graph outputs are fresh arrays every time (the
    caller keeps them); other input shapes, and a released probe, run plainly."""
    from fixer.quantize.accuracy import _Probe

    m = _dynamic_model()
    probe = _Probe(Q._copy(m), ["c", "r"], {"c": TensorProto.FLOAT, "r": TensorProto.FLOAT})
    plain = session(_with_outputs(m, ["c", "r"]))
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 4, h, w)).astype(np.float32)}
             for h, w in [(6, 5), (6, 5), (6, 5), (3, 7), (3, 7)]]
    bound = []
    real = _Probe._run_into

    def spy(self, fetch, inputs):
        got = real(self, fetch, inputs)
        bound.append(got is not None)
        return got

    kept = []
    prev = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_Probe, "_run_into", spy)
        for k, feed in enumerate(feeds):
            got = probe.run(["y", "c", "r", "x"], feed, reuse=True)
            want = dict(zip(["y", "c", "r"], plain.run(["y", "c", "r"], feed)))
            for n in ("y", "c", "r"):
                assert got[n].shape == want[n].shape and got[n].tobytes() == want[n].tobytes(), (k, n)
            assert got["x"] is feed["x"] or np.array_equal(got["x"], feed["x"])
            if prev is not None and prev["c"].shape == got["c"].shape:
                assert got["c"] is prev["c"] and got["r"] is prev["r"]  # written in place
                assert got["y"] is not prev["y"]
            kept.append((got["y"], want["y"].copy()))
            prev = got
        probe.release()
        got = probe.run(["c"], feeds[0], reuse=True)
    # feed 0: nothing to reuse; 1, 2: bound; 3: other shape, plain; 4: bound; after release: plain
    assert bound == [True, True, False, True]
    assert all(y.tobytes() == w.tobytes() for y, w in kept)  # the outputs the caller kept are intact
    assert got["c"].tobytes() == plain.run(["c"], feeds[0])[0].tobytes()


def _with_outputs(model: onnx.ModelProto, names) -> onnx.ModelProto:
    m = Q._copy(model)
    for n in names:
        m.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    return m


@pytest.mark.parametrize("reference", [True, False])
def test_one_session_per_model_and_at_most_one_run_per_feed(monkeypatch, reference):
    """The per-tensor SQNR's sessions give every output figure: two sessions in all (float, quantized),
    the quantized model run once per feed, the float model once per per-tensor feed (and once per
    other feed only without a recorded reference); the figures are those of plain sessions."""
    import onnxruntime as ort

    fm = _conv_sub_model()
    calib = Q.CalibrationOptions(seed=4, random_samples=8)
    res = Q.quantize_float_model(fm, calib=calib, keep_reference=6)
    feeds = [f for f, _ in res.reference]
    ref = [r for _, r in res.reference] if reference else None
    created, runs = [], []
    real_init, real_run, real_bound = ort.InferenceSession.__init__, ort.InferenceSession.run, \
        ort.InferenceSession.run_with_iobinding

    def init(self, *a, **kw):
        created.append(self)
        real_init(self, *a, **kw)

    def run(self, *a, **kw):
        runs.append(created.index(self))
        return real_run(self, *a, **kw)

    def run_bound(self, *a, **kw):
        runs.append(created.index(self))
        return real_bound(self, *a, **kw)

    monkeypatch.setattr(ort.InferenceSession, "__init__", init)
    monkeypatch.setattr(ort.InferenceSession, "run", run)
    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", run_bound)
    acc = Q.accuracy_report(fm, res.model, feeds, calibration=res.calibration, debug_samples=2, reference=ref)
    monkeypatch.undo()
    assert len(created) == 2
    f_runs, q_runs = runs.count(0), runs.count(1)
    assert (f_runs, q_runs) == ((2 if reference else 6), 6)
    # the same figures from plain sessions: the float model run on every feed, the quantized too
    plain = Q.accuracy_report(fm, res.model, feeds, calibration=res.calibration, worst=0)
    assert acc.outputs == plain.outputs and acc.worst_tensors
    names = [o.name for o in fm.graph.output]
    s_f = session(fm)
    for (feed, outs) in res.reference:  # the recorded reference is what the float session gives
        for n, v in zip(names, s_f.run(names, feed)):
            assert outs[n].tobytes() == v.tobytes()


def _old_compare(a: np.ndarray, b: np.ndarray) -> dict:
    """The output figures as the report computed them before (four full-size temporaries)."""
    diff = a - b
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cosine = float(np.dot(a, b) / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    noise = float(np.sum(diff ** 2))
    snr = float("inf") if noise == 0 else float(10 * np.log10(max(float(np.sum(a ** 2)), 1e-30) / noise))
    return {"cosine": cosine, "snr_db": snr, "max_abs_error": float(np.abs(diff).max()) if diff.size else 0.0}


@pytest.mark.parametrize("case", ["noise", "equal", "signed_zeros", "zeros", "nan", "inf", "one", "empty"])
def test_compare_gives_the_figures_of_the_formulas_bit_for_bit(case):
    from fixer.quantize.accuracy import _compare

    rng = np.random.default_rng(3)
    a = rng.standard_normal(100_003).astype(np.float32).astype(np.float64)
    b = a + rng.standard_normal(a.size) * 1e-2
    if case == "equal":
        b = a.copy()
    elif case == "signed_zeros":  # -0.0 - 0.0 is -0.0: every difference is a zero, some negative
        a = np.where(np.arange(a.size) % 2 == 0, -0.0, 0.0)
        b = np.zeros_like(a)
    elif case == "zeros":
        a, b = np.zeros(50), np.zeros(50)
    elif case == "nan":
        b[17] = np.nan
    elif case == "inf":
        b[5], a[9] = np.inf, -np.inf
    elif case == "one":
        a, b = np.array([2.5]), np.array([-1.0])
    elif case == "empty":
        a, b = np.zeros(0), np.zeros(0)
    with np.errstate(all="ignore"):
        want, got = _old_compare(a, b), _compare(a.copy(), b.copy())
    assert got.keys() == want.keys()
    for k in want:  # the same bits (NaN included), the same sign of zero
        assert np.float64(got[k]).tobytes() == np.float64(want[k]).tobytes(), (k, got[k], want[k])
    assert _compare(a, b[:-1] if b.size else np.zeros(1))["detail"] == "shapes differ"


def test_gate_and_accuracy_sessions_do_not_spin_idle_threads():
    """Scheduling only: the gate's and the accuracy probes' sessions let idle worker threads sleep
    (the same kernels, the same outputs as a default session)."""
    import onnxruntime as ort

    from fixer.quantize.accuracy import _Probe

    m = _conv_sub_model()
    key = "session.intra_op.allow_spinning"
    for s in (session(m), _Probe(Q._copy(m), ["h"], {"h": TensorProto.FLOAT}).session):
        assert s.get_session_options().get_session_config_entry(key) == "0"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    default = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {"x": np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    for a, b in zip(session(m).run(None, feed), default.run(None, feed)):
        assert a.tobytes() == b.tobytes()
