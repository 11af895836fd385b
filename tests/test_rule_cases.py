"""Data-first rule tests: every case in tests/rule_cases/NAF*.yaml is run through the engine with only
its rule selected; firing cases are verified numerically with onnxruntime under the rule's contract."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx
import onnx.parser
import pytest
import yaml

from fixer.api import analyze_model
from fixer.engine import run_engine
from fixer.graph import is_quantized
from fixer.npu.profile import load_profile
from fixer.rules import load_rules
from fixer.gate import change_contracts, loosest, verify
from tests.builders import build
from tests.helpers import CASE_PROFILE_KEYS, case_profile, case_with_file_defaults

CASE_DIR = Path(__file__).parent / "rule_cases"
PROFILE = load_profile()
RULES = {r.id: r for r in load_rules()}


def _cases():
    out = []
    for f in sorted(CASE_DIR.glob("NAF*.yaml")):
        data = yaml.safe_load(f.read_text())
        for case in data["cases"]:
            case = case_with_file_defaults(data, case)
            out.append(pytest.param(data["rule"], case, id=f"{data['rule']}-{case['name']}"))
    return out


def _profile(case):
    """The case's profile without its cost model: the cases pin each rewriter's preconditions and
    numerics on toy-sized models, where an epoch's fixed cost outweighs the work a rewrite moves off
    the Cortex-M55 (a SW bilinear Resize of a 4x4 map is estimated cheaper than its HW ConvTranspose
    with a hybrid Concat and DepthToSpace), so the guard's estimated-time test, which the engine applies
    whenever the profile has a cost model, is tested in test_never_worse.py on models of its own."""
    prof = case_profile(case) if any(k in case for k in CASE_PROFILE_KEYS) else PROFILE
    return replace(prof, latency={})


def _model(case) -> onnx.ModelProto:
    if "onnx_text" in case:
        m = onnx.parser.parse_model(case["onnx_text"])
        m.ir_version = min(m.ir_version or 8, 8)
        return m
    return build(case["builder"], case.get("params"))


def test_every_rule_has_firing_and_non_firing_cases():
    by_rule: dict[str, set[bool]] = {}
    for p in _cases():
        rule, case = p.values
        by_rule.setdefault(rule, set()).add(bool(case["fires"]))
    for rid in RULES:
        assert by_rule.get(rid) == {True, False}, f"{rid} needs case file tests/rule_cases/{rid}.yaml with firing and non-firing cases"
    assert set(by_rule) <= set(RULES), f"case files for unknown rules: {set(by_rule) - set(RULES)}"


@pytest.mark.parametrize("rule_id,case", _cases())
def test_rule_case(rule_id, case):
    rule = RULES[rule_id]
    model = _model(case)
    profile = _profile(case)
    before = analyze_model(model, profile=profile)
    # Float models: the rewrite itself is tested as --quantize runs it (before quantization, where the
    # guard is off: on a float model every added node is one more SW epoch until quantized).
    res = run_engine(model, [rule], profile=profile, options={"input_type": case.get("input_type", "int8")},
                     guard=is_quantized(model))
    fired = [c for c in res.changes if c.rule == rule_id]
    assert bool(fired) == bool(case["fires"]), f"changes={res.changes} near_misses={res.near_misses}"
    if "detail" in case:
        assert any(case["detail"] in c.detail for c in fired), [c.detail for c in fired]
    if "near_miss" in case:
        reasons = [n.reason for n in res.near_misses if n.rule == rule_id]
        assert any(case["near_miss"] in r for r in reasons), reasons
    if case.get("no_near_miss"):  # advice follows the estimate: nothing to say about a node all on HW
        assert not [n for n in res.near_misses if n.rule == rule_id], res.near_misses
    if not fired:
        return
    onnx.checker.check_model(res.model)
    contract = loosest(list(change_contracts(res, RULES).values()))  # a rewriter may loosen its rule's
    v = verify(model, res.model, contract=contract, rules=[rule_id], io_changes=res.io_changes,
               samples=int(case.get("samples", 4)), seed=int(case.get("seed", 0)))
    assert v.ok, v.as_dict()
    after = analyze_model(res.model, profile=profile)
    if is_quantized(model):  # (float: every added node is one more SW epoch until quantized, as above;
        # a float model is not all SW either: a SW activation product has HW reshape epochs, matmul_float_OE)
        assert after.estimate.hw_ratio >= before.estimate.hw_ratio - 1e-9, (before.estimate, after.estimate)
    created = [n for n in res.model.graph.node if n.name in res.provenance]
    # the model really changed: new nodes, a new interface, fewer nodes, or new parameters
    assert (created or res.io_changes or len(res.model.graph.node) < len(model.graph.node)
            or {t.name for t in res.model.graph.initializer} != {t.name for t in model.graph.initializer})
    for n in created:
        assert "__nafix_" in n.name and n.doc_string == f"nafix.rule={rule_id}"
