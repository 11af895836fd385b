"""Honest, short verdicts of `nafix MODEL` (issue 36): a caution when a verdict on random inputs
accepted outputs that moved a lot, --min-cosine for --quantize, FAILED saying what failed, grouped
quantization problems, --dry-run saying "would", and the JSON `io` carrying the header's parameters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from fixer.api import FixOptions, fix
from fixer.cli import main
from fixer.gate.check import LARGE_MOVE_COSINE, caution_text, large_moves
from fixer.gate.metrics import OutputCheck
from fixer.quantize.flow import QUANT_FAIL_COSINE
from fixer.report import grouped_problems
from tests.builders import build
from tests.test_engine import _relu_model, rules_dir  # noqa: F401 - the fixture and its test rules

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
needs_models = pytest.mark.skipif(not MODELS.is_dir(), reason="../shared/models is absent")


def _check(name: str, ok: bool = True, err: float = 1.0, noise: bool = True) -> OutputCheck:
    return OutputCheck(name, ok, err, 0.0, 0.0, 0.5, None, "detail", {"accepted": True} if noise else None)


def test_large_moves_names_outputs_that_moved_and_only_those():
    rng = np.random.default_rng(0)
    heat = rng.random((1, 8, 8, 4)).astype(np.float32)
    moved = rng.random((1, 8, 8, 4)).astype(np.float32)  # unrelated values: low cosine, argmax moved
    close = heat + np.float32(1e-4)
    values = {"moved": [(heat, moved)], "close": [(heat, close)], "failed": [(heat, moved)]}
    checks = [_check("moved"), _check("close", noise=False), _check("failed", ok=False)]
    out = large_moves(checks, values)
    assert len(out) == 1 and out[0].startswith("'moved' (cosine ") and "accepted against the noise floor" in out[0]
    assert "argmax changed on" in out[0]
    text = caution_text(out, 3)
    assert "3 seeded random input set(s)" in text and "--inputs FILE.npz" in text
    assert LARGE_MOVE_COSINE == 0.95


@needs_models
def test_movenet_verdict_on_random_inputs_says_so_and_not_with_inputs(tmp_path):
    """MoveNet's bilinear Resize rewrites: heatmaps move (cosine ~0.87, argmax on ~54 %), accepted against
    the noise floor. On random inputs that is said, with --inputs; on the user's inputs it is not."""
    model = MODELS / "tfl2onnx-stn6__st_movenet_lightning_heatmaps_192_int8_pc.onnx"
    r = fix(model, FixOptions(dry_run=True))
    v = r.verification
    assert v.ok and v.inputs == "random"
    assert v.caution and "moved a lot" in v.caution and "--inputs" in v.caution
    assert v.as_dict()["caution"] == v.caution
    name = model.with_suffix("").name
    inputs = tmp_path / "in.npz"
    rng = np.random.default_rng(5)
    m = onnx.load(str(model), load_external_data=False)
    i = m.graph.input[0]
    shape = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
    np.savez(inputs, **{i.name: rng.integers(0, 256, shape).astype(dtype)})  # (a uint8 image input)
    r2 = fix(model, FixOptions(dry_run=True, inputs_npz=str(inputs)))
    assert r2.verification.inputs == "npz" and r2.verification.caution is None, name


