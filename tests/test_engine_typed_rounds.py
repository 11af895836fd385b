"""A round whose rewriters typed every value they created or changed skips ONNX shape inference
(fixer.engine.typed_export): the same model, byte for byte, as the round trip through inference."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import fixer.engine as eng
from fixer.engine import run_engine
from fixer.npu.profile import load_profile
from fixer.rules import load_rules
from fixer.shapes import refresh_shapes
from tests.builders import build

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"
PROFILE = load_profile()
RULES = load_rules()


def _models():
    out = [pytest.param(SAMPLES / n, id=n) for n in ("denoiser_257.onnx", "movenet_like.onnx",
                                                     "uint8_default_quant.onnx", "denoiser_257_float.onnx")]
    return out


def _run(model, monkeypatch, skip: bool):
    monkeypatch.setattr(eng, "SKIP_TYPED_INFERENCE", skip)
    calls = []
    real = eng.reinfer
    monkeypatch.setattr(eng, "reinfer", lambda m: calls.append(1) or real(m))
    r = run_engine(model, RULES, profile=PROFILE)
    return r, len(calls)


@pytest.mark.parametrize("path", _models())
def test_skipping_inference_changes_nothing(path, monkeypatch):
    model = refresh_shapes(onnx.load(str(path)))  # as nafix loads it: inference's value_info
    inferred, n_inferred = _run(model, monkeypatch, False)
    typed, n_typed = _run(model, monkeypatch, True)
    assert typed.model.SerializeToString() == inferred.model.SerializeToString()
    assert (typed.changes, typed.near_misses, typed.rounds, typed.ms_saved) == \
        (inferred.changes, inferred.near_misses, inferred.rounds, inferred.ms_saved)
    assert typed.estimate == inferred.estimate
    assert n_typed <= n_inferred
    if path.name in ("denoiser_257.onnx", "movenet_like.onnx"):  # rounds with typed rewrites: inference skipped
        assert inferred.changes and n_typed < n_inferred


def test_a_chain_round_skips_inference_and_matches_it(monkeypatch):
    """A QDQ chain with NAF006 on every 4th block (the bench's chains, small): the rewriter types
    every value it makes, so no round infers, and the model is inference's to the byte."""
    model = refresh_shapes(build("qdq.qdq_sub_chain", {"blocks": 12}))
    inferred, _ = _run(model, monkeypatch, False)
    typed, n_typed = _run(model, monkeypatch, True)
    assert inferred.changes and n_typed == 0
    assert typed.model.SerializeToString() == inferred.model.SerializeToString()


def test_a_value_typed_unlike_inference_is_inferred(monkeypatch):
    """A rewriter that states a shape inference would not give: the round infers (the model then
    holds inference's types, not the rewriter's)."""
    from fixer.rewriters import REWRITERS

    model = refresh_shapes(build("qdq.qdq_sub_chain", {"blocks": 4}))
    rid = next(r.rewriter for r in RULES if r.id == "NAF006")
    real = REWRITERS[rid].func

    def wrong(match, ed):
        res = real(match, ed)
        for n in ed.created:
            for t in n.outputs:
                if t.shape is not None:
                    t.shape = [d + 1 for d in t.shape]  # one more of everything: not what inference gives
        return res

    from dataclasses import replace

    monkeypatch.setitem(REWRITERS, rid, replace(REWRITERS[rid], func=wrong))
    typed, n_typed = _run(model, monkeypatch, True)
    assert typed.changes and n_typed >= 1
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in typed.model.graph.value_info}
    made = {n for c in typed.changes for n in c.new_nodes}
    outs = [o for n in typed.model.graph.node if n.name in made for o in n.output]
    checked = [o for o in outs if o in shapes and len(shapes[o]) == 4]
    assert checked and all(shapes[o] == [1, 4, 6, 6] for o in checked)


def test_a_template_filled_by_running_is_not_taken_for_inference():
    """Value_info appended after inference's (an onnxruntime run filled it) is not inference's own."""
    model = refresh_shapes(build("qdq.qdq_sub_chain", {"blocks": 4}))
    assert eng._holds_inferred(model)
    vis = list(model.graph.value_info)
    del model.graph.value_info[:]
    model.graph.value_info.extend(vis[1:] + vis[:1])  # one entry moved to the end
    assert not eng._holds_inferred(model)


def _wrapped(monkeypatch, after):
    """NAF006's rewriter, then ``after(match, ed)``."""
    from dataclasses import replace

    from fixer.rewriters import REWRITERS

    rid = next(r.rewriter for r in RULES if r.id == "NAF006")
    real = REWRITERS[rid].func

    def func(match, ed):
        res = real(match, ed)
        after(match, ed)
        return res

    monkeypatch.setitem(REWRITERS, rid, replace(REWRITERS[rid], func=func))


def test_a_constant_edited_in_place_makes_the_round_infer(monkeypatch):
    from fixer import ir

    model = refresh_shapes(build("qdq.qdq_sub_chain", {"blocks": 4}))

    def touch(match, ed):
        c = next(t for n in match.view.nodes for t in n.inputs if isinstance(t, ir.Constant))
        c.values = c.values.copy()  # the same values, set anew: an edit all the same

    _wrapped(monkeypatch, touch)
    typed, n_typed = _run(model, monkeypatch, True)
    assert typed.changes and n_typed >= 1


def test_a_type_set_on_a_value_of_an_untouched_node_makes_the_round_infer(monkeypatch):
    model = refresh_shapes(build("qdq.qdq_sub_chain", {"blocks": 4}))
    first = model.graph.node[0]
    name = first.output[0]
    want = next([d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in model.graph.value_info if vi.name == name)

    def retype(match, ed):
        t = next(n for n in match.view.nodes if n.name == first.name).outputs[0]
        t.shape = [d + 1 for d in t.shape]

    _wrapped(monkeypatch, retype)
    typed, n_typed = _run(model, monkeypatch, True)
    assert typed.changes and n_typed >= 1
    got = next([d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in typed.model.graph.value_info
               if vi.name == name)
    assert got == want  # inference's shape, not the one set by hand
