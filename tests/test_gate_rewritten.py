"""The gate's fast paths against the slow ones they replace.

* ``verify.rewritten_part``: the rewritten nodes alone, fed the original's values; where they
  compute the original's values bit for bit, the gate takes the original's values for the fixed
  model's. Checked here against running the whole fixed model, and the whole verification against
  the verification without that path (``rewritten_part`` disabled).
* ``verify.compare`` on equal arrays (no float64 copies, one dot product) against the float64 path.
* the uint8 <-> int8 shifts (one XOR) against the int16 arithmetic.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fixer.gate.check as gate_check
import fixer.gate.metrics as gate_metrics
import fixer.gate.parts as gate_parts
import fixer.gate.runs as gate_runs
from fixer.api import FixOptions, fix
from fixer.rewriters import IoChange
from fixer.rules import VerifyContract

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "models"


def _model(nodes, inits, outputs=("y",), opset=13):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _convs(dilation=1, w_name="w", w_scale=1.0, tail_alpha=0.1):
    """x -> Relu -> Conv 1x1 (dilation) -> t -> LeakyRelu -> Conv 3x3 -> y: the 1x1 Conv is what a
    rewrite changes (its dilation, its weight's name or values); the layers below it are the original's."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", w_name], ["t"], name="conv1", dilations=[dilation, dilation],
                              kernel_shape=[1, 1]),
             helper.make_node("LeakyRelu", ["t"], ["u"], name="lr", alpha=tail_alpha),
             helper.make_node("Conv", ["u", "w2"], ["y"], name="conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    return _model(nodes, {w_name: w * np.float32(w_scale), "w2": w2})


def test_rewritten_nodes_alone_where_a_rewrite_is_exact():
    orig = _convs(dilation=2)
    fixed = _convs(dilation=1, w_name="w_new")  # a 1x1 kernel: the dilation changes nothing
    proof = gate_parts.proven_equal(orig, fixed, {})
    rp = gate_parts.rewritten_part(orig, fixed, proof, ["y"])
    assert rp is not None
    assert [n.name for n in rp.part.model.graph.node] == ["conv1"] and rp.checked == ("t",)
    assert rp.part.inputs == ("r",)


def test_no_rewritten_part_across_a_changed_interface_or_for_too_many_nodes():
    orig = _convs(dilation=2)
    fixed = _convs(dilation=1, w_name="w_new")
    proof = gate_parts.proven_equal(orig, fixed, {})
    assert gate_parts.rewritten_part(orig, fixed, proof, ["y"], io_changed=True) is None
    assert gate_parts.rewritten_part(orig, fixed, None, ["y"]) is None
    # the rewritten node is the only Conv of what would run otherwise: nothing to save
    assert gate_parts.rewritten_part(orig, fixed, proof, ["y"], replaces=fixed.graph.node[1:2]) is None


def _verify(orig, fixed, *, rewritten: bool, monkeypatch, contract=VerifyContract("exact"), **kw):
    with monkeypatch.context() as m:
        if not rewritten:
            m.setattr(gate_check, "rewritten_part", lambda *a, **k: None)
        return gate_check.verify(orig, fixed, contract=contract, rules=["X"], **kw).as_dict()


def _spy(monkeypatch):
    """Record, for each input set the rewritten nodes were proven on, the whole fixed model's outputs
    next to the original's values the gate takes for them."""
    seen = []
    real = gate_parts._RewrittenRun.proven

    def proven(self, vals):
        ok = real(self, vals)
        seen.append((ok, vals))
        return ok

    monkeypatch.setattr(gate_parts._RewrittenRun, "proven", proven)
    return seen


def _whole(fixed, names, vals):
    s = gate_runs.session(gate_runs._with_outputs(fixed, names))
    return dict(zip(names, s.run(names, {i.name: vals[i.name] for i in s.get_inputs()})))


def test_where_the_rewritten_nodes_compute_the_originals_values_so_does_the_whole_fixed_model(monkeypatch):
    orig = _convs(dilation=2)
    fixed = _convs(dilation=1, w_name="w_new")
    seen = _spy(monkeypatch)
    v = gate_check.verify(orig, fixed, contract=VerifyContract("exact"), rules=["X"])
    assert v.ok and len(seen) == 3 and all(ok for ok, _ in seen)
    for _, vals in seen:
        whole = _whole(fixed, ["y", "t"], vals)
        for n in ("y", "t"):
            assert gate_metrics._same_bits(whole[n], vals[n]), n


def test_the_verification_is_the_same_with_and_without_the_rewritten_nodes_alone(monkeypatch):
    cases = [
        (_convs(dilation=2), _convs(dilation=1, w_name="w_new")),  # exact: proven on every input set
        (_convs(), _convs(w_scale=1.001)),  # a real difference: the part runs, the gate rejects
        (_convs(), _convs(w_name="w_new", tail_alpha=0.2)),  # a rewritten node below one that is exact
    ]
    for orig, fixed in cases:
        for contract in (VerifyContract("exact"), VerifyContract("tolerance", 0.01, 0.0)):
            a = _verify(orig, fixed, rewritten=True, monkeypatch=monkeypatch, contract=contract)
            b = _verify(orig, fixed, rewritten=False, monkeypatch=monkeypatch, contract=contract)
            assert a == b


def test_a_wrong_rewrite_is_still_rejected(monkeypatch):
    seen = _spy(monkeypatch)
    v = gate_check.verify(_convs(), _convs(w_scale=1.001), contract=VerifyContract("exact"), rules=["X"])
    assert not v.ok and [o.name for o in v.outputs if not o.ok] == ["y"]
    assert [ok for ok, _ in seen] == [False]  # tried on the first input set only


def _unloadable(fixed: onnx.ModelProto) -> onnx.ModelProto:
    """``fixed`` with a value_info that says an unchanged tensor ('u', below the rewritten Conv) is
    int64: the rewritten nodes alone still load and compute the original's values, the whole fixed
    model does not load in onnxruntime."""
    bad = onnx.ModelProto()
    bad.CopyFrom(fixed)
    bad.graph.value_info.append(helper.make_tensor_value_info("u", TensorProto.INT64, [1, 4, 6, 6]))
    return bad


@pytest.mark.parametrize("whole_waited", [False, True], ids=["rewritten-nodes-alone", "fixed-model-first"])
def test_a_fixed_model_that_does_not_load_fails_the_gate_though_the_rewritten_nodes_prove_every_input_set(
        monkeypatch, whole_waited):
    """With the rewritten nodes alone, the gate waits for the fixed model's session only once every
    input set is proven (it loads meanwhile): the verdict is the one given when it was waited for
    before any run, also when the original fails to run on an input set."""
    orig, fixed = _convs(dilation=2), _unloadable(_convs(dilation=1, w_name="w_new"))
    seen = _spy(monkeypatch)
    v = _verify(orig, fixed, rewritten=not whole_waited, monkeypatch=monkeypatch)
    assert not v["ok"] and [o["name"] for o in v["outputs"]] == ["<model>"]
    assert "does not load in onnxruntime" in v["outputs"][0]["detail"]
    assert [ok for ok, _ in seen] == ([] if whole_waited else [True] * 3)  # proven on all 3, then waited for
    # the original failing to run on an input set: the fixed model's verdict still comes first
    def refuse(feed, names):
        raise RuntimeError("the original does not run here")
    a = gate_check.verify(orig, fixed, contract=VerifyContract("exact"), rules=["X"], original_run=refuse)
    assert not a.ok and "does not load in onnxruntime" in a.outputs[0].detail
    with pytest.raises(RuntimeError, match="does not run here"):  # a fixed model that loads: the original's error
        gate_check.verify(orig, _convs(dilation=1, w_name="w_new"), contract=VerifyContract("exact"), rules=["X"],
                          original_run=refuse)


def test_a_fixed_model_missing_an_output_fails_the_gate_with_the_rewritten_nodes_alone(monkeypatch):
    orig = _model(_convs(dilation=2).graph.node, {}, outputs=("y", "t"))
    orig.graph.initializer.extend(_convs(dilation=2).graph.initializer)
    fixed = _convs(dilation=1, w_name="w_new")  # no output 't'
    a = _verify(orig, fixed, rewritten=True, monkeypatch=monkeypatch)
    b = _verify(orig, fixed, rewritten=False, monkeypatch=monkeypatch)
    assert a == b and not a["ok"] and [o["detail"] for o in a["outputs"]] == ["output missing from the fixed model"]


def _qdq_tail(bias: float):
    """x -> Add(bias) -> QuantizeLinear (scale 1) -> DequantizeLinear -> Relu -> y: a rewrite that
    moves the float values a little (``bias``) but not across a rounding boundary."""
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="add"),
             helper.make_node("QuantizeLinear", ["a", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq"),
             helper.make_node("Relu", ["dq"], ["y"], name="relu")]
    return _model(nodes, {"b": np.array(bias, np.float32), "s": np.array(1.0, np.float32),
                          "z": np.array(0, np.int8)})


def test_a_float_tensor_only_quantizelinear_reads_is_compared_once_quantized(monkeypatch):
    orig, fixed = _qdq_tail(0.0), _qdq_tail(1e-6)
    fixed.graph.node[0].input[1] = "b2"
    fixed.graph.initializer[0].name = "b2"
    proof = gate_parts.proven_equal(orig, fixed, {})
    rp = gate_parts.rewritten_part(orig, fixed, proof, ["y"])
    assert rp is not None and rp.checked == ("q",)
    assert [n.name for n in rp.part.model.graph.node] == ["add", "q"]
    # the random inputs are in [-1, 1): none lies within 1e-6 of a rounding boundary (+-0.5)
    seen = _spy(monkeypatch)
    a = _verify(orig, fixed, rewritten=True, monkeypatch=monkeypatch)
    assert [ok for ok, _ in seen] == [True, True, True]
    assert a == _verify(orig, fixed, rewritten=False, monkeypatch=monkeypatch)


def test_same_bits_tells_signed_zeros_and_nans_apart():
    a = np.array([0.0, 1.0], np.float32)
    assert gate_metrics._same_bits(a, a.copy())
    assert not gate_metrics._same_bits(a, np.array([-0.0, 1.0], np.float32))
    assert not gate_metrics._same_bits(a, a.astype(np.float64))
    n = np.array([np.nan], np.float32)
    assert gate_metrics._same_bits(n, n.copy())
    assert gate_metrics._same_bits(np.arange(6, dtype=np.int8).reshape(2, 3).T, np.arange(6, dtype=np.int8).reshape(2, 3).T)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is not available")
def test_real_model_verification_is_the_same_with_and_without_the_rewritten_nodes_alone(monkeypatch):
    """PAN (float; exact Conv and Resize rewrites): the gate proves every input set on the rewritten
    nodes alone; the report is the same as running the part of the fixed model."""
    path = SHARED / "kazuhito__PAN_mobilenetv3_small_best_model_simplifier.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not available")
    seen = _spy(monkeypatch)
    a = fix(path, FixOptions(dry_run=True))
    assert [ok for ok, _ in seen] == [True, True, True]
    monkeypatch.setattr(gate_check, "rewritten_part", lambda *a, **k: None)
    b = fix(path, FixOptions(dry_run=True))
    assert a.verification.as_dict() == b.verification.as_dict()


