"""Direct tests of the recurrent family (NAF016 unroll-lstm, NAF017 unroll-gru) beyond the case files:
QDQ models (where the unrolled cells stay float until re-quantized, so the case runner's HW-ratio
check does not apply), what the cells become once quantized the ST way, the committed denoiser
samples and the real streaming models with LSTM state I/O (dtln, ten-vad; skipped without
../shared/models).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from fixer.api import analyze_model
from fixer.engine import run_engine
from fixer.model_io import load_model
from fixer.npu.profile import load_profile
from fixer.rules import load_rules, select_rules
from fixer.gate import verify
from tests.builders import build
from tests.builders.common import quantize_st

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT.parent / "shared" / "models"
PROFILE = load_profile()
RULES = {r.id: r for r in load_rules()}


def _fix(model: onnx.ModelProto, rid: str):
    res = run_engine(model, [RULES[rid]], profile=PROFILE, guard=False)
    return res


def _verified(model, res, rid, samples=20):
    onnx.checker.check_model(res.model)
    v = verify(model, res.model, contract=RULES[rid].verify, rules=[rid], samples=samples, seed=7)
    assert v.ok, v.as_dict()
    return max(o.max_abs_error for o in v.outputs)


def test_opt_in():
    ids = {r.id for r in select_rules(load_rules())}
    assert "NAF016" not in ids and "NAF017" not in ids
    ids = {r.id for r in select_rules(load_rules(), select=["NAF016", "unroll-gru"])}
    assert {"NAF016", "NAF017"} <= ids


@pytest.mark.parametrize("rid,spec,params", [
    ("NAF016", "recurrent.lstm", {"seq": 8, "qdq": True}),
    ("NAF016", "recurrent.lstm", {"seq": 8, "qdq": True, "states": "inputs", "use": ["Y", "Y_h", "Y_c"]}),
    ("NAF016", "recurrent.streaming_lstm", {"qdq": True}),
    ("NAF017", "recurrent.gru", {"seq": 6, "qdq": True, "states": "inputs", "use": ["Y", "Y_h"]}),
    ("NAF017", "recurrent.gru", {"seq": 6, "qdq": True, "linear_before_reset": 1}),
])
def test_qdq_models_fire_and_ask_for_quantize(rid, spec, params):
    model = build(spec, params)
    res = _fix(model, rid)
    assert [c.rule for c in res.changes] == [rid]
    assert "nafix --quantize" in res.changes[0].detail
    assert _verified(model, res, rid) < 1e-5
    # the LSTM/GRU is gone; the unrolled ops are float, exactly like the op they replace
    ops = {n.op_type for n in res.model.graph.node}
    assert not ops & {"LSTM", "GRU"}


@pytest.mark.parametrize("rid,spec,params", [
    ("NAF016", "recurrent.lstm", {"seq": 8, "states": "inputs", "use": ["Y", "Y_h", "Y_c"]}),
    ("NAF016", "recurrent.lstm", {"seq": 4, "direction": "bidirectional", "peephole": True, "clip": 1.0}),
    ("NAF016", "recurrent.streaming_lstm", {}),
    ("NAF017", "recurrent.gru", {"seq": 6, "states": "inputs", "use": ["Y", "Y_h"]}),
    ("NAF017", "recurrent.gru", {"seq": 6, "linear_before_reset": 1, "direction": "bidirectional"}),
])
def test_quantized_cells_run_on_the_npu(rid, spec, params):
    """Unroll the float model, quantize it the ST way: every node the rule made is quantized
    (DequantizeLinear in, QuantizeLinear out), placed on HW (or folded), and no tensor exceeds rank 4.
    What stays SW are the float graph-edge conversions (a state input that fed the float LSTM directly
    now gets a QuantizeLinear of its own, a state output a DequantizeLinear); with int8 graph edges
    (NAF004/NAF005, as the forum denoiser's int8 state I/O) the model has fewer estimated SW epochs
    than the same float model quantized with its LSTM/GRU."""
    model = build(spec, params)
    res = _fix(model, rid)
    assert res.changes
    unrolled_q = quantize_st(res.model, np.random.default_rng(0))
    original_q = quantize_st(model, np.random.default_rng(0))
    a = analyze_model(unrolled_q, profile=PROFILE)
    ours = [p for p in a.placement.nodes if "__nafix_" in p.name and p.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    assert ours
    assert all(p.unit in ("HW", "folded") for p in ours), [(p.name, p.op_type, p.reasons) for p in ours if p.unit == "SW"]
    assert not any(r.constraint == "rank_limit" for p in a.placement.nodes for r in p.reasons)
    sw = [(p.name, p.reasons[0].constraint) for p in a.placement.nodes if p.unit == "SW"]
    assert all(c in ("graph_edge_quantize", "graph_edge_dequantize") for _, c in sw), sw
    edges = [RULES["NAF004"], RULES["NAF005"]]
    before = analyze_model(run_engine(original_q, edges, profile=PROFILE).model, profile=PROFILE).estimate
    after = analyze_model(run_engine(unrolled_q, edges, profile=PROFILE).model, profile=PROFILE).estimate
    assert after.sw_epochs < before.sw_epochs, (before.as_dict(), after.as_dict())


def test_names_of_outputs_kept_and_only_read_outputs_built():
    model = build("recurrent.lstm", {"seq": 4, "states": "inputs", "use": ["Y_h"]})
    res = _fix(model, "NAF016")
    assert [o.name for o in res.model.graph.output] == [o.name for o in model.graph.output] == ["Y_h"]
    ops = [n.op_type for n in res.model.graph.node]
    assert "Concat" not in ops and "Reshape" not in ops  # no Y built
    assert "building Y_h" in res.changes[0].detail


def test_rank_limit_respected_and_y_is_rank4():
    model = build("recurrent.lstm", {"seq": 5, "batch": 2, "direction": "bidirectional", "use": ["Y", "Y_h", "Y_c"]})
    res = _fix(model, "NAF016")
    for vi in list(res.model.graph.value_info) + list(res.model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        assert len(dims) <= 4, vi.name
    a = analyze_model(res.model, profile=PROFILE)
    assert not any(r.constraint == "rank_limit" for p in a.placement.nodes for r in p.reasons)


@pytest.mark.parametrize("name", ["denoiser_257_float", "denoiser_257"])
def test_denoiser_samples(name):
    model = onnx.load(str(ROOT / "sample_models" / f"{name}.onnx"))
    res = _fix(model, "NAF016")
    assert len(res.changes) == 1 and "8 steps, hidden 128" in res.changes[0].detail
    assert ("nafix --quantize" in res.changes[0].detail) == (name == "denoiser_257")
    assert _verified(model, res, "NAF016") < 1e-6


REAL = {
    # file: (LSTMs, steps)
    "dtln__model_1.onnx": (2, 1),
    "tenvad__ten-vad.onnx": (2, 1),
}


@pytest.mark.skipif(not MODELS.is_dir(), reason=f"{MODELS} is not available")
@pytest.mark.parametrize("fname", sorted(REAL))
def test_real_streaming_models(fname):
    loaded = load_model(MODELS / fname)  # ten-vad: dynamic batch pinned to 1
    n, steps = REAL[fname]
    res = _fix(loaded.model, "NAF016")
    assert len(res.changes) == n and not res.near_misses
    assert all(f"{steps} step" in c.detail and "building Y, Y_h, Y_c" in c.detail for c in res.changes)
    assert _verified(loaded.model, res, "NAF016") < 1e-6
    assert [o.name for o in res.model.graph.output] == [o.name for o in loaded.model.graph.output]
    a = analyze_model(res.model, profile=PROFILE)
    assert not any(r.constraint == "rank_limit" for p in a.placement.nodes for r in p.reasons)
    assert not any(p.op_type == "LSTM" for p in a.placement.nodes)
