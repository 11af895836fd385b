"""Direct tests of the channels family (NAF001 split-output-channels, NAF002 split-input-channels,
NAF011 gemm-dynamic-bias) beyond the data-first case files: chunk arithmetic, the pad strategy, the
committed denoiser sample models, and bit-exactness under onnxruntime's default graph optimizations too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fixer.api import analyze_model
from fixer.engine import run_engine
from fixer.npu.constraints import channel_split_ok
from fixer.npu.profile import load_profile
from fixer.rewriters import REWRITERS, load_all
from fixer.rewriters.channels import chunk_sizes, padded_count
from fixer.rules import VerifyContract, load_rules
from fixer.gate import make_inputs, verify
from tests.builders import build

ROOT = Path(__file__).resolve().parents[1]
PROFILE = load_profile()
RULES = {r.id: r for r in load_rules()}
EXACT = VerifyContract("exact")


def _rule(rid: str, **params):
    r = RULES[rid]
    return dataclasses.replace(r, params={**r.params, **params}) if params else r


def _primes(lo: int, hi: int) -> list[int]:
    return [n for n in range(lo, hi) if n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))]


# --------------------------------------------------------------------------------------- chunks


@pytest.mark.parametrize("total,align,want", [
    (257, 8, [136, 121]),     # the published 136-wide chunks
    (257, 1, [129, 128]),     # balanced
    (149, 8, [80, 69]),
    (145, 8, [80, 65]),
    (1009, 8, [128] * 7 + [113]),
    (144, 8, [144]),
    (100, 8, [100]),
])
def test_chunk_sizes(total, align, want):
    assert chunk_sizes(total, 144, align=align) == want


def test_chunk_sizes_groups():
    # depthwise 257 channels: units are groups of one channel each
    assert chunk_sizes(257, 144, unit=1) == [136, 121]
    # 3 channels per group: at most 48 groups (144 channels) per chunk
    sizes = chunk_sizes(97, 144, unit=3)
    assert sum(sizes) == 97 and all(s * 3 <= 144 for s in sizes)
    with pytest.raises(ValueError):
        chunk_sizes(2, 144, unit=200)


@pytest.mark.parametrize("align", [1, 8, 16])
def test_every_chunk_passes_the_constraint(align):
    for c in list(range(1, 600)) + _primes(600, 5000):
        sizes = chunk_sizes(c, 144, align=align)
        assert sum(sizes) == c
        assert len(sizes) == -(-c // 144), c  # the fewest chunks possible
        assert all(0 < s <= 144 and channel_split_ok(s, 144) for s in sizes), (c, sizes)


def test_padded_count():
    assert padded_count(257, 144) == 258
    assert padded_count(149, 144) == 150
    assert padded_count(256, 144) == 256
    for p in _primes(145, 3000):
        q = padded_count(p, 144)
        assert q > p and channel_split_ok(q, 144)


def test_rewriters_registered_with_docstrings():
    load_all()
    for name in ("split_output_channels", "split_input_channels", "unfuse_gemm_bias"):
        assert name in REWRITERS and len(REWRITERS[name].doc) > 80


# --------------------------------------------------------------------------------------- helpers


def _session(model: onnx.ModelProto, level):
    o = ort.SessionOptions()
    o.log_severity_level = 3
    o.graph_optimization_level = level
    return ort.InferenceSession(model.SerializeToString(), o, providers=["CPUExecutionProvider"])


def _max_diff(a: onnx.ModelProto, b: onnx.ModelProto, samples: int, level) -> float:
    sa, sb = _session(a, level), _session(b, level)
    worst = 0.0
    for feed in make_inputs(a, seed=1, samples=samples):
        for x, y in zip(sa.run(None, feed), sb.run(None, feed)):
            worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y))))
    return worst


def _sw_nodes(model):
    return [n for n in analyze_model(model, profile=PROFILE).placement.nodes if n.unit == "SW"]


# --------------------------------------------------------------------------------------- denoiser


def test_denoiser_qdq_every_257_output_layer_split_bit_exact():
    model = onnx.load(str(ROOT / "sample_models" / "denoiser_257.onnx"))
    res = run_engine(model, [RULES["NAF001"]], profile=PROFILE, guard=False)
    assert sorted(c.node for c in res.changes) == ["conv_in", "conv_skip", "gemm_mask"]
    assert all("136 + 121" in c.detail for c in res.changes)
    onnx.checker.check_model(res.model, full_check=True)
    v = verify(model, res.model, contract=EXACT, samples=24, seed=3)
    assert v.ok, v.as_dict()
    # also bit-exact after onnxruntime's basic graph optimizations (not compared with its fused QDQ kernels,
    # which saturate on CPUs without VNNI: see the docstring of test_qdq_ops_rewriters)
    assert _max_diff(model, res.model, 24, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC) == 0.0
    after = _sw_nodes(res.model)
    assert not any(r.constraint == "awkward_output_channels" for n in after for r in n.reasons)
    before_sw = analyze_model(model, profile=PROFILE).estimate.sw_epochs
    after_est = analyze_model(res.model, profile=PROFILE).estimate
    # 3 SW layers go; the LSTM output's re-quantize now has two readers (gemm_mask's two chunks): one SW
    # QuantizeLinear epoch per reader (yolov8n micro 4.0.1, OBS); each unequal-width Concat (136 + 121) is a
    # hybrid epoch on core 4.0 (yolov8n micro 4.0.1, OBS)
    assert after_est.sw_epochs == before_sw - 3 + 1
    assert after_est.sw_ops["QuantizeLinear"] == 2 and dict(after_est.hybrid_ops) == {"Concat": 3}


def test_denoiser_qdq_pad_strategy_bit_exact():
    model = onnx.load(str(ROOT / "sample_models" / "denoiser_257.onnx"))
    res = run_engine(model, [_rule("NAF001", strategy="pad")], profile=PROFILE, guard=False)
    assert len(res.changes) == 3 and all("from 257 to 258" in c.detail and "2 chunks of 129" in c.detail for c in res.changes)
    v = verify(model, res.model, contract=EXACT, samples=24, seed=4)
    assert v.ok, v.as_dict()
    assert not any(r.constraint == "awkward_output_channels" for n in _sw_nodes(res.model) for r in n.reasons)


def test_denoiser_float_split_within_tolerance():
    model = onnx.load(str(ROOT / "sample_models" / "denoiser_257_float.onnx"))
    res = run_engine(model, [RULES["NAF001"]], profile=PROFILE, guard=False)
    assert sorted(c.node for c in res.changes) == ["conv_in", "conv_skip", "gemm_mask"]
    v = verify(model, res.model, contract=VerifyContract("tolerance", 1e-5, 0.0), samples=24, seed=5)
    assert v.ok, v.as_dict()


def test_denoiser_257_input_layer_is_a_note_not_sw():
    model = onnx.load(str(ROOT / "sample_models" / "denoiser_257.onnx"))
    p = analyze_model(model, profile=PROFILE).placement.by_name["conv_down"]
    assert p.unit == "HW"
    assert [r.constraint for r in p.notes if r.constraint == "awkward_input_channels"] == ["awkward_input_channels"]
    # NAF002 (opt-in, float only) is a near-miss on the quantized model
    res = run_engine(model, [RULES["NAF002"]], profile=PROFILE, guard=False)
    assert not res.changes and any(n.node == "conv_down" for n in res.near_misses)


def test_denoiser_float_input_split():
    model = onnx.load(str(ROOT / "sample_models" / "denoiser_257_float.onnx"))
    res = run_engine(model, [RULES["NAF002"]], profile=PROFILE, guard=False, max_rounds=1)
    assert {c.node for c in res.changes} == {"conv_in", "conv_skip", "conv_down"}
    v = verify(model, res.model, contract=RULES["NAF002"].verify, samples=24, seed=6)
    assert v.ok, v.as_dict()


# --------------------------------------------------------------------------------------- QDQ structure


@pytest.mark.parametrize("builder,params", [
    ("channels.conv", {"cout": 257, "k": 3, "qdq": True}),
    ("channels.gemm", {"qdq": True}),
    ("channels.matmul", {"qdq": True}),
    ("channels.conv_transpose", {"qdq": True}),
    ("channels.conv", {"cin": 257, "cout": 257, "group": 257, "k": 3, "qdq": True}),
])
@pytest.mark.parametrize("strategy", ["split", "pad"])
def test_qdq_split_is_bit_exact_and_keeps_output_quantization(builder, params, strategy):
    model = build(builder, params)
    res = run_engine(model, [_rule("NAF001", strategy=strategy)], profile=PROFILE, guard=False)
    if strategy == "pad" and params.get("group"):
        assert not res.changes and "grouped Conv" in res.near_misses[0].reason
        return
    assert len(res.changes) == 1
    v = verify(model, res.model, contract=EXACT, samples=24, seed=7)
    assert v.ok, v.as_dict()
    # every new QuantizeLinear reuses the original output's scale and zero-point
    orig_q = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0].endswith("_QuantizeLinear_Input")]
    new_q = [n for n in res.model.graph.node if n.op_type == "QuantizeLinear" and n.name in res.provenance]
    out_q = [n for n in new_q if n.input[1] == orig_q[0].input[1]]
    assert out_q and all(n.input[2] == orig_q[0].input[2] for n in out_q)
    # no float tensor between quantized ops: the only SW-placed node the split adds is the int8 Concat of its
    # unequal chunks, a hybrid epoch on core 4.0 (concat_equal_inputs; yolov8n micro 4.0.1, OBS)
    after = _sw_nodes(res.model)
    concat = [n for n in after if [r.constraint for r in n.reasons] == ["concat_equal_inputs"]]
    assert all(n.op_type == "Concat" and n.kernel == "int8" for n in concat)
    assert len(after) - len(concat) == len(_sw_nodes(model)) - 1
    est = analyze_model(res.model, profile=PROFILE).estimate
    # (a ConvTranspose's lowering adds a zero-inserting Concat of its own, hybrid too)
    assert est.hybrid_ops["Concat"] >= len(concat) and est.sw_epochs < analyze_model(model, profile=PROFILE).estimate.sw_epochs


def test_gemm_dynamic_bias_qdq_quantizes_the_matmul_output():
    model = build("channels.gemm_dynamic_bias", {"qdq": True, "alpha": 0.5, "beta": 2.0, "m": 3})
    res = run_engine(model, [RULES["NAF011"]], profile=PROFILE, guard=False)
    assert len(res.changes) == 1
    ops = [n.op_type for n in res.model.graph.node]
    assert "Gemm" not in ops and "MatMul" in ops and "Add" in ops
    mm = next(n for n in res.model.graph.node if n.op_type == "MatMul" and n.name in res.provenance)
    consumers = [n for n in res.model.graph.node if mm.output[0] in n.input]
    assert [n.op_type for n in consumers] == ["QuantizeLinear"]
    before = analyze_model(model, profile=PROFILE)
    after = analyze_model(res.model, profile=PROFILE)
    assert any(f.constraint == "gemm_bias_constant" for f in before.placement.model_findings)
    assert not any(f.constraint == "gemm_bias_constant" for f in after.placement.model_findings)
    assert after.estimate.sw_epochs <= before.estimate.sw_epochs
    v = verify(model, res.model, contract=RULES["NAF011"].verify, samples=24, seed=8)
    assert v.ok, v.as_dict()