# ------------------------------------------------------------------------------------------------
# compare() on equal arrays; the uint8 <-> int8 shifts
# ------------------------------------------------------------------------------------------------


def _compare_float64(a, b, *, lsb_scale):
    """The figures of compare() as it computed them before its fast paths: from float64 copies."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    finite = np.isfinite(a64) & np.isfinite(b64)
    if finite.all():
        diff = np.abs(a64 - b64)
    else:
        same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(same, 0.0, np.abs(a64 - b64))
        a64, b64 = np.where(finite, a64, 0.0), np.where(finite, b64, 0.0)
    max_abs = float(diff.max()) if diff.size else 0.0

    def dot(x, y):
        return float(np.add.reduce(np.multiply(x.ravel(), y.ravel())))

    na, nb = float(np.sqrt(dot(a64, a64))), float(np.sqrt(dot(b64, b64)))
    cosine = float(dot(a64, b64) / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        noise = float(np.sum(diff ** 2))
    snr = float("inf") if noise == 0 else float(10 * np.log10(max(np.sum(a64 ** 2), 1e-30) / noise))
    exact = float(np.mean(diff == 0)) if diff.size else 1.0
    one_lsb = float(np.mean(diff <= lsb_scale * 1.0001)) if lsb_scale else None
    rng_ = float(a64.max() - a64.min()) if a64.size else 0.0
    return max_abs, cosine, snr, exact, one_lsb, rng_


CONTRACTS = [(VerifyContract("exact"), None), (VerifyContract("lsb", 0.01, 0.0, 1), None),
             (VerifyContract("lsb", 0.0, 0.0, 2), 0.05), (VerifyContract("lsb", 0.0, 0.0, 1), 1.0),
             (VerifyContract("tolerance", 0.1, 0.0), None), (VerifyContract("ranking"), None)]


def _random(rng, dtype, shape):
    if dtype is np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(shape) * 10).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000) + 1, size=shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.int64, np.bool_])
def test_compare_gives_the_float64_figures_bit_for_bit(dtype):
    """Equal arrays (any dtype) and one-byte integer arrays take the fast paths: every figure is the
    float64 path's, to the last bit."""
    rng = np.random.default_rng(0)
    for shape in [(3, 5, 7), (1,), (2, 1000)]:
        a = _random(rng, dtype, shape)
        for b in (a.copy(), _random(rng, dtype, shape), np.where(rng.random(shape) < 0.9, a, _random(rng, dtype, shape))):
            for contract, scale in CONTRACTS:
                got = gate_metrics.compare(a, b, contract, lsb_scale=scale)
                max_abs, cosine, snr, exact, one_lsb, rng_ = _compare_float64(a, b, lsb_scale=scale)
                assert (got.max_abs_error, got.cosine, got.snr_db, got.bit_exact_fraction,
                        got.within_one_lsb_fraction) == (max_abs, cosine, snr, exact, one_lsb), (dtype, shape)
                if contract.contract == "tolerance" or (contract.contract == "lsb" and scale is None):
                    allowed = contract.rtol * rng_ + contract.atol
                    assert got.ok == (max_abs <= allowed) and f"vs allowed {allowed:.3g}" in got.detail


