"""NAF018 (float constants of quantized ops quantized from their own values) and NAF019 (a pool's
output quantized before its reshape): the numerics of the rewrite, the plain fix reaching what
--quantize reaches, and the real models of ../shared (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from fixer.api import FixOptions, fix
from fixer.rewriters.constants import dequantized, symmetric_int8
from tests.builders import build

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MODELS = SHARED / "models"
needs_models = pytest.mark.skipif(not MODELS.is_dir(), reason="../shared/models is absent")


def test_one_value_per_channel_is_held_exactly():
    rng = np.random.default_rng(3)
    slope = (rng.random((16, 1, 1)) * 0.5 - 0.1).astype(np.float32)
    q, scale = symmetric_int8(slope, 0)
    assert q.dtype == np.int8 and scale.shape == (16,)
    assert set(np.abs(q).reshape(-1).tolist()) <= {127}
    # each value is +-127 steps of its own scale: float32 gives it back to within one ulp
    back = dequantized(q, scale, 0)
    assert np.all(np.abs(back - slope) <= np.spacing(np.abs(slope)))


def test_symmetric_int8_rounding_and_zero_channel():
    w = np.array([[1.0, -0.5, 0.25], [0.0, 0.0, 0.0]], np.float32)
    q, scale = symmetric_int8(w, 0)
    assert scale.tolist() == [pytest.approx(1 / 127), 1.0]  # an all-zero channel keeps scale 1
    assert q[0].tolist() == [127, -64, 32] and q[1].tolist() == [0, 0, 0]  # rint: -63.5 -> -64, 31.75 -> 32
    back = dequantized(q, scale, 0)
    assert np.abs(back - w).max() <= scale[0] / 2 + 1e-7


def _save(tmp_path: Path, model: onnx.ModelProto, name: str) -> Path:
    p = tmp_path / f"{name}.onnx"
    onnx.save(model, str(p))
    return p


def test_plain_fix_reaches_the_quantize_ratio_on_a_float_prelu_slope(tmp_path):
    """QDQ conv -> float PRelu slope -> QDQ: the plain fix quantizes the slope (NAF018) and reaches
    the HW ratio --quantize reaches, with outputs bit-identical to the input model's."""
    src = _save(tmp_path, build("constants.prelu_slope", {"slope": "channel"}), "prelu")
    plain = fix(src, FixOptions(dry_run=True))
    quant = fix(src, FixOptions(dry_run=True, quantize=True))
    assert [c.rule for c in plain.engine.changes] == ["NAF018"]
    assert plain.before.estimate.sw_epochs > 0
    assert plain.final.estimate.sw_epochs == 0
    assert plain.final.estimate.hw_ratio == pytest.approx(quant.final.estimate.hw_ratio)
    v = plain.verification
    assert v.ok and all(o.max_abs_error == 0.0 for o in v.outputs), v.as_dict()
    prelu = next(n for n in plain.engine.model.graph.node if n.op_type == "PRelu")
    dq = next(n for n in plain.engine.model.graph.node if n.output[0] == prelu.input[1])
    assert dq.op_type == "DequantizeLinear" and dq.doc_string == "nafix.rule=NAF018"


def test_a_weight_the_grid_cannot_hold_is_left_to_quantize(tmp_path):
    """Weights off the int8 grid by up to half a step: the worst case is more than an LSB at the output,
    so NAF018 declines (a near-miss naming the bound) and the model is not changed."""
    src = _save(tmp_path, build("constants.float_weight", {"on_grid": False, "noise": 0.5}), "w")
    r = fix(src, FixOptions(dry_run=True))
    assert not r.engine.changes
    near = [n for n in r.engine.near_misses if n.rule == "NAF018"]
    assert near and "LSB in the worst case" in near[0].reason and "--quantize" in near[0].reason


def test_pool_reshape_tail_is_bit_exact(tmp_path):
    src = _save(tmp_path, build("constants.pool_reshape"), "tail")
    r = fix(src, FixOptions(dry_run=True))
    assert [c.rule for c in r.engine.changes] == ["NAF019"]
    assert r.before.estimate.sw_epochs == 3 and r.final.estimate.sw_epochs == 0
    assert r.verification.ok and r.verification.contract.contract == "exact"
    assert all(o.max_abs_error == 0.0 for o in r.verification.outputs)


@needs_models
def test_mobilefacenet_perchannel_plain_fix_reaches_quantize():
    model = MODELS / "pele__mobilefacenet__PerChannel_quant.onnx"
    plain = fix(model, FixOptions(dry_run=True))
    quant = fix(model, FixOptions(dry_run=True, quantize=True))
    assert {c.rule for c in plain.engine.changes} == {"NAF018"} and len(plain.engine.changes) == 33
    assert plain.final.estimate.hw_ratio == pytest.approx(quant.final.estimate.hw_ratio)
    assert plain.final.estimate.sw_epochs == 0
    assert plain.verification.ok
    assert all(o.max_abs_error == 0.0 for o in plain.verification.outputs), plain.verification.as_dict()


@needs_models
def test_mobilenet_v2_tail_becomes_hw_bit_exact():
    r = fix(MODELS / "magnus__mobilenet_v2_224_int8.onnx", FixOptions(dry_run=True))
    assert [c.rule for c in r.engine.changes] == ["NAF019"]
    assert r.before.estimate.sw_epochs == 3 and r.final.estimate.sw_epochs == 0
    assert r.verification.ok and all(o.max_abs_error == 0.0 for o in r.verification.outputs)
