"""--quantize of a float model with rewrites before quantization: their equivalence gate runs the
original model on seeded random inputs that are the first random calibration samples (same seed,
same generator), and the accuracy report runs the original on those very samples. The gate takes
the original's values from the report's runs (``accuracy_report(meanwhile=...)``,
``verify(original_run=...)``): the same figures, the same written model, fewer runs; its verdict
still comes first."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fixer import quantize as Q
from fixer.api import FixOptions, fix
from fixer.errors import InputError, VerificationError
from fixer.quantize.accuracy import _ProbeRunner
from fixer.gate import VerifyContract, make_inputs, session, verify
from fixer.gate.runs import _with_outputs

from tests.test_quantize_flow import _conv_sub_model


def _count_runs(monkeypatch):
    runs = []
    real_run, real_bound = ort.InferenceSession.run, ort.InferenceSession.run_with_iobinding

    def run(self, *a, **kw):
        runs.append("run")
        return real_run(self, *a, **kw)

    def run_bound(self, *a, **kw):
        runs.append("bound")
        return real_bound(self, *a, **kw)

    monkeypatch.setattr(ort.InferenceSession, "run", run)
    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", run_bound)
    return runs


def _fix(tmp_path, tag, monkeypatch, share: bool):
    src = tmp_path / "m.onnx"
    if not src.exists():
        onnx.save(_conv_sub_model(), src)
    served = []
    real = _ProbeRunner.float_run

    def float_run(self, feed, names):
        got = real(self, feed, names) if share else None
        served.append(got is not None)
        return got

    with monkeypatch.context() as mp:
        mp.setattr(_ProbeRunner, "float_run", float_run)
        runs = _count_runs(mp)
        r = fix(src, FixOptions(quantize=True, output=tmp_path / f"{tag}.onnx"))
    return r, served, len(runs)


def test_the_gate_takes_the_originals_runs_from_the_accuracy_report(tmp_path, monkeypatch):
    shared, served, n_shared = _fix(tmp_path, "shared", monkeypatch, share=True)
    plain, served_plain, n_plain = _fix(tmp_path, "plain", monkeypatch, share=False)
    q = shared.quantization
    assert [c["rule"] for c in q["float_rewrites"]["changes"]] == ["NAF006"]
    assert q["float_rewrites"]["verification"]["samples"] == 3
    # the gate's three runs of the original came from the report; without, it runs them itself
    assert served == [True] * 3 and not any(served_plain)
    assert n_plain - n_shared == 3
    assert shared.quantization == plain.quantization  # every figure: the gate's, the report's
    assert list(q) == list(plain.quantization)  # and their order
    assert (tmp_path / "shared.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()


def test_float_run_gives_a_sessions_values_and_the_report_is_unchanged():
    fm = _conv_sub_model()
    calib = Q.CalibrationOptions(seed=4, random_samples=6)
    res = Q.quantize_float_model(fm, calib=calib)
    feeds = Q.open_calibration(fm, calib).take(5)
    outputs = [o.name for o in res.model.graph.output]
    want = _ProbeRunner(fm, res.model, feeds, 100, outputs=outputs, debug=3).finish()
    assert want.rows
    runner = _ProbeRunner(fm, res.model, feeds, 100, outputs=outputs, debug=3, lazy_float=True)
    names = ["y", "h", "d", "x"]  # outputs, intermediate tensors, an input
    s = session(_with_outputs(fm, ["h", "d"]))
    other = {"x": feeds[0]["x"] + np.float32(1)}
    assert runner.float_run(other, names) is None and runner.next == 0  # not the next feed: nothing ran
    assert runner.float_run({"x": feeds[1]["x"]}, names) is None and runner.next == 0
    got = []
    for i in range(3):
        vals = runner.float_run(dict(feeds[i]), names)
        assert vals is not None and runner.next == i + 1
        got.append(vals)
    for i, vals in enumerate(got):  # the arrays are the caller's: later runs did not write into them
        for v, w in zip(vals, s.run(names[:3], dict(feeds[i])) + [feeds[i]["x"]]):
            assert v.dtype == w.dtype and v.tobytes() == w.tobytes()
    # past the per-tensor feeds the report does not run the float model (a recorded reference):
    # nothing to share
    assert runner.float_run(dict(feeds[3]), names) is None and runner.next == 3
    while runner.pending():
        runner.step()
    have = runner.result()
    assert have.rows == want.rows
    assert sorted(have.quantized) == sorted(want.quantized) == list(range(5))
    for i in have.quantized:
        for n in outputs:
            assert have.quantized[i][n].tobytes() == want.quantized[i][n].tobytes()


def test_accuracy_report_meanwhile_changes_no_figure():
    fm = _conv_sub_model()
    calib = Q.CalibrationOptions(seed=0, random_samples=8)
    res = Q.quantize_float_model(fm, calib=calib, keep_reference=8)
    feeds, ref = [f for f, _ in res.reference], [r for _, r in res.reference]
    plain = Q.accuracy_report(fm, res.model, feeds, calibration=res.calibration, reference=ref)
    seen = []

    def gate(float_run):
        # the gate's inputs are the first calibration samples (seed 0 both)
        for feed in make_inputs(fm, seed=0, samples=3):
            seen.append(float_run(feed, ["y", "s", "h"]))

    shared = Q.accuracy_report(fm, res.model, feeds, calibration=res.calibration, reference=ref, meanwhile=gate)
    assert all(v is not None for v in seen) and len(seen) == 3
    assert shared.as_dict() == plain.as_dict()


def test_verify_uses_the_original_values_it_is_given():
    fm = _conv_sub_model()
    from fixer.api import AnalysisOptions, resolve_profile
    from fixer.engine import run_engine
    from fixer.rules import load_rules

    pre = run_engine(fm, [r for r in load_rules() if r.id == "NAF006"], profile=resolve_profile(AnalysisOptions()),
                     options={"input_type": "int8"}, guard=False)
    assert pre.changes
    contract = VerifyContract("exact")
    plain = verify(fm, pre.model, contract=contract, rules=pre.rules_applied)
    s = session(_with_outputs(fm, [o for n in fm.graph.node for o in n.output]))
    asked = []

    def same(feed, names):
        asked.append(list(names))
        return s.run(names, dict(feed))

    given = verify(fm, pre.model, contract=contract, rules=pre.rules_applied, original_run=same)
    assert len(asked) == 3 and given.as_dict() == plain.as_dict() and given.ok
    none = verify(fm, pre.model, contract=contract, rules=pre.rules_applied, original_run=lambda feed, names: None)
    assert none.as_dict() == plain.as_dict()

    def wrong(feed, names):  # values that are not the original's: the gate sees them, and refuses
        return [np.asarray(v) + np.float32(0.5) if n in ("y", "h") else v
                for n, v in zip(names, s.run(names, dict(feed)))]

    bad = verify(fm, pre.model, contract=contract, rules=pre.rules_applied, original_run=wrong)
    assert not bad.ok


def _failing_gate(monkeypatch):
    import fixer.gate as V

    real = V.verify

    def failing(*a, **kw):
        v = real(*a, **kw)
        return V.Verification(False, v.contract, v.rules, v.outputs, v.inputs, v.samples)

    monkeypatch.setattr(V, "verify", failing)


def test_a_failing_gate_is_the_error_even_when_quantization_fails(tmp_path, monkeypatch):
    import fixer.quantize.flow as flow

    src = tmp_path / "m.onnx"
    onnx.save(_conv_sub_model(), src)
    _failing_gate(monkeypatch)
    with pytest.raises(VerificationError, match="before quantization failed verification"):
        fix(src, FixOptions(quantize=True, output=tmp_path / "a.onnx"))
    assert not (tmp_path / "a.onnx").exists()

    def broken(*a, **kw):
        raise InputError("onnxruntime could not quantize the model")

    monkeypatch.setattr(flow, "quantize_float_model", broken)
    with pytest.raises(VerificationError, match="before quantization failed verification"):
        fix(src, FixOptions(quantize=True, output=tmp_path / "b.onnx"))
    monkeypatch.undo()
    monkeypatch.setattr(flow, "quantize_float_model", broken)  # a passing gate: quantization's error
    with pytest.raises(InputError, match="could not quantize"):
        fix(src, FixOptions(quantize=True, output=tmp_path / "c.onnx"))
    assert not any((tmp_path / f"{t}.onnx").exists() for t in "bc")


def test_float_run_of_names_the_float_model_cannot_give_runs_nothing():
    fm = _conv_sub_model()
    calib = Q.CalibrationOptions(seed=4, random_samples=4)
    res = Q.quantize_float_model(fm, calib=calib)
    feeds = Q.open_calibration(fm, calib).take(3)
    want = _ProbeRunner(fm, res.model, feeds, 100, outputs=["y"], debug=2).finish()
    runner = _ProbeRunner(fm, res.model, feeds, 100, outputs=["y"], debug=2, lazy_float=True)
    # no tensor 'nope': onnxruntime refuses the session with it; the report's own session is made
    assert runner.float_run(dict(feeds[0]), ["y", "nope"]) is None and runner.next == 0
    assert runner.f_probe is not None and "nope" not in runner.f_probe.outputs
    assert runner.float_run(dict(feeds[0]), ["y", "nope"]) is None and runner.next == 0
    assert runner.float_run(dict(feeds[0]), ["y", "h"]) is not None and runner.next == 1  # the report's tensors
    while runner.pending():
        runner.step()
    have = runner.result()
    assert have.rows == want.rows and have.rows
