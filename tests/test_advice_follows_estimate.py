"""Advice follows the estimate (issue 34): a rule change, a near-miss or a zoo-summary suggestion is
only about epochs the estimate places in SW or hybrid. A rule that is not about SW epochs (it fixes a
board hang, a compile error or a performance note: NAF002, NAF008, NAF009, NAF011, NAF014, NAF015)
may name a HW node.
Checked on the committed sample models and on every model of ../shared/models."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixer.api import AnalysisOptions, AuditOptions, analyze_path, audit
from fixer.engine import addresses_sw_epochs, run_engine
from fixer.npu.constraints import REGISTRY
from fixer.report import summary_lines
from fixer.zoo.runner import audit_dict
from fixer.rules import load_rules

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
SHARED = ROOT.parent / "shared" / "models"
RULES = load_rules()  # opt-in rules included: the zoo summary suggests them too
EXEMPT = {r.id for r in RULES if not addresses_sw_epochs(r)}


def in_sw(analysis) -> set[str]:
    """Nodes with SW or hybrid epochs in the estimate: SW nodes and the HW nodes a lowering gives
    SW/hybrid epochs of their own."""
    names = {n.name for n in analysis.placement.nodes if n.unit == "SW"}
    names.update(g.nodes[0] for g in analysis.estimate.groups if g.unit != "HW")
    return names


def check_engine_advice(path: Path) -> None:
    a = analyze_path(path, AnalysisOptions())
    allowed = in_sw(a)
    # one round of every rule (no guard: a change the guard would drop still says where the rule matched)
    res = run_engine(a.loaded.model, RULES, profile=a.profile, guard=False, max_rounds=1)
    for c in res.changes:
        assert c.rule in EXEMPT or c.node in allowed, (path.name, c)
    for n in res.near_misses:
        assert n.rule in EXEMPT or n.node in allowed, (path.name, n)


def check_summary(folder: Path) -> None:
    rep = audit_dict(audit([str(folder)], AuditOptions()), profile="stm32n6")
    by_id = {r.id: r for r in RULES}
    for s in rep["summary"]["rules"]:
        rule = by_id[s["rule"]]
        if s["rule"] in EXEMPT:  # backed by a finding or note (or epochs a noted node's lowering makes)
            keys = {f["constraint"] for m in rep["models"] if not m.get("error") for f in m["findings"]}
            keys |= {n["constraint"] for m in rep["models"] if not m.get("error") for n in m["notes"]}
            assert set(rule.fixes) & keys, s
            assert all(f in REGISTRY and REGISTRY[f].severity != "sw" for f in rule.fixes), s
        else:
            assert s["epochs"] > 0, s  # some SW/hybrid epoch it addresses
        if rule.opt_in:  # --select would drop every default rule
            assert s["command"] == f"nafix MODEL --extend-select {rule.id}", s
    for line in summary_lines(rep["summary"]):
        assert "--select " not in line, line


def test_sample_models_advice_follows_the_estimate():
    for path in sorted(SAMPLES.glob("*.onnx")):
        check_engine_advice(path)
    check_summary(SAMPLES)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is absent")
def test_shared_models_advice_follows_the_estimate():
    models = sorted(SHARED.glob("*.onnx"))
    assert models
    for path in models:
        check_engine_advice(path)
    check_summary(SHARED)


@pytest.mark.skipif(not (SHARED / "stn6__deeplab_v3_mobilenetv2_05_16_320_fft_qdq_int8.onnx").is_file(),
                    reason="../shared/models is absent")
def test_hw_resize_gets_no_bilinear_near_miss():
    """deeplab v3's 'Resize__454' is bilinear but runs on the NPU in the estimate: NAF003 used to report
    a near-miss on it ("does not fail 'resize_nearest_asymmetric'")."""
    a = analyze_path(SHARED / "stn6__deeplab_v3_mobilenetv2_05_16_320_fft_qdq_int8.onnx", AnalysisOptions())
    assert a.placement.by_name["Resize__454"].unit == "HW"
    res = run_engine(a.loaded.model, [r for r in RULES if r.id == "NAF003"], profile=a.profile)
    assert not [n for n in res.near_misses if n.node == "Resize__454"]
