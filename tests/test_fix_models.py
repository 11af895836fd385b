"""`nafix fix` end to end: the committed samples reach what their real counterparts need, and on the
real third-party models nafix never crashes, never exceeds a contract and never lowers the HW ratio."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fixer.api import AnalysisOptions, FixOptions, fix

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
SHARED_MODELS = ROOT.parent / "shared" / "models"


#: stedgeai told to keep float graph edges (as MobileFaceNet's report was built): their conversions are SW
#: epochs; with its default options an ONNX QDQ model's edges become int8 by themselves (NEURAL_ART.md s7)
FLOAT_IO = frozenset({"--input-data-type float32", "--output-data-type float32"})


def _fix(tmp_path, name, **opts):
    src = tmp_path / f"{name}.onnx"
    shutil.copy(SAMPLES / f"{name}.onnx", src)
    return fix(src, FixOptions(**opts))


def test_denoiser_every_257_channel_layer_split_bit_exact(tmp_path):
    r = _fix(tmp_path, "denoiser_257", analysis=AnalysisOptions(stedgeai_options=FLOAT_IO))
    split = {c.node for c in r.engine.changes if c.rule == "NAF001"}
    assert split == {"conv_in", "conv_skip", "gemm_mask"}
    assert r.verified and r.written
    checks = r.verification.boundaries
    assert len(checks) == 3 and all(c.max_abs_error == 0 and c.bit_exact_fraction == 1.0 for c in checks)
    assert all(o.max_abs_error == 0 for o in r.verification.outputs)
    after = r.final
    assert not [n for n in after.placement.nodes
                if any(x.constraint == "awkward_output_channels" for x in n.reasons)]
    # what stays SW is the ONNX LSTM (not on the NPU) and its two conversions, the re-quantize one SW epoch per
    # reader (gemm_mask's two chunks; yolov8n micro 4.0.1, OBS); the int8 Concats of the unequal chunks
    # (136 + 121) are hybrid epochs on core 4.0 (yolov8n micro 4.0.1, OBS)
    assert sorted(n.op_type for n in after.placement.sw_nodes() if n.op_type != "Concat") == [
        "DequantizeLinear", "LSTM", "QuantizeLinear"]
    assert r.before.estimate.sw_epochs == 8 and after.estimate.sw_epochs == 4
    assert dict(after.estimate.hybrid_ops) == {"Concat": 3}


def test_movenet_like_reaches_all_hw_within_one_lsb_per_resize(tmp_path):
    r = _fix(tmp_path, "movenet_like", analysis=AnalysisOptions(stedgeai_options=FLOAT_IO))
    rules = sorted({c.rule for c in r.engine.changes})
    assert rules == ["NAF003", "NAF004", "NAF005"]
    assert sum(c.rule == "NAF003" for c in r.engine.changes) == 3
    assert r.before.estimate.sw_epochs == 5
    # core 4.0 (default): no SW epoch left; each ConvTranspose's zero-inserting Concat and DepthToSpace are
    # hybrid epochs (PP-OCRv4 det c_info; Concat hybrid in 4.0: yolov8n micro 4.0.1)
    assert r.final.estimate.sw_epochs == 0 and r.final.estimate.hw_ratio == 1.0
    assert r.final.estimate.hybrid_ops == {"Concat": 3, "DepthToSpace": 3}
    assert r.verified
    resize = [c for c in r.verification.boundaries if "NAF003" in c.name]
    assert len(resize) == 3
    for c in resize:  # each Resize on its own: within 1 LSB, nearly all bit-exact
        assert c.max_abs_error <= 1 and c.bit_exact_fraction > 0.95
    (out,) = r.verification.outputs
    assert out.name == "heatmaps" and out.cosine > 0.999
    report = json.loads(r.report_path.read_text())
    io = report["io"]
    assert io["inputs"][0]["dtype"] == "int8" and io["inputs"][0]["scale"] > 0
    assert io["outputs"][0]["dtype"] == "int8" and io["outputs"][0]["zero_point"] is not None
    header = r.header_path.read_text()
    assert "NAFIX_IN_IMAGE_SCALE" in header and "NAFIX_OUT_HEATMAPS_ZERO_POINT" in header


def test_fix_console_lists_the_hybrid_epochs_that_remain(tmp_path):
    """The epochs the compiler inserts when lowering a rewritten node (here each ConvTranspose's
    DepthToSpace, hybrid in core 4.0) are listed under their unit with the lowering as the reason."""
    from fixer.report import fix_renderables

    r = _fix(tmp_path, "movenet_like", dry_run=True)
    text = "\n".join(str(x) for x in fix_renderables(r))
    assert "SW and hybrid epochs that remain (0 SW, 6 hybrid; estimated):" in text
    assert "hybrid x3: stedgeai lowers the node with an inserted DepthToSpace epoch [OBS]" in text
    assert "hybrid x3: stedgeai lowers the node with an inserted Concat epoch [OBS]" in text
    for k in (1, 2, 3):
        assert f"stedgeai lowers 'resize_up{k}__nafix_" in text


def test_movenet_like_uint8_camera_input(tmp_path):
    r = _fix(tmp_path, "movenet_like", input_type="uint8", analysis=AnalysisOptions(stedgeai_options=FLOAT_IO))
    assert r.verified
    (ch,) = [c for c in r.engine.io_changes if c.kind == "input"]
    assert ch.dtype == "uint8" and ch.zero_point == 0  # int8 zero-point -128 shifted by 128


def test_movenet_like_float_never_worse_and_rewrites_within_1e5(tmp_path):
    """Without --quantize a float model keeps every op in SW: the Resize rewrites would only add SW
    epochs, so they are near-misses that point at --quantize, and the estimate does not get worse.
    The rewrites themselves (as --quantize runs them, unguarded) stay within 1e-5."""
    from fixer.engine import FLOAT_GUARD_REASON, run_engine
    from fixer.rules import load_rules
    from fixer.gate import verify

    r = _fix(tmp_path, "movenet_like_float", select=("NAF003",))
    assert not r.engine.changes and not r.written
    near = [n for n in r.engine.near_misses if n.rule == "NAF003"]
    assert len(near) == 3 and all(n.reason == FLOAT_GUARD_REASON for n in near)
    assert r.final.estimate.sw_epochs <= r.before.estimate.sw_epochs
    assert r.final.estimate.epochs <= r.before.estimate.epochs
    assert len(r.advice) == 1 and "--quantize" in r.advice[0]
    rule = [x for x in load_rules() if x.id == "NAF003"]
    model = r.before.loaded.model
    res = run_engine(model, rule, profile=r.before.profile, guard=False)
    assert sum(c.rule == "NAF003" for c in res.changes) == 3
    v = verify(model, res.model, contract=rule[0].verify, rules=["NAF003"])
    (out,) = v.outputs
    assert v.ok and out.max_abs_error <= 1e-5  # sigmoid heatmaps: range 1


def test_classifier_softmax_opt_in_ranking(tmp_path):
    plain = _fix(tmp_path, "classifier_softmax", dry_run=True)
    assert "NAF012" not in {c.rule for c in plain.engine.changes}, "trailing Softmax removal is opt-in"
    r = _fix(tmp_path, "classifier_softmax", select=("NAF012", "NAF004", "NAF005"))
    assert r.verified and r.verification.contract.contract == "ranking"
    assert r.final.estimate.sw_epochs == 0
    assert any("logits" in c.detail for c in r.engine.changes if c.rule == "NAF012")


REAL = sorted(SHARED_MODELS.glob("*.onnx")) if SHARED_MODELS.is_dir() else []


@pytest.mark.skipif(not REAL, reason="../shared/models is absent")
@pytest.mark.parametrize("model", REAL, ids=[p.name for p in REAL])
def test_real_model_fix_never_crashes_nor_exceeds_contracts(model):
    r = fix(model, FixOptions(dry_run=True))
    assert not r.written and r.report_path is None, "a dry run writes nothing"
    assert r.final.estimate.hw_ratio >= r.before.estimate.hw_ratio - 1e-9
    assert not r.warnings
    if r.engine.changes:
        assert r.verification is not None and r.verification.ok, r.verification.as_dict()
        for o in r.verification.outputs:
            assert np.isfinite(o.max_abs_error)
