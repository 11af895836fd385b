"""Rules and near-misses ranked by estimated ms saved (issue 35, item 3): the engine credits each
rule that changed the model with the estimated time it saved, near-misses carry their figures, and
the fix report lists both most-saved first."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from fixer.api import FixOptions, analyze_model, fix
from fixer.engine import NearMissReport, rank_near_misses, run_engine
from fixer.npu.profile import load_profile
from fixer.report_data import fix_dict
from fixer.rules import load_rules
from tests.builders import build

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"
PROFILE = load_profile()
RULES = {r.id: r for r in load_rules()}


def test_a_one_rule_round_credits_the_rule_with_the_whole_estimated_saving():
    model = build("resize.resize", {"c": 8, "hw": [48, 48], "scale": 2, "qdq": True})
    before = analyze_model(model, profile=PROFILE).estimate
    res = run_engine(model, [RULES["NAF003"]], profile=PROFILE)
    after = analyze_model(res.model, profile=PROFILE).estimate
    assert set(res.ms_saved) == {"NAF003"}
    assert res.ms_saved["NAF003"] == pytest.approx(before.latency_ms - after.latency_ms, abs=1e-6)
    assert res.ms_saved["NAF003"] > 0
    assert res.rules_ranked == [("NAF003", res.ms_saved["NAF003"])]


def _two_branches() -> onnx.ModelProto:
    """One model, two independent QDQ branches: a bilinear Resize (NAF003) and a 257-output Conv (NAF001)."""
    from onnx import compose

    m1 = build("resize.resize", {"c": 8, "hw": [48, 48], "scale": 2, "qdq": True})
    m2 = compose.add_prefix(build("channels.conv", {"cin": 16, "cout": 257, "k": 1, "hw": [16, 16], "qdq": True,
                                                    "relu": True}), "b_")
    m2.ir_version = m1.ir_version
    del m2.opset_import[:]
    m2.opset_import.extend(m1.opset_import)
    return compose.merge_models(m1, m2, io_map=[])


def test_rules_of_one_round_are_credited_apart_and_ranked_by_ms_saved():
    """Two rules in one round: each is credited with its own trial (the round restricted to its
    changes, which is the rule run alone), and the larger saving ranks first."""
    model = _two_branches()
    both = run_engine(model, [RULES["NAF001"], RULES["NAF003"]], profile=PROFILE)
    assert set(both.rules_applied) == {"NAF001", "NAF003"}
    for rid in ("NAF001", "NAF003"):
        alone = run_engine(model, [RULES[rid]], profile=PROFILE)
        assert both.ms_saved[rid] == pytest.approx(alone.ms_saved[rid], abs=1e-6) and alone.ms_saved[rid] > 0
    ranked = both.rules_ranked
    assert [m for _, m in ranked] == sorted((m for _, m in ranked), reverse=True)
    assert [c.rule for c in both.changes_ranked()] == sorted((c.rule for c in both.changes),
                                                              key=[r for r, _ in ranked].index)


def test_a_guard_near_miss_states_both_estimated_times_and_ranks_by_them():
    model = build("resize.resize", {"c": 8, "hw": [6, 9], "scale": 2, "qdq": True})
    before = analyze_model(model, profile=PROFILE).estimate
    res = run_engine(model, [RULES["NAF003"]], profile=PROFILE)
    [n] = [n for n in res.near_misses if n.rule == "NAF003"]
    assert n.ms_before == pytest.approx(before.latency_ms, abs=1e-9)
    assert n.ms_after > n.ms_before and n.ms_saved == pytest.approx(n.ms_before - n.ms_after)
    assert f"{n.ms_before:.3f} ms to {n.ms_after:.3f} ms" in n.reason


def test_near_misses_are_ranked_most_at_stake_first_and_unestimated_last():
    a = NearMissReport("NAF001", "a", "Conv", "r", node_ms=0.5)
    b = NearMissReport("NAF003", "b", "Resize", "r", ms_before=2.0, ms_after=2.5)  # a cost: -0.5
    c = NearMissReport("NAF015", "c", "Conv", "r", node_ms=3.0)
    d = NearMissReport("NAF002", "d", "Conv", "r")
    e = NearMissReport("NAF009", "e", "Relu", "r", node_ms=0.5)
    assert rank_near_misses([d, a, b, c, e]) == [c, a, e, b, d]


def test_a_precondition_near_miss_carries_its_nodes_estimated_ms():
    """A near-miss whose precondition failed names no 'after'; it carries the estimated ms of its
    node's SW/hybrid epochs, the most a rewrite there could save."""
    from fixer.engine import _node_ms

    model = onnx.load(str(SAMPLES / "movenet_like.onnx"))
    a = analyze_model(model, profile=PROFILE)
    sw = [g for g in a.estimate.groups if g.unit != "HW"]
    assert sw
    name = sw[0].nodes[0]
    want = sum(a.estimate.latency.epoch_ms[i] for i, g in enumerate(a.estimate.groups)
               if g.unit != "HW" and name in g.nodes)
    assert _node_ms(a.estimate, name) == pytest.approx(want) and want > 0
    assert _node_ms(a.estimate, "no such node") is None