def test_compare_unequal_or_mixed_arrays_still_takes_the_float64_path():
    a = np.array([1.0, 2.0, np.inf], np.float32)
    got = gate_metrics.compare(a, a.copy(), VerifyContract("exact"), lsb_scale=None)
    assert got.ok  # the same infinity is no difference
    got = gate_metrics.compare(np.array([1, 2], np.int8), np.array([1, 2], np.float32), VerifyContract("exact"),
                             lsb_scale=None)
    assert got.ok and got.cosine == pytest.approx(1.0)
    got = gate_metrics.compare(np.array([1, 2], np.int8), np.array([1, 3], np.int8), VerifyContract("exact"),
                             lsb_scale=None)
    assert not got.ok and got.max_abs_error == 1.0


def test_the_uint8_int8_shifts_are_the_int16_arithmetic():
    u = np.arange(256, dtype=np.uint8).reshape(16, 16)
    for v in (u, u.T, u[:, ::3]):  # contiguous or not
        got = gate_metrics._as_int8_if_shifted(v, np.int8)
        assert got.dtype == np.int8 and np.array_equal(got, (v.astype(np.int16) - 128).astype(np.int8))
    ch = IoChange("input", "x", "int8", 1.0, 0, "uint8")
    assert np.array_equal(gate_metrics._edge_in(u, ch), (u.astype(np.int16) - 128).astype(np.int8))
    i = np.arange(-128, 128, dtype=np.int16).astype(np.int8).reshape(16, 16).T
    out = gate_metrics._edge_out(i, IoChange("output", "y", "int8", 1.0, 0, "uint8"))
    assert out.dtype == np.uint8 and np.array_equal(out, (i.astype(np.int16) + 128).astype(np.uint8))
    # other integer types keep the int16 arithmetic (wrapping as before)
    w = np.array([300, -5], np.int32)
    assert np.array_equal(gate_metrics._edge_in(w, ch), (w.astype(np.int16) - 128).astype(np.int8))


