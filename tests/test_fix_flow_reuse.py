"""Issue 13: a fix does not redo work it already did (rules and profile parsed once per process, the
analysis before hands its view and placement to the engine, the analysis after takes the engine's),
and what it reports is what a fresh analysis of the same models says."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx

from fixer.analysis import analyze_model
from fixer.api import FixOptions, fix
from fixer.npu.profile import load_profile
from fixer.rules import load_rules

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"


def _figures(a):
    return (a.estimate.as_dict(), [(p.name, p.unit, p.kernel, [r.text() for r in p.reasons]) for p in a.placement.nodes],
            a.memory, [r.text() for r in a.findings])


def test_the_analyses_of_a_fix_equal_fresh_analyses_of_the_same_models():
    profile = load_profile()
    reused = 0
    for name in ("movenet_like.onnx", "denoiser_257.onnx", "movenet_like_float.onnx"):
        r = fix(SAMPLES / name, FixOptions(dry_run=True))
        assert r.before.view is None  # handed to the engine, which edited it
        assert _figures(r.before) == _figures(analyze_model(onnx.load(str(SAMPLES / name)), profile=profile))
        if r.after is not None:
            fresh = analyze_model(r.engine.model, profile=profile)
            assert _figures(r.after) == _figures(fresh), name
            assert len(r.after.view.nodes) == len(fresh.view.nodes)
            reused += r.engine.view is not None and r.after.view is r.engine.view
    assert reused  # the engine's own view of the model it returned served the analysis after


def test_rules_and_profile_are_parsed_once_and_again_when_their_text_changes(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    src = ROOT / "rules" / "NAF003-bilinear-resize.yaml"
    text = src.read_text().replace("id: NAF003", "id: TST903")
    (rules / "TST903-bilinear-resize.yaml").write_text(text)
    first = {r.id: r for r in load_rules([rules])}
    again = {r.id: r for r in load_rules([rules])}
    assert again["TST903"] is first["TST903"] and again["NAF001"] is first["NAF001"]
    (rules / "TST903-bilinear-resize.yaml").write_text(text.replace("summary: >-\n", "summary: >-\n  Changed.\n", 1))
    changed = {r.id: r for r in load_rules([rules])}
    assert changed["TST903"] is not first["TST903"] and changed["TST903"].summary.startswith("Changed.")
    assert changed["NAF001"] is first["NAF001"]

    prof = tmp_path / "p.yaml"
    shutil.copy(ROOT / "fixer" / "npu" / "profiles" / "stm32n6.yaml", prof)
    p1 = load_profile(str(prof))
    assert load_profile(str(prof)) is p1
    assert load_profile(str(prof), core="2.2") is not p1
    prof.write_text(prof.read_text() + "\n# edited\n")
    assert load_profile(str(prof)) is not p1
