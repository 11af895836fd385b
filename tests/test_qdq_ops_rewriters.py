"""Direct tests of the qdq/ops rewriters (NAF004-NAF010, NAF012), independent of the engine.

Each rule's YAML is read here only for its anchor ops, trigger constraint, rewriter and params; the
rewriter is applied to every anchor whose placement fails the trigger (as the engine will), the graph
is cleaned up and exported, and the fixed model is compared with the original in onnxruntime on 24
seeded random inputs under the rule's contract, with onnxruntime's reference kernels (each operator as
ONNX defines it: ORT_DISABLE_ALL, the level nafix's gate uses) and again after its basic graph
optimizations. Not with its fused QDQ kernels (QLinearConv & co., ORT_ENABLE_EXTENDED and up): on x86
CPUs without VNNI (AVX2 only, e.g. an AMD EPYC CI runner) their 8-bit dot products saturate 16-bit
intermediate sums (the "saturation issue" of pre-VNNI CPUs, see OpenVINO's "Saturation (overflow)
Issue Workaround"), which moves the original's own output by up to 18 quantization steps on these test
models, so two fused runs would compare which nodes onnxruntime fused, not the rewrite (onnxruntime
1.31.1 and 1.32.0 alike):

- exact: bit-identical outputs (for int8 graph outputs: after dequantizing with the recorded
  scale/zero-point; for int8 graph inputs: the fixed model is fed quantize(x) with round half to even
  and saturation);
- tolerance: max |diff| <= rtol * (max - min of the original output) + atol;
- lsb: max |diff| <= lsb * the output's quantization scale;
- ranking: the order along the last axis of softmax(new output) equals the order of the original
  output (argmax equal, and ranks equal wherever the original has no ties).

``python -m tests.test_qdq_ops_rewriters`` prints the measured numbers for every case file and for
the sample / real models.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from fixer import ir
import onnxruntime as ort
import pytest
import yaml

from fixer.graph import Editor, GraphView
from fixer.npu.estimate import estimate_epochs
from fixer.npu.placement import place
from fixer.npu.profile import load_profile
from fixer.rewriters import REWRITERS, Match, NearMiss, load_all
from tests.builders import build
from tests.helpers import case_profile, case_with_file_defaults

ROOT = Path(__file__).resolve().parents[1]
RULES = ["NAF004", "NAF005", "NAF006", "NAF007", "NAF008", "NAF009", "NAF010", "NAF012"]
N_INPUTS = 24
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
              "tensor(float16)": np.float16, "tensor(int64)": np.int64}


def rule_yaml(rule_id: str) -> dict:
    paths = sorted((ROOT / "rules").glob(f"{rule_id}-*.yaml"))
    assert len(paths) == 1, f"{rule_id}: {paths}"
    return yaml.safe_load(paths[0].read_text())


@dataclass
class Applied:
    model: onnx.ModelProto
    details: list[str] = field(default_factory=list)
    near_misses: list[str] = field(default_factory=list)
    io_changes: list = field(default_factory=list)
    contracts: list[str | None] = field(default_factory=list)
    sw_before: int = 0
    sw_after: int = 0
    hw_ratio_before: float = 0.0
    hw_ratio_after: float = 0.0


def _preconditions_hold(rule: dict, node, match) -> tuple[bool, str]:
    try:
        from fixer.predicates import PREDICATES
    except ImportError:  # pragma: no cover - predicates not there yet
        return True, ""
    for cond in rule["match"].get("when", [])[1:]:
        cond = dict(cond)
        name = cond.pop("predicate")
        v = PREDICATES[name].func(node, match, **cond)
        if not v.ok:
            return False, v.detail
    return True, ""


def apply_rule(model: onnx.ModelProto, rule_id: str, options: dict | None = None, rounds: int = 3,
               profile=None) -> Applied:
    """Apply one rule to a fixed point (at most ``rounds`` rounds), like the engine will."""
    load_all()
    rule = rule_yaml(rule_id)
    trigger = rule["match"]["when"][0]
    assert trigger["predicate"] == "fails_constraint"
    ops = rule["match"]["op"]
    ops = [ops] if isinstance(ops, str) else ops
    rw = REWRITERS[rule["rewrite"]["rewriter"]]
    params = {**rw.params, **(rule["rewrite"].get("params") or {})}
    profile = profile or load_profile()
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    out = Applied(model)
    first = True
    tried: set[str] = set()
    for _ in range(rounds):
        view = GraphView(out.model)
        placement = place(view, profile)
        if first:
            est = estimate_epochs(view, placement, profile)
            out.sw_before, out.hw_ratio_before = est.sw_epochs, est.hw_ratio
            first = False
        by_name = placement.by_name
        anchors = [n for n in list(view.nodes) if n.op in ops and n.name not in tried and any(
            r.constraint == trigger["constraint"] for r in by_name[n.name].reasons + by_name[n.name].notes)]
        if not anchors:
            break
        prov: dict[str, str] = {}
        changed = False
        for node in anchors:
            tried.add(node.name)
            m = Match(rule_id, node, view, placement, profile, params, options or {})
            ok, why = _preconditions_hold(rule, node, m)
            if not ok:
                out.near_misses.append(why)
                continue
            ed = Editor(view.graph, rule_id=rule_id, anchor=node, provenance=prov)
            try:
                res = rw.func(m, ed)
            except NearMiss as exc:
                out.near_misses.append(str(exc))
                continue
            out.details.append(res.detail)
            out.io_changes += res.io_changes
            out.contracts.append(res.contract)
            changed = True
        if not changed:
            break
        view.graph.cleanup().toposort()
        m2 = ir.export_onnx(view.graph)
        m2.ir_version = out.model.ir_version or 8
        del m2.opset_import[:]
        m2.opset_import.extend(out.model.opset_import)
        del m2.metadata_props[:]  # (the export carries the model's own: set them as the engine does)
        for k, v in ((p.key, p.value) for p in out.model.metadata_props):
            m2.metadata_props.add(key=k, value=v)
        # like the engine: re-infer shapes from scratch
        del m2.graph.value_info[:]
        m2 = onnx.shape_inference.infer_shapes(m2)
        onnx.checker.check_model(m2)
        out.model = m2
        assert opset == next(o.version for o in m2.opset_import if o.domain in ("", "ai.onnx"))
    view = GraphView(out.model)
    est = estimate_epochs(view, place(view, profile), profile)
    out.sw_after, out.hw_ratio_after = est.sw_epochs, est.hw_ratio
    return out


# ------------------------------------------------------------------------------------------------
# numerics
# ------------------------------------------------------------------------------------------------


def _session(model: onnx.ModelProto, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = level
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _dims(shape, batch: int = 1) -> list[int]:
    return [d if isinstance(d, int) else batch for d in shape]


def quantize_np(x: np.ndarray, scale: float, zp: int, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    q = np.rint(x.astype(np.float32) / np.float32(scale)) + zp  # rint = round half to even
    return np.clip(q, info.min, info.max).astype(dtype)


@dataclass
class Numbers:
    max_abs: float
    bit_exact: bool
    ok: bool
    note: str = ""
    basic: "Numbers | None" = None  # the same comparison after onnxruntime's basic optimizations


def compare(original: onnx.ModelProto, fixed: Applied, contract: dict, n: int = N_INPUTS, seed: int = 7,
            level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL) -> Numbers:
    s0, s1 = _session(original, level), _session(fixed.model, level)
    ins_changed = {c.name: c for c in fixed.io_changes if c.kind == "input"}
    outs_changed = {c.name: c for c in fixed.io_changes if c.kind == "output"}
    rng = np.random.default_rng(seed)
    worst, exact, ok = 0.0, True, True
    notes = []
    kind = contract.get("contract", "exact")
    for _ in range(n):
        feed0, feed1 = {}, {}
        for i in s0.get_inputs():
            dt = _ORT_TYPES[i.type]
            shape = _dims(i.shape)
            if np.dtype(dt).kind == "f":
                x = (rng.standard_normal(shape) * 1.5).astype(dt)
            else:
                x = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, shape).astype(dt)
            feed0[i.name] = x
            c = ins_changed.get(i.name)
            feed1[i.name] = quantize_np(x, c.scale, c.zero_point, np.dtype(c.dtype).type) if c else x
        o0 = dict(zip([o.name for o in s0.get_outputs()], s0.run(None, feed0)))
        o1 = dict(zip([o.name for o in s1.get_outputs()], s1.run(None, feed1)))
        assert set(o0) == set(o1), (set(o0), set(o1))
        for name, a in o0.items():
            b = o1[name]
            c = outs_changed.get(name)
            if c is not None:
                assert b.dtype == np.dtype(c.dtype), (name, b.dtype, c.dtype)
                b = ((b.astype(np.float32) - np.float32(c.zero_point)) * np.float32(c.scale)).astype(np.float32)
            assert a.shape == b.shape, (name, a.shape, b.shape)
            if kind == "ranking":
                ranks_ok = _ranking_ok(a, b)
                ok &= ranks_ok
                exact &= ranks_ok
                continue
            d = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
            worst = max(worst, d)
            exact &= bool(np.array_equal(a, b))
            if kind == "exact":
                ok &= bool(np.array_equal(a, b))
            elif kind == "tolerance":
                rng_ = float(np.max(a) - np.min(a)) if a.size else 0.0
                ok &= d <= contract.get("rtol", 1e-5) * rng_ + contract.get("atol", 0.0)
            elif kind == "lsb":
                ok &= d <= contract.get("lsb", 1) * contract["_scale"][name] * (1 + 1e-6)
    return Numbers(worst, exact, ok, "; ".join(notes))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _ranking_ok(orig: np.ndarray, new: np.ndarray) -> bool:
    """argmax of softmax(new) equals argmax of the original along the last axis wherever the original's
    maximum is unique, and the order of softmax(new) never contradicts a strict order of the original."""
    p = _softmax(new.astype(np.float64))
    a = orig.reshape(-1, orig.shape[-1])
    p = p.reshape(-1, p.shape[-1])
    for ra, rp in zip(a, p):
        top = np.flatnonzero(ra == ra.max())
        if int(np.argmax(rp)) not in top:
            return False
        i, j = np.meshgrid(np.arange(ra.size), np.arange(ra.size), indexing="ij")
        strict = ra[i] > ra[j]
        if np.any(strict & (rp[i] < rp[j])):
            return False
    return True


def output_scales(model: onnx.ModelProto) -> dict[str, float]:
    """Quantization scale of each graph output (from the DequantizeLinear producing it), for 'lsb'."""
    view = GraphView(model)
    out = {}
    for t in view.graph.outputs:
        p = view.producer(t)
        if p is not None and p.op == "DequantizeLinear":
            s = view.const_value(p.inputs[1])
            out[t.name] = float(np.max(s)) if s is not None else 0.0
        else:
            out[t.name] = 0.0
    return out


# ------------------------------------------------------------------------------------------------
# case files
# ------------------------------------------------------------------------------------------------


def _cases():
    for rule in RULES:
        path = ROOT / "tests" / "rule_cases" / f"{rule}.yaml"
        if not path.exists():
            continue
        data = yaml.safe_load(path.read_text())
        for case in data["cases"]:
            yield pytest.param(rule, case_with_file_defaults(data, case), id=f"{rule}-{case['name']}")


def case_model(case: dict) -> onnx.ModelProto:
    if "onnx_text" in case:
        return onnx.parser.parse_model(case["onnx_text"])
    return build(case["builder"], case.get("params"))


def run_case(rule: str, case: dict) -> tuple[Applied, Numbers | None]:
    model = case_model(case)
    applied = apply_rule(model, rule, options={"input_type": case.get("input_type", "int8")}, profile=case_profile(case))
    fired = bool(applied.details)
    assert fired == case["fires"], (applied.details, applied.near_misses)
    if "detail" in case:
        assert any(case["detail"] in d for d in applied.details), applied.details
    if "near_miss" in case:
        assert any(case["near_miss"] in r for r in applied.near_misses), applied.near_misses
    if not fired:
        return applied, None
    spec = rule_yaml(rule)
    contract = dict(spec.get("verify") or {})
    override = {c for c in applied.contracts if c}
    if override:
        contract["contract"] = override.pop()
    contract["_scale"] = output_scales(model)
    nums = compare(model, applied, contract)
    nums.basic = compare(model, applied, contract, level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    return applied, nums


@pytest.mark.parametrize("rule,case", list(_cases()))
def test_rule_case(rule, case):
    applied, nums = run_case(rule, case)
    if nums is not None:
        assert nums.ok, f"{rule} {case['name']}: max abs error {nums.max_abs}"
        # the contract holds after onnxruntime's basic graph optimizations too (folding, elimination)
        assert nums.basic.ok, f"{rule} {case['name']} (ORT_ENABLE_BASIC): max abs error {nums.basic.max_abs}"
        assert applied.hw_ratio_after >= applied.hw_ratio_before - 1e-9, (applied.hw_ratio_before, applied.hw_ratio_after)


def test_docstrings():
    load_all()
    from fixer.rewriters import ops, qdq  # noqa: F401

    for name in ("int8_graph_output", "int8_graph_input", "sub_constant_first", "fold_batchnorm",
                 "depthwise_stride2", "relu_before_reshape", "depth_to_space", "drop_trailing_softmax"):
        assert name in REWRITERS and len(REWRITERS[name].doc) > 40, name


# ------------------------------------------------------------------------------------------------
# branches the placement does not trigger today: applied directly to a named anchor
# ------------------------------------------------------------------------------------------------


def apply_direct(model: onnx.ModelProto, rewriter: str, anchor: str, params: dict | None = None,
                 options: dict | None = None) -> Applied:
    """Apply one rewriter to the node named ``anchor`` (no trigger), clean up, export, re-infer."""
    load_all()
    rw = REWRITERS[rewriter]
    profile = load_profile()
    model = onnx.shape_inference.infer_shapes(model)
    view = GraphView(model)
    placement = place(view, profile)
    node = view.by_name[anchor]
    m = Match("direct", node, view, placement, profile, {**rw.params, **(params or {})}, options or {})
    res = rw.func(m, Editor(view.graph, rule_id="direct", anchor=node, provenance={}))
    view.graph.cleanup().toposort()
    out = ir.export_onnx(view.graph)
    out.ir_version = model.ir_version
    del out.opset_import[:]
    out.opset_import.extend(model.opset_import)
    del out.graph.value_info[:]
    out = onnx.shape_inference.infer_shapes(out)
    onnx.checker.check_model(out)
    return Applied(out, [res.detail], [], list(res.io_changes), [res.contract])


@pytest.mark.parametrize("via", ["transpose", "reshape_transpose"])
def test_naf004_output_through_transpose(via):
    """DQ -> Transpose -> graph output: the placement calls that DequantizeLinear a float-island
    conversion (it does not look through Transpose), but the rewriter handles it exactly."""
    model = build("qdq.output_dq", {"via": via})
    dq = next(n.name for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "conv_b_QuantizeLinear_Output")
    applied = apply_direct(model, "int8_graph_output", dq)
    assert "Transpose 'transpose_out'" in applied.details[0]
    assert [o.type.tensor_type.elem_type for o in applied.model.graph.output] == [onnx.TensorProto.INT8]
    nums = compare(model, applied, {"contract": "exact"})
    assert nums.bit_exact and nums.max_abs == 0.0


def test_naf007_fold_into_conv_and_gemm():
    """Conv -> BN and Gemm -> BN (float, the Conv/Gemm feeds only the BN) fold into the weights."""
    for after, anchor in (("conv", "bn"),):
        model = build("ops.batchnorm", {"after": after})
        applied = apply_direct(model, "fold_batchnorm", anchor)
        assert "folded BatchNormalization 'bn' into Conv 'conv_a'" in applied.details[0]
        assert not any(n.op_type == "BatchNormalization" for n in applied.model.graph.node)
        nums = compare(model, applied, {"contract": "tolerance", "rtol": 1e-5, "atol": 1e-6})
        assert nums.ok, nums
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,6] x) => (float[2,3] y) {
        w = Constant <value = float[3,6] {0.1,-0.2,0.3,0.4,-0.5,0.6, 0.7,0.8,-0.9,1.0,1.1,-1.2, -0.3,0.2,0.1,0.05,0.4,-0.6}> ()
        c = Constant <value = float[3] {0.5, -1.0, 0.25}> ()
        h = Gemm <transB = 1, alpha = 0.5, beta = 2.0> (x, w, c)
        s = Constant <value = float[3] {1.5, 0.5, 2.0}> ()
        b = Constant <value = float[3] {0.1, 0.2, -0.3}> ()
        m = Constant <value = float[3] {0.3, -0.1, 0.2}> ()
        v = Constant <value = float[3] {1.2, 0.8, 0.5}> ()
        y = BatchNormalization (h, s, b, m, v)
    }
    """
    model = onnx.shape_inference.infer_shapes(onnx.parser.parse_model(text))
    bn = GraphView(model).nodes[-1].name
    applied = apply_direct(model, "fold_batchnorm", bn)
    assert "into Gemm" in applied.details[0]
    nums = compare(model, applied, {"contract": "tolerance", "rtol": 1e-5, "atol": 1e-6})
    assert nums.ok, nums