def test_failed_says_what_failed(tmp_path, rules_dir, capsys):  # noqa: F811
    src = _relu_model(tmp_path / "m.onnx")
    res = fix(src, FixOptions(rules_dirs=(str(rules_dir),), select=("TST902",), dry_run=True))
    failure = res.verification.failure()
    assert failure.startswith("output 'y': max abs error") and "bit-exact required" in failure
    with pytest.raises(SystemExit) as exc:
        main(["fix", str(src), "--rules", str(rules_dir), "--select", "TST902"])
    assert exc.value.code == 1
    cap = capsys.readouterr()
    line = next(ln for ln in cap.out.splitlines() if ln.startswith("verification:"))
    assert line.startswith("verification: FAILED: output 'y': max abs error") and "(required: bit-exact;" in line
    errors = [ln for ln in cap.err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "output 'y'" in errors[0] and "nothing written" in errors[0]


def test_dry_run_says_would_and_nothing_written(tmp_path, rules_dir, capsys):  # noqa: F811
    src = _relu_model(tmp_path / "m.onnx")
    with pytest.raises(SystemExit) as exc:
        main(["fix", str(src), "--rules", str(rules_dir), "--select", "TST901", "--dry-run"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "changes nafix would make (1; --dry-run)" in out
    assert "dry run: nothing written" in out and "wrote " not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "myrules"]
    with pytest.raises(SystemExit):
        main(["fix", str(src), "--rules", str(rules_dir), "--select", "TST901"])
    out = capsys.readouterr().out
    assert "changes nafix would make" not in out and "nothing written" not in out and "wrote " in out


def test_grouped_problems_one_line_with_a_count():
    per_tensor = [f"the weight 'w{i}' of 'conv{i}' (Conv) is quantized per tensor, not per channel" for i in range(33)]
    other = ["'q' uses a uint8 zero-point"]
    out = grouped_problems(per_tensor[:20] + other + per_tensor[20:])
    assert [c for _, c in out] == [33, 1]
    assert out[0][0] == (f"{per_tensor[0]} (x33: 32 more like it, each in the JSON report)")
    assert out[1][0] == other[0]


def _copy(tmp_path: Path, name: str) -> Path:
    p = tmp_path / f"{name}.onnx"
    shutil.copy(SAMPLES / f"{name}.onnx", p)
    return p


def test_min_cosine_refuses_a_quantized_model_below_it(tmp_path, capsys):
    src = _copy(tmp_path, "classifier_softmax_float")
    probe = fix(src, FixOptions(quantize=True, dry_run=True))
    cos = min(o["cosine"] for o in probe.quantization["outputs"])
    assert QUANT_FAIL_COSINE <= cos < 1.0  # the default accepts it; a threshold above it must refuse it
    assert probe.accuracy_failure is None
    limit = f"{(cos + 1.0) / 2:.12f}"
    with pytest.raises(SystemExit) as exc:
        main(["fix", str(src), "--quantize", "--min-cosine", limit])
    assert exc.value.code == 1
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "below --min-cosine" in errors[0] and "nothing written" in errors[0]
    assert not (tmp_path / "classifier_softmax_float.nafix.onnx").exists()
    # --keep-failed writes it, marked
    with pytest.raises(SystemExit) as exc:
        main(["fix", str(src), "--quantize", "--min-cosine", limit, "--keep-failed"])
    assert exc.value.code == 1
    written = tmp_path / "classifier_softmax_float.nafix.onnx"
    meta = {p.key: p.value for p in onnx.load(str(written)).metadata_props}
    assert meta["nafix.accuracy"].startswith("NO (written with --keep-failed)")
    report = json.loads((tmp_path / "classifier_softmax_float.nafix.json").read_text())
    assert "below --min-cosine" in report["accuracy_failure"] and report["written"] is True
    assert "written anyway with --keep-failed" in capsys.readouterr().err


def test_json_io_carries_the_header_scale_and_zero_point(tmp_path):
    """NAF004 moves a Transpose onto the int8 output: no QuantizeLinear is left at the edge, yet the JSON
    `io` row has the scale and zero-point the .h defines."""
    src = tmp_path / "m.onnx"
    onnx.save(build("qdq.output_dq", {"via": "transpose"}), str(src))
    r = fix(src, FixOptions())
    assert r.written and r.header_path is not None
    report = json.loads(r.report_path.read_text())
    row = next(o for o in report["io"]["outputs"] if o["name"] == "out")
    header = r.header_path.read_text()
    assert row["dtype"] == "int8" and row["scale"] is not None
    assert f"#define NAFIX_OUT_OUT_SCALE {row['scale']!r}f" in header
    assert f"#define NAFIX_OUT_OUT_ZERO_POINT ({row['zero_point']})" in header
