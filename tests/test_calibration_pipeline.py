"""The calibration's samples read one ahead (fixer.quantize.ort._calibration_reading_ahead): the
next sample is read while the current one runs, onnxruntime's calibrator gets the results of its own
samples in its own order, one run at a time, nothing is left running, and the quantized model is
byte for byte the one of the calibration without reading ahead."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from fixer import quantize as Q
from fixer.quantize import ort as O

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"


class _Reader:
    """Samples {"x": [k]} for k < n; raises at sample ``bad`` when given; ``read(k)``: an event set
    once sample k was read (or there is none)."""

    def __init__(self, n: int, bad: int | None = None):
        self.n, self.k, self.bad = n, 0, bad
        self._read = [threading.Event() for _ in range(n + 1)]
        self._read[n].set()

    def read(self, k: int) -> threading.Event:
        return self._read[min(k, self.n)]

    def get_next(self):
        if self.k >= self.n:
            return None
        if self.k == self.bad:
            raise OSError(f"cannot read sample {self.k}")
        self.k += 1
        self._read[self.k - 1].set()
        return {"x": np.array([self.k - 1])}

    def __len__(self):
        return self.n


class _Session:
    """Returns [2 x] after a short, varying sleep; records how many runs overlap and which threads ran."""

    def __init__(self, fail_on: int | None = None, read_next=None):
        self.read_next, self.waited = read_next, []
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.threads: set[str] = set()
        self.calls: list[int] = []
        self.fail_on = fail_on

    def run(self, output_names, feed, run_options=None):
        k = int(feed["x"][0])
        if self.read_next is not None:  # the run of k goes on until sample k + 1 was read (or 2 s)
            self.waited.append(self.read_next(k).wait(2.0))
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads.add(threading.current_thread().name)
            self.calls.append(k)
        try:
            time.sleep(0.02 if k % 2 == 0 else 0.005)  # out of order if the results were taken as they come
            if k == self.fail_on:
                raise RuntimeError(f"run {k} failed")
            return [feed["x"] * 2]
        finally:
            with self.lock:
                self.now -= 1

    def get_outputs(self):
        return ["y"]


def _calibrate(reader, session) -> list[int]:
    """onnxruntime's calibrator loop (MinMaxCalibrater.collect_data): read, run, keep."""
    got = []
    while True:
        inputs = reader.get_next()
        if not inputs:
            break
        got.append(int(session.run(None, inputs)[0][0]))
    return got


def _pipeline(reader):
    ahead = O._ReadAhead(reader)
    return ahead, O._ReadAheadReader(ahead)


@pytest.mark.parametrize("n", [0, 1, 2, 7])
def test_the_calibrator_gets_its_samples_results_in_order_the_next_read_while_one_runs(n):
    source = _Reader(n)
    inner = _Session(read_next=lambda k: source.read(k + 1))
    pipe, reader = _pipeline(source)
    session = pipe.wrap(inner)
    try:
        got = _calibrate(reader, session)
    finally:
        pipe.close()
    assert got == [2 * k for k in range(n)]
    assert sorted(inner.calls) == list(range(n)) and inner.calls == sorted(inner.calls)  # each once, in order
    assert inner.most == min(n, 1)  # one run at a time
    if n:
        assert inner.threads == {"nafix-calibration_0"}
    # each run went on until the next sample was read: read while it ran, not after
    assert inner.waited == [True] * n
    assert reader.get_next() is None and len(reader) == n


def test_without_a_session_or_with_reading_ahead_off_nothing_runs_ahead(monkeypatch):
    inner = _Session()
    pipe, reader = _pipeline(_Reader(3))
    assert reader.get_next() == {"x": np.array([0])}  # no session yet: the sample as read
    pipe.close()
    monkeypatch.setattr(O, "READ_AHEAD", False)
    with O._calibration_reading_ahead(_Reader(3)) as same:
        assert isinstance(same, _Reader)
    assert inner.calls == []


def test_a_call_other_than_the_calibrators_runs_as_it_would():
    inner = _Session()
    pipe, reader = _pipeline(_Reader(3))
    session = pipe.wrap(inner)
    try:
        first = reader.get_next()
        # other outputs asked for, or another dict with the same values: not the run begun
        assert int(session.run(["y"], first)[0][0]) == 0
        assert int(session.run(None, {"x": np.array([5])})[0][0]) == 10
        assert int(session.run(None, first)[0][0]) == 0
        assert session.get_outputs() == ["y"]  # anything else is the session's
    finally:
        pipe.close()
    assert inner.calls.count(0) == 2 and 5 in inner.calls


def _nafix_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("nafix-calibration")]


def test_a_failed_run_raises_at_its_sample_and_nothing_is_left_running():
    inner = _Session(fail_on=3)
    pipe, reader = _pipeline(_Reader(8))
    session = pipe.wrap(inner)
    with pytest.raises(RuntimeError, match="run 3 failed"):
        try:
            _calibrate(reader, session)
        finally:
            pipe.close()
    assert inner.now == 0 and not _nafix_threads()
    assert {0, 1, 2, 3} <= set(inner.calls) <= {0, 1, 2, 3, 4}  # read ahead by one sample, no further


def test_a_sample_that_cannot_be_read_fails_when_the_calibrator_asks_for_it():
    inner = _Session()
    pipe, reader = _pipeline(_Reader(8, bad=4))
    session = pipe.wrap(inner)
    got = []
    with pytest.raises(OSError, match="cannot read sample 4"):
        try:
            while True:
                inputs = reader.get_next()
                if not inputs:
                    break
                got.append(int(session.run(None, inputs)[0][0]))
        finally:
            pipe.close()
    assert got == [0, 2, 4, 6]  # every sample before it was calibrated, as one at a time
    assert not _nafix_threads()


@pytest.mark.parametrize("method", ["minmax", "entropy"])
@pytest.mark.parametrize("name", ["classifier_softmax_float", "movenet_like_float"])
def test_the_quantized_model_is_byte_for_byte_that_of_the_calibration_without_reading_ahead(monkeypatch, name,
                                                                                             method):
    """(These two samples' ranges move by an ulp when a run's thread count changes: the runs read
    ahead keep the session and its options.)"""
    import onnxruntime as ort

    fm = onnx.load(SAMPLES / f"{name}.onnx")
    calib = Q.CalibrationOptions(seed=2, random_samples=6, method=method)
    real_run = ort.InferenceSession.run
    threads: list[str] = []

    def run(self, *a, **kw):
        threads.append(threading.current_thread().name)
        return real_run(self, *a, **kw)

    monkeypatch.setattr(ort.InferenceSession, "run", run)
    models = {}
    for on in (False, True):
        monkeypatch.setattr(O, "READ_AHEAD", on)
        threads.clear()
        res = Q.quantize_float_model(fm, calib=calib, keep_reference=3)
        models[on] = (res.model.SerializeToString(), res.reference)
        beside = sum(t.startswith("nafix-calibration") for t in threads)
        assert beside == (6 if on else 0)  # every calibration run, and only there
    assert models[False][0] == models[True][0]
    for (f1, r1), (f2, r2) in zip(models[False][1], models[True][1]):
        assert all(np.array_equal(f1[k], f2[k]) for k in f1)
        assert all(r1[k].tobytes() == r2[k].tobytes() for k in r1)
    assert not _nafix_threads()