def _qdq_chain(bias: float, name: str = "b"):
    """x -> Mul(1) -> m -> Add(bias) -> QuantizeLinear (scale 1) -> DequantizeLinear -> Relu -> y."""
    nodes = [helper.make_node("Mul", ["x", "one"], ["m"], name="mul"),
             helper.make_node("Add", ["m", name], ["a"], name="add"),
             helper.make_node("QuantizeLinear", ["a", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq"),
             helper.make_node("Relu", ["dq"], ["y"], name="relu")]
    return _model(nodes, {"one": np.array(1.0, np.float32), name: np.array(bias, np.float32),
                          "s": np.array(1.0, np.float32), "z": np.array(0, np.int8)})


@pytest.mark.parametrize("region", [("m",), ()])
def test_an_input_set_the_rewritten_nodes_get_wrong_after_one_they_got_right(monkeypatch, region):
    """Proven on the first input set, not on the second: the part runs from there on (the original
    runs again for its frontier where the region does not fetch it), and the isolated region is
    judged on every input set as before."""
    monkeypatch.setattr(gate_parts, "PART_MAX_FRACTION", 1.0)
    orig, fixed = _qdq_chain(0.0), _qdq_chain(0.3, "b2")
    feeds = [{"x": np.zeros((1, 4, 6, 6), np.float32)},  # 0.3 rounds to 0 as 0 does
             {"x": np.full((1, 4, 6, 6), 0.4, np.float32)},  # 0.7 rounds to 1, 0.4 to 0
             {"x": np.full((1, 4, 6, 6), -3.0, np.float32)}]
    assert gate_parts.fixed_part(orig, fixed, {}, ["y", "q"]) is not None
    b = [gate_metrics.BoundaryCheck("q", "X", VerifyContract("lsb", 0.0, 0.0, 1.0), region)]
    seen = _spy(monkeypatch)
    runs = []
    real_run = gate_parts._PartRun.run

    def part_run(self, ffeed, vals):
        runs.append(sorted(vals))
        return real_run(self, ffeed, vals)

    monkeypatch.setattr(gate_parts._PartRun, "run", part_run)
    lsb = VerifyContract("lsb", 0.0, 0.0, 1.0)
    a = _verify(orig, fixed, rewritten=True, monkeypatch=monkeypatch, contract=lsb, inputs=feeds, boundaries=b)
    assert [ok for ok, _ in seen] == [True, False]
    assert len(runs) == 2 and all("m" in r for r in runs)  # the part, fed its frontier, on sets 2 and 3
    assert a == _verify(orig, fixed, rewritten=False, monkeypatch=monkeypatch, contract=lsb, inputs=feeds,
                        boundaries=b)
    assert a["rewritten_nodes"][0]["bit_exact_fraction"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.bool_])
def test_the_integer_sum_of_squares_is_the_float64_pairwise_sum(dtype):
    rng = np.random.default_rng(5)
    for n in (1, 9, 1000, 300_001):
        if dtype is np.bool_:
            a = rng.integers(0, 2, n).astype(dtype)
        else:
            info = np.iinfo(dtype)
            a = rng.integers(info.min, info.max + 1, n).astype(dtype)
        assert gate_metrics._sum_of_squares(a) == gate_metrics._dot(a, a)
    extreme = np.full((40, 30), np.iinfo(dtype).min if dtype is not np.bool_ else True, dtype)[:, ::2]
    assert gate_metrics._sum_of_squares(extreme) == gate_metrics._dot(extreme, extreme)
    extreme = np.full(1000, np.iinfo(dtype).max if dtype is not np.bool_ else True, dtype)
    assert gate_metrics._sum_of_squares(extreme) == gate_metrics._dot(extreme, extreme)


# ------------------------------------------------------------------------------------------------
# the isolated rewritten regions in the whole fixed model's session (gate.parts._WholeRun)
# ------------------------------------------------------------------------------------------------


def _fix_both_ways(path, monkeypatch):
    """The verification of ``path`` with the regions in the fixed model's session, and in their own."""
    built = []
    real = gate_parts._WholeRun.build.__func__

    def build(cls, *a, **k):
        w = real(cls, *a, **k)
        built.append(w)
        return w

    with monkeypatch.context() as m:
        m.setattr(gate_parts._WholeRun, "build", classmethod(build))
        a = fix(path, FixOptions(dry_run=True))
    with monkeypatch.context() as m:
        m.setattr(gate_parts._WholeRun, "build", classmethod(lambda cls, *a, **k: None))
        b = fix(path, FixOptions(dry_run=True))
    return a, b, built


def test_the_regions_in_the_fixed_models_session_give_what_their_own_session_gives(monkeypatch):
    joined = 0
    for path in sorted((ROOT / "sample_models").glob("*.onnx")):
        a, b, built = _fix_both_ways(path, monkeypatch)
        joined += sum(w is not None and w.runs == 3 for w in built)
        assert (a.verification is None) == (b.verification is None)
        if a.verification is not None:
            assert a.verification.as_dict() == b.verification.as_dict(), path.name
    assert joined, "no sample model ran its regions in the fixed model's session"


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is not available")
def test_real_uint8_model_regions_in_the_fixed_models_session(monkeypatch):
    """coral deeplabv3 (uint8 -> int8 input, NAF003 and NAF015 regions fed shifted original values)."""
    path = SHARED / "tfl2onnx-coral__deeplabv3_mnv2_dm05_pascal_quant.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not available")
    a, b, built = _fix_both_ways(path, monkeypatch)
    assert [w is not None and w.runs for w in built] == [3]
    assert a.verification.as_dict() == b.verification.as_dict()
    assert len(a.verification.boundaries) == 4