def test_the_fix_report_lists_rules_by_estimated_ms_saved(tmp_path):
    r = fix(SAMPLES / "movenet_like.onnx", FixOptions(dry_run=True))
    d = fix_dict(r)
    [row] = d["rules"]
    saved = r.before.estimate.latency_ms - r.final.estimate.latency_ms
    assert row["rule"] == "NAF003" and row["changes"] == 3 and row["ms_saved"] == pytest.approx(saved, abs=2e-3)
    assert [c["rule"] for c in d["changes"]] == ["NAF003"] * 3
    from fixer.report import fix_renderables

    text = "\n".join(str(x) for x in fix_renderables(r))
    assert f"rules by estimated time saved: NAF003 {row['ms_saved']:.3f} ms" in text


def test_the_zoo_summary_ranks_the_rules_that_would_help_by_the_estimated_ms_they_address():
    """audit's "rules that would help": each with the estimated ms of the SW/hybrid epochs it
    addresses (at most what it could save), most first."""
    from fixer.api import AnalysisOptions, analyze_path
    from fixer.report import summary_lines
    from fixer.report_data import analysis_dict
    from fixer.zoo.summary import zoo_summary

    paths = [SAMPLES / n for n in ("movenet_like.onnx", "denoiser_257.onnx", "classifier_softmax.onnx")]
    rows = [dict(analysis_dict(analyze_path(p, AnalysisOptions())), path=str(p)) for p in paths]
    s = zoo_summary(rows)
    ms = [r["ms"] for r in s["rules"]]
    assert ms and ms == sorted(ms, reverse=True)
    by_rule = {r["rule"]: r for r in s["rules"]}
    movenet = rows[0]
    resize_ms = sum(ep["ms"] for ep in movenet["epochs"] if ep["unit"] != "HW"
                    and any(n.startswith("resize_up") for n in ep["nodes"]))
    assert by_rule["NAF003"]["ms"] == pytest.approx(resize_ms, abs=2e-3) and resize_ms > 0
    assert any("NAF003 bilinear-resize" in line and "costing an estimated" in line for line in summary_lines(s))


@pytest.mark.parametrize("rule_id,sample", [("NAF001", "denoiser_257.onnx"), ("NAF003", "movenet_like.onnx")])
def test_a_rules_why_quotes_the_estimated_ms_it_saves_on_its_sample_model(rule_id, sample):
    """The figures a rule's why quotes for a sample model are the ones nafix estimates (a refit of the
    cost model updates them: rules/*.yaml, then nafix rules --markdown -o docs/RULES.md)."""
    import re

    why = RULES[rule_id].why
    m = re.search(rf"sample_models/{re.escape(sample)} ([0-9.]+) -> ([0-9.]+) ms", why)
    assert m, why
    r = fix(SAMPLES / sample, FixOptions(dry_run=True))
    assert rule_id in r.engine.rules_applied
    assert (f"{r.before.estimate.latency_ms:.3f}", f"{r.final.estimate.latency_ms:.3f}") == m.groups()