def test_naf007_mul_add_form_and_qdq_refusal():
    model = build("ops.batchnorm", {"after": "relu"})
    applied = apply_direct(model, "fold_batchnorm", "bn", params={"form": "mul_add"})
    assert "as Mul + Add" in applied.details[0]
    assert compare(model, applied, {"contract": "tolerance", "rtol": 1e-5, "atol": 1e-6}).ok
    with pytest.raises(NearMiss, match="calibrated"):
        apply_direct(build("ops.batchnorm", {"after": "add", "qdq": True}), "fold_batchnorm", "bn", params={"form": "mul_add"})


@pytest.mark.parametrize("qdq", [False, True])
def test_naf008_slice_subsampling(qdq):
    model = build("ops.depthwise", {"then": "pw_k3", "qdq": qdq})
    applied = apply_direct(model, "depthwise_stride2", "dw", params={"subsample": "slice"})
    assert "a Slice with steps [2, 2]" in applied.details[0]
    assert compare(model, applied, {"contract": "exact"}).bit_exact


def test_naf006_qdq_is_exact_with_ort_fusions_too():
    """With onnxruntime's QDQ fusions on (QLinearMul/QLinearAdd), the rewrite is still bit-exact."""
    model = build("ops.sub_const", {"qdq": True, "quant_sub": True})
    applied = apply_rule(model, "NAF006")
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        nums = compare(model, applied, {"contract": "exact"}, level=level)
        assert nums.bit_exact, (level, nums)


