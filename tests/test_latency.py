"""Estimated inference time (fixer.npu.latency) and `nafix calibrate --times` (published times)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fixer.errors import ProfileError
from fixer.latency_calibration import calibrate_times, spearman, times_summary
from fixer.npu.latency import latency_model, parse_latency
from fixer.npu.mpool import default_stm32n6_pools
from fixer.npu.profile import load_profile
from tests.helpers import QDQ, analyze, run_cli, save

ROOT = Path(__file__).resolve().parents[1]
TIMES = ROOT.parent / "shared" / "reference" / "latency" / "published_times.csv"
needs_times = pytest.mark.skipif(not TIMES.is_file(), reason=f"{TIMES} (published times) is not available")


def conv_chain(size: int, channels: int = 16, layers: int = 2):
    """A QDQ chain of ``layers`` 3x3 Conv + Relu at ``size`` x ``size``."""
    b = QDQ()
    x = b.input("x", [1, channels, size, size])
    for i in range(layers):
        x = b.op("Conv", [x, b.weight(f"w{i}", [channels, channels, 3, 3], seed=i)], name=f"conv{i}", pads=[1, 1, 1, 1])
        x = b.op("Relu", [x], name=f"relu{i}")
    b.output(x)
    return b.model()


def test_every_epoch_has_a_time_and_they_add_up():
    a = analyze(conv_chain(32))
    assert a.estimate.sw_epochs == 0  # a quantized chain: all on the NPU
    lat = a.estimate.latency
    assert lat is not None and lat.ms > 0
    assert len(lat.epoch_ms) == a.estimate.epochs
    assert all(t > 0 for t in lat.epoch_ms)
    assert lat.ms == pytest.approx(sum(lat.epoch_ms) + lat.overhead_ms, rel=1e-3)
    assert lat.hw_ms + lat.sw_ms + lat.hybrid_ms == pytest.approx(sum(lat.epoch_ms), rel=1e-3)
    d = a.estimate.as_dict()
    assert d["latency_ms"] == pytest.approx(lat.ms, abs=1e-3) and d["latency"]["estimated"] is True


def test_more_work_takes_longer():
    small, large = analyze(conv_chain(16)), analyze(conv_chain(64))
    deeper = analyze(conv_chain(16, layers=6))
    assert large.estimate.latency.ms > 4 * small.estimate.latency.ms  # 16x the MACs and bytes
    assert deeper.estimate.latency.ms > small.estimate.latency.ms


def test_hw_epoch_is_the_larger_of_compute_and_memory_plus_overhead():
    a = analyze(conv_chain(32, layers=1))
    model = latency_model(a.profile)
    conv = next(i for i, g in enumerate(a.estimate.groups) if "conv0" in g.nodes)
    macs = 32 * 32 * 16 * 16 * 9
    compute_ms = macs / model.v("macs_per_cycle") / (model.npu_mhz * 1e3)
    assert a.estimate.latency.epoch_ms[conv] >= compute_ms + model.v("hw_epoch_overhead_us") * 1e-3 - 1e-4


def test_activations_in_external_ram_are_slower():
    b = QDQ()
    x = b.input("x", [1, 16, 128, 128])
    y = b.raw_op("Conv", [x, b.weight("w", [16, 16, 1, 1])], name="conv")  # few MACs per byte moved
    b.output(y)
    model = b.model()
    from fixer.analysis import analyze_model

    prof = load_profile()
    tiny = [replace(p, size_bytes=16 * 1024) if p.on_chip else p for p in default_stm32n6_pools()]
    on_chip = analyze_model(model, profile=prof)
    spilled = analyze_model(model, profile=prof, pools=tiny)
    assert on_chip.memory.external_bytes == 0 and spilled.memory.external_bytes > 0
    assert spilled.estimate.latency.ms > on_chip.estimate.latency.ms


def test_sw_epochs_cost_by_kind_and_kernel():
    """A SW Softmax (transcendental) over the same elements costs more than a SW data movement."""
    prof = load_profile(core="2.0")
    model = latency_model(prof)
    assert model.sw_cycles["transcendental"]["float"] > model.sw_cycles["movement"]["int8"]
    b = QDQ()
    x = b.input("x", [1, 1000])
    y = b.op("Softmax", [x], name="sm", axis=1)
    b.output(y)
    a = analyze(b.model(), prof=prof)
    sw = [i for i, g in enumerate(a.estimate.groups) if g.unit != "HW"]
    assert sw and a.estimate.latency.sw_ms > 0
    per = model.sw_cycles["transcendental"]["int8"] * 1000 / (model.mcu_mhz * 1e6) * 1e3
    assert a.estimate.latency.epoch_ms[sw[0]] >= per


def test_clocks_are_data():
    a = analyze(conv_chain(32))
    model = latency_model(a.profile)
    slow = model.with_clocks(npu_mhz=model.npu_mhz / 2)
    from fixer.npu.latency import cost, epoch_work, memory_placement

    work = epoch_work(a.view, a.placement, a.estimate)
    base = cost(work, memory_placement(a.memory, default_stm32n6_pools(), model), model)
    half = cost(work, memory_placement(a.memory, default_stm32n6_pools(), slow), slow)
    assert base.ms == pytest.approx(a.estimate.latency.ms, rel=1e-6)
    assert half.ms > base.ms


def test_every_parameter_has_a_source():
    prof = load_profile()
    for p in latency_model(prof).params.values():
        assert p.source and p.tag in ("DOC", "OBS", "3P", "INF", "FIT"), p.name
        assert p.tag != "FIT" or p.fitted, p.name


def test_a_bad_latency_section_is_one_profile_error(tmp_path):
    data = yaml.safe_load((ROOT / "fixer" / "npu" / "profiles" / "stm32n6.yaml").read_text())
    bad = dict(data["latency"])
    bad["macs_per_cycle"] = {"value": "fast", "tag": "FIT", "source": "x"}
    with pytest.raises(ProfileError, match="latency.macs_per_cycle"):
        parse_latency(bad, "p.yaml")
    del bad["macs_per_cycle"]
    with pytest.raises(ProfileError, match="latency.macs_per_cycle"):
        parse_latency(bad, "p.yaml")


def test_audit_json_has_estimate_latency_and_epoch_ms(tmp_path, capsys):
    m = tmp_path / "chain.onnx"
    save(conv_chain(32), m)
    code, out, _ = run_cli(["audit", m, "-f", "json"], capsys)
    assert code in (0, 1)
    row = json.loads(out)["models"][0]
    assert row["estimate"]["latency_ms"] > 0
    assert all(e["ms"] > 0 for e in row["epochs"])
    assert row["estimate"]["latency"]["estimated"] is True


# ------------------------------------------------------------------------------ calibrate --times


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None


def test_calibrate_times_on_a_tiny_csv(tmp_path, capsys):
    save(conv_chain(16), tmp_path / "small.onnx")
    save(conv_chain(64), tmp_path / "large.onnx")
    a_small = analyze(conv_chain(16)).estimate.latency.ms
    a_large = analyze(conv_chain(64)).estimate.latency.ms
    csv = tmp_path / "times.csv"
    csv.write_text("model_name,model_file,inference_ms,core_version\n"
                   f"small,small.onnx,{a_small:.4f},4.0.1\n"
                   f"large,large.onnx,{a_large * 2:.4f},4.0.1\n"
                   "gone,,5.0,3.0.0\n"
                   "bound,small.onnx,>100,2.1.0\n", encoding="utf-8")
    rows = calibrate_times(csv)
    assert [r.status for r in rows] == ["ok", "ok", "no model", "no time"]
    assert rows[0].error == pytest.approx(0.0, abs=1e-3)
    assert rows[1].error == pytest.approx(-0.5, abs=1e-3)
    s = times_summary(rows)
    assert (s["estimated"], s["within_25pct"], s["without_model"]) == (2, 1, 2)
    assert s["median_abs_error"] == pytest.approx(0.25, abs=1e-3)
    code, out, _ = run_cli(["calibrate", "--times", csv], capsys)
    assert code == 0
    assert "| small |" in out and "-50%" in out and "1/2 models within ±25 %" in out
    code, out, _ = run_cli(["calibrate", "--times", csv, "-f", "json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["estimated"] is True and data["summary"]["within_25pct"] == 1
    assert [r["within"] for r in data["rows"][:2]] == [True, False]


def test_calibrate_times_errors(tmp_path, capsys):
    code, _, err = run_cli(["calibrate", "--times", tmp_path / "none.csv"], capsys)
    assert code == 2 and err.startswith("error:") and "none.csv" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n", encoding="utf-8")
    code, _, err = run_cli(["calibrate", "--times", bad], capsys)
    assert code == 2 and "model_file" in err
    code, _, err = run_cli(["calibrate"], capsys)
    assert code == 2 and "--times" in err


@needs_times
def test_calibrate_times_on_the_visible_published_set():
    """The issue's target on the visible published rows with model files (estimated, not measured)."""
    rows = calibrate_times(TIMES)
    s = times_summary(rows)
    assert s["estimated"] >= 15 and s["errors"] == 0
    assert s["within_25pct_share"] >= 0.80, s
    assert s["median_abs_error"] <= 0.15, s
    assert s["spearman"] >= 0.9, s


def test_a_times_csv_names_files_only_beside_it(tmp_path):
    """A row's model_file is looked for beside the CSV and in the folders above it, never at an absolute
    path or through '..' out of them (a CSV is data someone else published); a FIFO is never read."""
    import os

    outside = tmp_path / "outside"
    outside.mkdir()
    save(conv_chain(16), outside / "secret.onnx")
    inner = tmp_path / "a" / "b" / "c"
    inner.mkdir(parents=True)
    save(conv_chain(16), inner / "ok.onnx")
    os.mkfifo(inner / "fifo.onnx")
    csv = inner / "times.csv"
    csv.write_text("model_file,inference_ms\n"
                   f"{outside / 'secret.onnx'},1.0\n"
                   "../../outside/secret.onnx,1.0\n"  # from a/b it is tmp_path/outside/secret.onnx
                   "fifo.onnx,1.0\n"
                   "ok.onnx,1.0\n", encoding="utf-8")
    rows = calibrate_times(csv)
    assert [r.status for r in rows] == ["no model", "no model", "no model", "ok"]
