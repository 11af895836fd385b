"""`nafix MODEL --quantize`: float models in, NPU-ready int8 out; uint8 models converted; QDQ input-channel
splits calibrated; the accuracy cost reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from fixer.api import FixOptions, fix
from fixer.cli import main
from fixer.quantize import CalibrationOptions, check_npu_quantization, float_islands
from tests.builders import build

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"


def _copy(tmp_path, name) -> Path:
    p = tmp_path / f"{name}.onnx"
    shutil.copy(SAMPLES / f"{name}.onnx", p)
    return p


def test_float_denoiser_becomes_int8_keeping_its_lstm_where_unrolling_is_estimated_slower(tmp_path):
    """--quantize unrolls the LSTM (NAF016) before quantizing, then holds it to the never-worse guard
    once quantized: here the unrolled cells are estimated slower than the LSTM left in SW (issue 35,
    item 3), so the model is quantized without them and the LSTM's rewrite is a near-miss with both
    estimated times; the 257-channel splits stay."""
    from fixer.report_data import fix_dict, near_misses

    r = fix(_copy(tmp_path, "denoiser_257_float"), FixOptions(quantize=True))
    assert r.written and r.verified
    m = onnx.load(str(r.output))
    assert check_npu_quantization(m, allow_uint8_io=False) == []  # int8 everywhere, symmetric per-channel weights
    assert not any(onnx.helper.tensor_dtype_to_np_dtype(t.data_type) == np.uint8 for t in m.graph.initializer)
    islands = float_islands(m)
    assert islands and all("lstm" in " ".join(i["reasons"]) for i in islands)  # the LSTM's conversions alone
    q = r.quantization
    assert q["input_kind"] == "float" and q["calibration"] == "random"
    assert all(o["cosine"] >= 0.99 for o in q["outputs"]) and q["worst_tensors"]
    applied = {c["rule"] for c in q["float_rewrites"]["changes"]}
    assert "NAF001" in applied and "NAF016" not in applied  # 257-channel splits kept, the unrolling refused
    [refused] = [n for n in near_misses(r) if n.rule == "NAF016"]
    assert refused.ms_after > refused.ms_before
    assert refused.ms_before == pytest.approx(r.final.estimate.latency_ms, abs=1e-3)
    assert f"{refused.ms_after:.3f} ms, without them at {refused.ms_before:.3f} ms" in refused.reason
    assert r.final.estimate.latency_ms < r.before.estimate.latency_ms
    assert [x["rule"] for x in q["float_rewrites_refused"]] == ["NAF016"]
    assert any("RANDOM" in w or "random" in w for w in r.warnings)
    report = json.loads(r.report_path.read_text())
    assert set(report["quantization"]) >= {"calibration", "outputs", "worst_tensors"}
    assert [n["rule"] for n in fix_dict(r)["near_misses"]][0] == "NAF016"


def test_calibration_from_an_npz_folder(tmp_path):
    model = _copy(tmp_path, "classifier_softmax_float")
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(1)
    for i in range(5):
        np.savez(calib / f"s{i}.npz", image=rng.random((1, 3, 64, 64), dtype=np.float32))
    r = fix(model, FixOptions(quantize=True, calib=CalibrationOptions(path=str(calib)), dry_run=True))
    assert r.quantization["calibration"] == "npz" and r.quantization["samples"] == 5
    assert not any("random" in w.lower() for w in r.warnings)


def test_uint8_model_converted_exactly_and_fixed(tmp_path):
    r = fix(_copy(tmp_path, "uint8_default_quant"), FixOptions(quantize=True))
    assert r.written and r.verified
    assert not [f for f in r.final.findings if f.constraint == "int8_activations"]
    assert any(f.constraint == "int8_activations" for f in r.before.findings)
    (out,) = r.quantization["outputs"]
    assert out["max_abs_error"] == 0.0  # activations shifted by 128 with the same scale: exact
    assert r.final.estimate.sw_epochs == 0


def test_input_channel_split_applies_to_qdq_models_with_accuracy(tmp_path):
    p = tmp_path / "cin257.onnx"
    onnx.save(build("channels.conv_in", {"cin": 257, "qdq": True}), str(p))
    plain = fix(p, FixOptions(select=("NAF002",), dry_run=True))
    assert not plain.engine.changes and "nafix --quantize" in plain.engine.near_misses[0].reason
    r = fix(p, FixOptions(select=("NAF002",), quantize=True, dry_run=True))
    changes = r.quantization["float_rewrites"]["changes"]
    assert [c["rule"] for c in changes] == ["NAF002"] and "136 + 121" in changes[0]["detail"]
    (out,) = r.quantization["outputs"]
    assert 0.999 <= out["cosine"] < 1.0 or out["max_abs_error"] > 0  # reported, and it did change numerics
    assert float_islands(r.engine.model) == []


def test_calib_without_quantize_is_a_usage_error(tmp_path, capsys):
    p = _copy(tmp_path, "classifier_softmax_float")
    with pytest.raises(SystemExit) as exc:
        main(["fix", str(p), "--calib", str(tmp_path)])
    assert exc.value.code == 2 and "--calib needs --quantize" in capsys.readouterr().err


def test_the_denoiser_quantized_with_onnxruntime_defaults_is_converted_and_fixed(tmp_path):
    """The float sample (a) quantized by onnxruntime's defaults (uint8 activations, which stedgeai
    rejects): --quantize converts it to int8, quantizes the float LSTM island and fixes the rest."""
    from onnxruntime.quantization import CalibrationDataReader, quantize
    from onnxruntime.quantization import get_qdq_config as qdq_config

    src = SAMPLES / "denoiser_257_float.onnx"
    rng = np.random.default_rng(0)
    data = [{"spec": np.abs(rng.standard_normal((1, 257, 1, 8))).astype(np.float32)} for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

    default_q = tmp_path / "denoiser_ort_default.onnx"
    quantize(str(src), str(default_q), qdq_config(onnx.load(str(src)), Reader()))
    m = onnx.load(str(default_q))
    m.ir_version = min(m.ir_version, 10)
    onnx.save(m, str(default_q))
    r = fix(default_q, FixOptions(quantize=True))
    assert any(f.constraint == "int8_activations" for f in r.before.findings)
    assert r.quantization["input_kind"] == "uint8" and r.written and r.verified
    out = onnx.load(str(r.output))
    assert not [f for f in r.final.findings if f.constraint == "int8_activations"]
    assert float_islands(out) == []
    assert r.final.estimate.sw_epochs == 0
    assert all(o["cosine"] >= 0.99 for o in r.quantization["outputs"])


SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "models"
# a spread of real models, each a different --quantize path (float + LSTM, uint8 TFLite, QOperator
# with float PRelu, ORT QDQ with float PRelu slopes, ST export); gtcrn's 14 GRUs take minutes and are
# left to scripts, not to the test suite
REAL_QUANTIZE = ["dtln__model_1.onnx", "tenvad__ten-vad.onnx", "tfl2onnx-coral__mobilenet_v1_0.25_128_quant.onnx",
                 "pele__mobilefacenet_int8_faces.onnx", "pele__mobilefacenet__PerChannel_quant.onnx",
                 "pele__MediaPipeFaceLandmarkDetector_OE_3_2_0.onnx", "stzoo__yunetn_320_qdq_int8.onnx"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is absent")
@pytest.mark.parametrize("name", REAL_QUANTIZE)
def test_real_models_quantize_without_losing_hw_epochs(name):
    r = fix(SHARED / name, FixOptions(quantize=True, dry_run=True))
    assert r.verified
    assert r.final.estimate.hw_ratio >= r.before.estimate.hw_ratio - 1e-9
    assert not any("nafix bug" in w for w in r.warnings)
    if "OE" in name:
        assert r.quantization is None and any("--quantize skipped" in w for w in r.warnings)
    else:
        assert r.quantization is not None and r.quantization["outputs"]