def test_naf010_weights_match_textbook_depth_to_space():
    """The one-hot weights reproduce the rank-6 Reshape/Transpose/Reshape definition of both modes."""
    from fixer.rewriters.ops import d2s_weights

    rng = np.random.default_rng(0)
    for mode in ("DCR", "CRD"):
        for b, c in ((2, 3), (3, 2), (4, 1)):
            x = rng.standard_normal((1, c * b * b, 3, 5)).astype(np.float32)
            n, ch, h, w = x.shape
            if mode == "DCR":
                ref = x.reshape(n, b, b, c, h, w).transpose(0, 3, 4, 1, 5, 2).reshape(n, c, h * b, w * b)
            else:
                ref = x.reshape(n, c, b, b, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c, h * b, w * b)
            for grouped in (False, True):
                wts, group = d2s_weights(c, b, mode, grouped)
                cin_g = ch // group
                out = np.zeros_like(ref)
                for g in range(group):
                    for ci in range(cin_g):
                        k = g * cin_g + ci
                        for co in range(wts.shape[1]):
                            out[:, g * wts.shape[1] + co] += np.kron(x[:, k], np.ones((1, 1))).repeat(b, 1).repeat(b, 2) * np.tile(wts[k, co], (h, w))
                np.testing.assert_array_equal(out, ref)


# ------------------------------------------------------------------------------------------------
# report (python -m tests.test_qdq_ops_rewriters)
# ------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    ort.set_default_logger_severity(3)
    only = argv[1:] or RULES
    for rule in only:
        path = ROOT / "tests" / "rule_cases" / f"{rule}.yaml"
        if not path.exists():
            continue
        for case in yaml.safe_load(path.read_text())["cases"]:
            try:
                applied, nums = run_case(rule, case)
            except AssertionError as exc:
                print(f"{rule:7s} {case['name']:34s} FAILED {exc}")
                continue
            if nums is None:
                why = applied.near_misses[0] if applied.near_misses else "trigger does not hold"
                print(f"{rule:7s} {case['name']:34s} no fire   | {why[:110]}")
            else:
                print(f"{rule:7s} {case['name']:34s} fires     | max_abs {nums.max_abs:.3g} bit_exact {nums.bit_exact} "
                      f"ok {nums.ok} SW {applied.sw_before}->{applied.sw_after} HW ratio {applied.hw_ratio_before:.2f}->{applied.hw_ratio_after:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