@pytest.mark.parametrize("bias", [0.0, 0.3])
def test_the_regions_join_the_fixed_models_session_only_once_an_input_set_is_not_proven(monkeypatch, bias):
    """No part (the rewritten Add is most of the model): where the rewritten nodes prove every input
    set, the fixed model's session is its own and the isolated region runs nowhere (it computes the
    original's values there too); from the first set they do not prove, the region joins the fixed
    model's session. Either way the verification is the one without the rewritten nodes' path."""
    # shapes inferred: the region is cut out of the fixed model by onnx's Extractor, which needs them
    orig, fixed = (onnx.shape_inference.infer_shapes(m) for m in (_qdq_chain(0.0), _qdq_chain(bias, "b2")))
    feeds = [{"x": np.zeros((1, 4, 6, 6), np.float32)},
             {"x": np.full((1, 4, 6, 6), 0.4, np.float32)},
             {"x": np.full((1, 4, 6, 6), -3.0, np.float32)}]
    assert gate_parts.fixed_part(orig, fixed, {}, ["y", "q"]) is None
    lsb = VerifyContract("lsb", 0.0, 0.0, 1.0)
    b = [gate_metrics.BoundaryCheck("q", "X", lsb, ("m",))]
    seen = _spy(monkeypatch)
    built, apart = [], []
    real_build = gate_parts._WholeRun.build.__func__
    real_isolated = gate_parts._isolated_boundaries

    def build(cls, *a, **k):
        w = real_build(cls, *a, **k)
        built.append(w)
        return w

    def isolated(*a, **k):
        apart.append(1)
        return real_isolated(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(gate_parts._WholeRun, "build", classmethod(build))
        m.setattr(gate_check, "_isolated_boundaries", isolated)
        a = _verify(orig, fixed, rewritten=True, monkeypatch=monkeypatch, contract=lsb, inputs=feeds, boundaries=b)
    if bias == 0.0:
        assert [ok for ok, _ in seen] == [True, True, True]
        assert built == [] and apart == []
        assert a["rewritten_nodes"][0]["bit_exact_fraction"] == 1.0
    else:
        assert [ok for ok, _ in seen] == [True, False]
        assert len(built) == 1 and built[0] is not None and built[0].runs == 2  # sets 2 and 3
        assert apart == [1]  # the region on all three sets, as before (it joined the session on two)
        assert a["rewritten_nodes"][0]["bit_exact_fraction"] == pytest.approx(2 / 3)
    assert a == _verify(orig, fixed, rewritten=False, monkeypatch=monkeypatch, contract=lsb, inputs=feeds,
                        boundaries=b)


# ------------------------------------------------------------------------------------------------
# the rewritten nodes' part computes the DequantizeLinear they read through (gate.parts._dequantized_reads)
# ------------------------------------------------------------------------------------------------


def _qdq_sub(rewritten: bool, c: float = 0.75, scale_name: str = "s"):
    """x -> Q -> DQ -> Sub(c, .) -> Q -> DQ -> y; ``rewritten``: the Sub as Add(c, Neg(.)), which is
    c - x bit for bit (or not, with another ``c`` in the fixed model)."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q1"], name="q1"),
             helper.make_node("DequantizeLinear", ["q1", scale_name, "z"], ["dq1"], name="dq1")]
    if rewritten:
        nodes += [helper.make_node("Neg", ["dq1"], ["neg"], name="sub__nafix_0"),
                  helper.make_node("Add", ["c2", "neg"], ["t"], name="sub__nafix_1")]
    else:
        nodes += [helper.make_node("Sub", ["c", "dq1"], ["t"], name="sub")]
    nodes += [helper.make_node("QuantizeLinear", ["t", "s", "z"], ["tq"], name="q2"),
              helper.make_node("DequantizeLinear", ["tq", "s", "z"], ["y"], name="dq2")]
    inits = {"s": np.array(0.05, np.float32), "z": np.array(0, np.int8)}
    inits["c2" if rewritten else "c"] = np.array(c, np.float32)
    if scale_name != "s":
        inits[scale_name] = np.array(0.05, np.float32)
    return _model(nodes, inits)


def test_the_rewritten_nodes_part_reads_the_int8_tensor_behind_a_dequantizelinear():
    orig, fixed = _qdq_sub(False), _qdq_sub(True)
    proof = gate_parts.proven_equal(orig, fixed, {})
    rp = gate_parts.rewritten_part(orig, fixed, proof, ["y"])
    assert rp is not None and rp.checked == ("tq",)
    assert [n.name for n in rp.part.model.graph.node] == ["dq1", "sub__nafix_0", "sub__nafix_1", "q2"]
    assert rp.part.inputs == ("q1",)  # not the float 'dq1' the rewritten nodes read


def test_a_dequantizelinear_not_proven_the_originals_is_not_computed_again():
    # the fixed model's DequantizeLinear reads a scale of another name: not the original's node
    orig, fixed = _qdq_sub(False), _qdq_sub(True, scale_name="s_other")
    proof = gate_parts.proven_equal(orig, fixed, {})
    dq = next(n for n in fixed.graph.node if n.name == "dq1")
    diff = [n for n in fixed.graph.node if n.name.startswith("sub__")]
    assert gate_parts._dequantized_reads(diff, {id(n) for n in diff}, {o: n for n in orig.graph.node for o in n.output},
                                         proof[0], gate_parts._computed_from_initializers(fixed),
                                         {o: n for n in fixed.graph.node for o in n.output if o}) == []
    assert dq not in gate_parts._dequantized_reads(diff, {id(n) for n in diff},
                                                   {o: n for n in fixed.graph.node for o in n.output}, set(),
                                                   gate_parts._computed_from_initializers(fixed),
                                                   {o: n for n in fixed.graph.node for o in n.output if o})


@pytest.mark.parametrize("c", [0.75, 0.8])
def test_the_verification_is_the_same_with_and_without_the_dequantizelinear_in_the_part(monkeypatch, c):
    """An exact rewrite (proven on every input set, checked here against the whole fixed model) and
    a wrong one (c changed: rejected): the same verification either way."""
    orig, fixed = _qdq_sub(False), _qdq_sub(True, c=c)
    seen = _spy(monkeypatch)
    a = _verify(orig, fixed, rewritten=True, monkeypatch=monkeypatch)
    assert [ok for ok, _ in seen] == ([True] * 3 if c == 0.75 else [False])
    for ok, vals in seen:
        if ok:
            whole = _whole(fixed, ["y", "tq"], vals)
            assert all(gate_metrics._same_bits(whole[n], vals[n]) for n in ("y", "tq"))
    assert a["ok"] is (c == 0.75)
    with monkeypatch.context() as m:
        m.setattr(gate_parts, "_dequantized_reads", lambda *args, **kw: [])
        b = _verify(orig, fixed, rewritten=True, monkeypatch=monkeypatch)
    assert a == b
    assert a == _verify(orig, fixed, rewritten=False, monkeypatch=monkeypatch)


def _qdq_subs(rewritten: bool, k: int = 5, wrong: int | None = None):
    """``k`` regions side by side, each x -> Q -> DQ -> Sub(c_i, .) -> Q -> DQ -> y_i (``rewritten``:
    the Sub as Add(c_i, Neg(.)), exact unless the region is ``wrong``)."""
    nodes, inits = [], {"s": np.array(0.05, np.float32), "z": np.array(0, np.int8)}
    for i in range(k):
        nodes += [helper.make_node("QuantizeLinear", ["x", "s", "z"], [f"q{i}"], name=f"q{i}"),
                  helper.make_node("DequantizeLinear", [f"q{i}", "s", "z"], [f"dq{i}"], name=f"dq{i}")]
        c = np.array(0.25 * i + (0.05 if rewritten and i == wrong else 0.0), np.float32)
        if rewritten:
            nodes += [helper.make_node("Neg", [f"dq{i}"], [f"neg{i}"], name=f"sub{i}__nafix_0"),
                      helper.make_node("Add", [f"c{i}_new", f"neg{i}"], [f"t{i}"], name=f"sub{i}__nafix_1")]
            inits[f"c{i}_new"] = c
        else:
            nodes.append(helper.make_node("Sub", [f"c{i}", f"dq{i}"], [f"t{i}"], name=f"sub{i}"))
            inits[f"c{i}"] = c
        nodes += [helper.make_node("QuantizeLinear", [f"t{i}", "s", "z"], [f"tq{i}"], name=f"tq{i}"),
                  helper.make_node("DequantizeLinear", [f"tq{i}", "s", "z"], [f"y{i}"], name=f"y{i}")]
    return _model(nodes, inits, outputs=tuple(f"y{i}" for i in range(k)))


@pytest.mark.parametrize("wrong", [None, 0, 3])
def test_the_rewritten_nodes_in_groups_of_regions_give_the_one_sessions_verdict(wrong):
    orig, fixed = _qdq_subs(False), _qdq_subs(True, wrong=wrong)
    rp = gate_parts.rewritten_part(orig, fixed, gate_parts.proven_equal(orig, fixed, {}), [f"y{i}" for i in range(5)])
    assert rp is not None and len(rp.part.model.graph.node) == 20  # per region: DQ, Neg, Add, Q
    groups = gate_parts._region_groups(rp.part, 10)
    nodes = rp.part.model.graph.node
    # whole regions: every tensor (not an initializer) a group reads or computes is its own
    for g in groups:
        made = {o for k in g for o in nodes[k].output}
        reads = {i for k in g for i in nodes[k].input} - {t.name for t in rp.part.model.graph.initializer}
        assert all(t in made or t in rp.part.inputs for t in reads)
    assert len(groups) == 3 and sorted(k for g in groups for k in g) == list(range(len(nodes)))
    s = gate_runs.session(gate_runs._with_outputs(orig, list(rp.part.inputs) + list(rp.checked)))
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.random((1, 4, 6, 6), dtype=np.float32) * 2 - 1
        names = list(rp.part.inputs) + list(rp.checked)
        vals = dict(zip(names, s.run(names, {"x": x})))
        grouped, whole = gate_parts._RewrittenRun(rp, group_nodes=10), gate_parts._RewrittenRun(rp, group_nodes=10**9)
        assert grouped.proven(vals) is whole.proven(vals) is (wrong is None)
        assert len(grouped.sess) == 3 and len(whole.sess) == 1


@pytest.mark.parametrize("wrong", [None, 2])
def test_the_verification_is_the_same_with_the_rewritten_nodes_in_groups(monkeypatch, wrong):
    orig, fixed = _qdq_subs(False), _qdq_subs(True, wrong=wrong)
    seen = _spy(monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(gate_parts, "REWRITTEN_GROUP_NODES", 5)
        a = _verify(orig, fixed, rewritten=True, monkeypatch=monkeypatch)
    assert [ok for ok, _ in seen] == ([True] * 3 if wrong is None else [False])
    assert a["ok"] is (wrong is None)
    assert a == _verify(orig, fixed, rewritten=True, monkeypatch=monkeypatch)
    assert a == _verify(orig, fixed, rewritten=False, monkeypatch=monkeypatch)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is not available")
def test_real_model_verification_is_the_same_with_the_rewritten_nodes_in_groups(monkeypatch):
    """PAN's rewritten nodes (proven on every input set) in sessions of at most 3 nodes of whole
    regions: the same report as in one session."""
    path = SHARED / "kazuhito__PAN_mobilenetv3_small_best_model_simplifier.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not available")
    sessions = []
    real = gate_parts._RewrittenRun._sessions

    def spy(self, feed):
        out = real(self, feed)
        sessions.append(len(out))
        return out

    monkeypatch.setattr(gate_parts._RewrittenRun, "_sessions", spy)
    a = fix(path, FixOptions(dry_run=True))
    monkeypatch.setattr(gate_parts, "REWRITTEN_GROUP_NODES", 3)
    b = fix(path, FixOptions(dry_run=True))
    assert sessions[0] == 1 and sessions[1] > 1
    assert a.verification.as_dict() == b.verification.as_dict() and b.verification.ok


def test_a_dequantizelinear_of_a_graph_input_is_not_computed_again():
    # x -> DQ -> Sub: the DequantizeLinear reads the graph input itself; the part keeps its float input
    def model(rewritten):
        g = _qdq_sub(rewritten)
        nodes = [n for n in g.graph.node if n.name != "q1"]
        for n in nodes:
            if n.name == "dq1":
                n.input[0] = "xq"
        m = helper.make_model(helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("xq", TensorProto.INT8, [1, 4, 6, 6])],
            list(g.graph.output), list(g.graph.initializer)), opset_imports=g.opset_import)
        return m
    orig, fixed = model(False), model(True)
    rp = gate_parts.rewritten_part(orig, fixed, gate_parts.proven_equal(orig, fixed, {}), ["y"])
    assert rp is not None and rp.part.inputs == ("dq1",)
    assert [n.name for n in rp.part.model.graph.node] == ["sub__nafix_0", "sub__nafix_1", "q2"]
