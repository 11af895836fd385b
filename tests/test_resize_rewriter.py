"""NAF003 bilinear-resize beyond the case file: the per-axis plans against the ONNX coordinate
formulas, every mode against onnxruntime's Resize, and the sample MoveNet-like models (placement and
numbers per rewritten Resize)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, utils

from fixer.api import analyze_model
from fixer.engine import run_engine
from fixer.npu.profile import load_profile
from fixer.rewriters.resize import AxisPlan, Inexact, plan_axis
from fixer.rules import load_rules
from fixer.gate import make_inputs, session
from tests.builders import resize as builders

ROOT = Path(__file__).resolve().parent.parent
PROFILE = load_profile()
RULE = next(r for r in load_rules() if r.id == "NAF003")


# ------------------------------------------------------------------------------ axis plans (exact)


def _onnx_matrix(mode: str, n: int, m: int, scale: float) -> np.ndarray:
    """The m x n linear map of one axis of ONNX Resize (linear), straight from the operator spec."""
    a = np.zeros((m, n))
    for o in range(m):
        if mode in ("half_pixel", "pytorch_half_pixel"):
            x = 0.0 if (mode == "pytorch_half_pixel" and m == 1) else (o + 0.5) / scale - 0.5
        elif mode == "asymmetric":
            x = o / scale
        else:  # align_corners
            x = 0.0 if m == 1 else o * (n - 1) / (m - 1)
        x = min(max(x, 0.0), n - 1)
        x0 = int(np.floor(x))
        x1 = min(x0 + 1, n - 1)
        w = x - x0
        a[o, x0] += 1 - w
        a[o, x1] += w
    return a


def _plan_matrix(p: AxisPlan) -> np.ndarray:
    """The same map as the plan builds it: replicate-pad, ConvTranspose(stride, kernel, pads), step."""
    padded = p.n + p.pad_begin + p.pad_end
    pad = np.zeros((padded, p.n))
    for j in range(padded):
        pad[j, min(max(j - p.pad_begin, 0), p.n - 1)] = 1
    k = np.array([float(Fraction(v, p.den)) for v in p.num])
    assert p.crop_end >= 0
    ct = np.zeros((p.full, padded))
    for r in range(p.full):
        for j in range(padded):
            u = r + p.crop_begin - p.stride * j
            if 0 <= u < len(k):
                ct[r, j] = k[u]
    return (ct @ pad)[:: p.step]


@pytest.mark.parametrize("mode", ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"])
def test_axis_plans_equal_the_onnx_formulas(mode):
    checked = 0
    for n in range(1, 14):
        for s in (1, 2, 3, 4, 5, 8):
            m = n * s
            try:
                p = plan_axis(mode, n, m, float(s), max_step=4)
            except Inexact:
                assert mode == "align_corners" and n > 1
                continue
            np.testing.assert_allclose(_plan_matrix(p), _onnx_matrix(mode, n, m, float(s)), atol=1e-12)
            checked += 1
        if mode == "align_corners" and n > 1:
            for k in (2, 3, 7, 16):  # the TensorFlow shapes out = k * (in - 1) + 1
                m = k * (n - 1) + 1
                p = plan_axis(mode, n, m, m / n, max_step=1)
                assert p.step == 1 and p.stride == k
                np.testing.assert_allclose(_plan_matrix(p), _onnx_matrix(mode, n, m, m / n), atol=1e-12)
                checked += 1
    assert checked > 40


def test_non_integer_and_wide_align_corners_are_inexact():
    with pytest.raises(Inexact, match="not an integer factor"):
        plan_axis("half_pixel", 6, 9, 1.5, max_step=4)
    with pytest.raises(Inexact, match=r"k\*\(in-1\)\+1 \(here 255, 382, 509"):
        plan_axis("align_corners", 128, 512, 4.0, max_step=4, axis="W")


# --------------------------------------------------------------------- every mode vs onnxruntime


def _fire(model: onnx.ModelProto):
    res = run_engine(model, [RULE], profile=PROFILE, guard=False)
    assert [c.rule for c in res.changes] == ["NAF003"], res.near_misses
    return res


def _outputs(model, feeds):
    s = session(model)
    names = [o.name for o in s.get_outputs()]
    return [s.run(names, f) for f in feeds]


@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"])
@pytest.mark.parametrize("hw,scale", [((5, 7), 2), ((6, 4), 3), ((3, 5), (2, 3)), ((1, 6), 4), ((7, 7), (4, 1))])
def test_float_modes_match_onnxruntime(ctm, hw, scale):
    kw = {}
    if ctm == "align_corners":  # use the shapes align_corners is exact for: out = k * (in - 1) + 1
        sh, sw = scale if isinstance(scale, tuple) else (scale, scale)
        kw["sizes"] = [sh * (hw[0] - 1) + 1 if hw[0] > 1 else sh, sw * (hw[1] - 1) + 1 if hw[1] > 1 else sw]
    model = builders.resize(c=3, hw=hw, scale=scale, ctm=ctm, **kw)
    res = _fire(model)
    feeds = make_inputs(model, seed=1, samples=2)
    for ref, got in zip(_outputs(model, feeds), _outputs(res.model, feeds)):
        a, b = ref[0], got[0]
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= 1e-5 * (a.max() - a.min())


def test_float_sizes_folded_from_static_shapes():
    # (not in the case file: in this float model the Shape node that disappears is what made the
    # estimate count an HW input copy, so the HW ratio of an all-SW model drops from 0.2 to 0)
    model = builders.resize_like(c=4, hw=(6, 5), factor=3)
    res = _fire(model)
    assert "sizes folded from static shapes" in res.changes[0].detail
    feeds = make_inputs(model, seed=2, samples=2)
    for ref, got in zip(_outputs(model, feeds), _outputs(res.model, feeds)):
        assert np.abs(ref[0] - got[0]).max() <= 1e-5 * (ref[0].max() - ref[0].min())


# ------------------------------------------------------------------------------- sample models


def test_core_2x_keeps_the_bilinear_resize_as_a_near_miss():
    """Core 2.x runs the DepthToSpace that lowers a strided ConvTranspose in SW (NEURAL_ART.md s7): the
    rewrite would swap a SW Resize for a SW DepthToSpace plus a HW epoch, so it does not apply."""
    model = onnx.load(str(ROOT / "sample_models" / "movenet_like.onnx"))
    old = load_profile(core="2.2")
    res = run_engine(model, [RULE], profile=old)
    assert res.changes == []
    reasons = {m.node: m.reason for m in res.near_misses}
    assert sorted(reasons) == ["resize_up1", "resize_up2", "resize_up3"]
    assert all("stedgeai core 2.2 lowers it with Concat + DepthToSpace, pure SW epochs" in r for r in reasons.values())
    assert all("--core 4.0 or later" in r for r in reasons.values())
    # 3.0 runs DepthToSpace as hybrid but no report shows its Concat (the zero insertion, SW in 2.2): SW, no gain
    assert not run_engine(model, [RULE], profile=load_profile(core="3.0")).changes
    assert run_engine(model, [RULE], profile=load_profile(core="4.0")).changes  # hybrid there: applies


def _resize_io(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """(Resize name, int8 tensor its DequantizeLinear reads, output of its QuantizeLinear)."""
    prod = {o: n for n in model.graph.node for o in n.output}
    out = []
    for n in model.graph.node:
        if n.op_type == "Resize":
            q = next(c for c in model.graph.node if c.op_type == "QuantizeLinear" and c.input[0] == n.output[0])
            out.append((n.name, prod[n.input[0]].input[0], q.output[0]))
    return out


def test_movenet_like_qdq_all_resizes_on_hw_within_one_lsb(tmp_path):
    model = onnx.load(str(ROOT / "sample_models" / "movenet_like.onnx"))
    before = analyze_model(model, profile=PROFILE)
    res = run_engine(model, [RULE], profile=PROFILE, guard=False)
    assert sorted(c.node for c in res.changes) == ["resize_up1", "resize_up2", "resize_up3"]
    after = analyze_model(res.model, profile=PROFILE)
    assert not [n for n in after.sw_nodes() if n["op_type"] == "Resize"]
    old_sw = {n["name"] for n in before.sw_nodes()}
    # the default core (4.0) lowers each stride-2 ConvTranspose with a zero-inserting Concat and a DepthToSpace,
    # hybrid epochs there
    new = [(n["op_type"], n["unit"], n["from_nodes"][0].split("__nafix")[0]) for n in after.sw_nodes()
           if n["name"] not in old_sw]
    assert sorted(new) == sorted([(op, "hybrid", f"resize_up{i}") for i in (1, 2, 3) for op in ("Concat", "DepthToSpace")])
    assert after.estimate.sw_epochs == before.estimate.sw_epochs - 3  # one SW epoch per bilinear Resize
    assert after.estimate.hybrid_ops == {"DepthToSpace": 3, "Concat": 3}
    assert after.estimate.hw_ratio > before.estimate.hw_ratio

    # Each rewritten Resize on the same int8 input as the original (real activations): within 1 LSB.
    names = [x for _, x, _ in _resize_io(model)]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for nme in names:
        probe.graph.output.append(helper.ValueInfoProto(name=nme))
    s = session(probe)
    acts = [dict(zip(names, s.run(names, f))) for f in make_inputs(model, seed=0, samples=3)]
    onnx.save(model, str(tmp_path / "a.onnx"))
    onnx.save(res.model, str(tmp_path / "b.onnx"))
    for name, x, y in _resize_io(model):
        utils.extract_model(str(tmp_path / "a.onnx"), str(tmp_path / "ea.onnx"), [x], [y])
        utils.extract_model(str(tmp_path / "b.onnx"), str(tmp_path / "eb.onnx"), [x], [y])
        sa, sb = session(onnx.load(str(tmp_path / "ea.onnx"))), session(onnx.load(str(tmp_path / "eb.onnx")))
        diffs = np.concatenate([
            (sa.run(None, {x: a[x]})[0].astype(int) - sb.run(None, {x: a[x]})[0].astype(int)).ravel() for a in acts])
        assert np.abs(diffs).max() <= 1, name
        assert np.mean(diffs == 0) > 0.98, name  # the rest are exact ties onnxruntime rounds either way


def test_movenet_like_float_within_tolerance():
    model = onnx.load(str(ROOT / "sample_models" / "movenet_like_float.onnx"))
    res = run_engine(model, [RULE], profile=PROFILE, guard=False)
    assert len(res.changes) == 3
    feeds = make_inputs(model, seed=0, samples=3)
    for ref, got in zip(_outputs(model, feeds), _outputs(res.model, feeds)):
        for a, b in zip(ref, got):
            assert np.abs(a - b).max() <= 1e-5 * (a.max() - a.min())


def test_rewrite_float_param_off_gives_a_near_miss():
    rule = type(RULE)(**{**RULE.__dict__, "params": {**RULE.params, "rewrite_float": False}})
    res = run_engine(builders.resize(c=4, hw=(5, 5)), [rule], profile=PROFILE, guard=False)
    assert not res.changes
    assert any("quantize the model first" in n.reason for n in res.near_misses)
