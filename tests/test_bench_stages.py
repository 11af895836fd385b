"""The bench's stage timer (scripts/bench_speed.py ``_stage_times``): which calls it counts and what
it leaves behind. Nothing here asserts a speed."""

import importlib.util
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

import fixer.quantize.calibration as calibration
import fixer.randomdata as randomdata
import fixer.gate.inputs as gate_inputs

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench_speed.py"
DRAW = (("fixer.randomdata", "uniform", "draw"),)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("nafix_bench_speed", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _draw(module) -> None:
    module.uniform(np.random.default_rng(0), 0.0, 1.0, (4,), np.float32)


def test_counts_a_function_where_another_module_imported_it(bench):
    # fixer.gate.inputs imported uniform by name: a call through that name is the stage's too
    assert bench._stage_times(DRAW, lambda: _draw(gate_inputs), 2).keys() == {"draw"}
    assert bench._stage_times(DRAW, lambda: None, 2) == {}


def test_leaves_the_functions_as_they_were(bench):
    before = (randomdata.uniform, gate_inputs.uniform, calibration.uniform)
    inside = []

    def run():
        inside.append((randomdata.uniform, gate_inputs.uniform, calibration.uniform))

    bench._stage_times(DRAW, run, 1)
    assert all(a is not b for a, b in zip(inside[0], before))  # all three names were wrapped
    assert (randomdata.uniform, gate_inputs.uniform, calibration.uniform) == before

    def failing():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        bench._stage_times(DRAW, failing, 1)
    assert (randomdata.uniform, gate_inputs.uniform, calibration.uniform) == before


def test_other_threads_and_missing_stages_are_not_counted(bench):
    def run():
        t = threading.Thread(target=_draw, args=(randomdata,))
        t.start()
        t.join()

    stages = DRAW + (("fixer.randomdata", "no_such_function", "missing"),
                     ("fixer.gate.inputs", "NoSuchClass.method", "missing too"))
    assert bench._stage_times(stages, run, 2) == {}


def test_a_stage_that_calls_itself_is_timed_once(bench, monkeypatch):
    probe = types.ModuleType("nafix_stage_probe")

    def deeper(n: int) -> None:
        time.sleep(0.05)
        if n:
            probe.deeper(n - 1)  # (through the module: the timer's wrapper)

    probe.deeper = deeper
    monkeypatch.setitem(sys.modules, "nafix_stage_probe", probe)
    times = bench._stage_times((("nafix_stage_probe", "deeper", "deeper"),), lambda: probe.deeper(2), 1)
    # three nested calls of 0.05 s: 0.15 s from the outer call's clock; summed per call, 0.30 s
    assert 0.15 <= times["deeper"] < 0.28
    assert probe.deeper is deeper
