"""The engine's index of the nodes a placement fails on each constraint (``engine._FailingIndex``)
against the full scan it replaces: the same nodes as the ``fails_constraint`` predicate on every
node, before and after a round's graph edits, and the same engine results with and without it."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from fixer import engine as engine_mod
from fixer.graph import GraphView
from fixer.npu.placement import place
from fixer.npu.profile import load_profile
from fixer.predicates import PREDICATES
from fixer.rewriters import Match
from fixer.rules import load_rules

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample_models").glob("*.onnx"))


def _triggered(rules):
    return [r for r in rules if r.when and r.when[0].predicate == "fails_constraint"]


def _scan(view, placement, rule, profile):
    """The nodes of ``view`` whose trigger holds, by calling the predicate on each (the old way)."""
    cond = rule.when[0]
    out = set()
    for node in view.nodes:
        match = Match(rule.id, node, view, placement, profile, rule.params, {})
        if PREDICATES[cond.predicate].func(node, match, **cond.params).ok:
            out.add(node.name)
    return out


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_the_index_holds_the_nodes_the_predicate_holds_on_before_and_after_edits(path):
    profile = load_profile()
    rules = load_rules()
    assert _triggered(rules)
    view = GraphView(onnx.load(str(path)))
    placement = place(view, profile)
    index = engine_mod._FailingIndex(placement)
    for rule in _triggered(rules):
        names = index.names(rule)
        assert {n.name for n in view.nodes if n.name in names} == _scan(view, placement, rule, profile), rule.id
    att = engine_mod.Engine(rules, profile=profile)._round(view, placement)  # edits ``view``
    for rule in _triggered(rules):
        names = index.names(rule)
        assert {n.name for n in view.nodes if n.name in names} == _scan(view, placement, rule, profile), rule.id
    if path.stem == "movenet_like":
        assert att.changes  # the edits above were real on at least this model


def test_other_triggers_are_not_indexed():
    rules = load_rules()
    index = engine_mod._FailingIndex(None)
    others = [r for r in rules if r.when and r.when[0].predicate != "fails_constraint"]
    assert all(index.names(r) is None for r in others)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_engine_results_equal_with_and_without_the_index(path, monkeypatch):
    profile = load_profile()
    rules = load_rules()
    model = onnx.load(str(path))

    def run():
        r = engine_mod.run_engine(model, rules, profile=profile)
        return (r.model.SerializeToString(), r.changes, r.near_misses, r.io_changes, r.rounds)

    indexed = run()
    monkeypatch.setattr(engine_mod._FailingIndex, "names", lambda self, rule: None)
    assert run() == indexed
