"""The gate runs the fixed model only below what is provably equal to the original
(``verify.proven_equal``): the part's outputs must be bit-identical to the whole fixed model's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fixer.gate.check as gate_check
import fixer.gate.contracts as gate_contracts
import fixer.gate.parts as gate_parts
import fixer.gate.runs as gate_runs
from fixer.api import FixOptions, fix
from fixer.rewriters import IoChange

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted(p for p in (ROOT / "sample_models").glob("*.onnx"))


@pytest.fixture(autouse=True)
def _any_part(monkeypatch):
    """Parts of any size (the real threshold keeps small models whole, for speed only)."""
    monkeypatch.setattr(gate_parts, "PART_MAX_FRACTION", 1.0)


def _spy(monkeypatch):
    """Wrap the part's runs: each one also runs the whole fixed model on the same feed; returns the
    list of (names, whole-model values, part values) per input set."""
    seen = []
    real = gate_parts._PartRun.run

    def run(self, ffeed, vals):
        got = real(self, ffeed, vals)
        if not hasattr(self, "_whole"):
            self._whole = gate_runs.session(gate_runs._with_outputs(self.fixed, self.names))
        seen.append((list(self.names), self._whole.run(self.names, dict(ffeed)), got,
                     len(self.fp.part.model.graph.node), len(self.fixed.graph.node)))
        return got

    monkeypatch.setattr(gate_parts._PartRun, "run", run)
    return seen


def test_the_part_computes_what_the_whole_fixed_model_computes_bit_for_bit_on_the_sample_models(monkeypatch):
    seen = _spy(monkeypatch)
    pruned = set()
    for p in SAMPLES:
        before = len(seen)
        r = fix(p, FixOptions(dry_run=True))
        if len(seen) > before:
            pruned.add(p.name)
            assert r.verification is not None
        for names, whole, part, n_part, n_all in seen[before:]:
            assert n_part < n_all
            for n, a, b in zip(names, whole, part):
                a, b = np.asarray(a), np.asarray(b)
                assert a.dtype == b.dtype and a.shape == b.shape, (p.name, n)
                assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), (p.name, n)
    assert pruned, "no sample model ran the gate on a part of the fixed model"


def _chain(scale_b=0.5, alpha=0.1):
    """x -> Mul(a) -> LeakyRelu -> Mul(b) -> y, with a side output of the first Mul."""
    nodes = [helper.make_node("Mul", ["x", "a"], ["t1"], name="m1"),
             helper.make_node("LeakyRelu", ["t1"], ["t2"], name="lr", alpha=alpha),
             helper.make_node("Mul", ["t2", "b"], ["y"], name="m2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
                           helper.make_tensor_value_info("t1", TensorProto.FLOAT, [1, 4])],
                          [numpy_helper.from_array(np.full((1,), 2.0, np.float32), "a"),
                           numpy_helper.from_array(np.full((1,), scale_b, np.float32), "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_proven_only_identical_nodes_on_proven_inputs():
    orig = _chain()
    same, rest = gate_parts.proven_equal(orig, _chain(), {})
    assert not rest and {"x", "a", "b", "t1", "t2", "y"} <= same
    # a changed attribute: that node and everything below it is not proven
    same, rest = gate_parts.proven_equal(orig, _chain(alpha=0.2), {})
    assert [n.name for n in rest] == ["lr", "m2"] and "t1" in same and not {"t2", "y"} & same
    # a changed initializer: its reader is not proven
    same, rest = gate_parts.proven_equal(orig, _chain(scale_b=0.25), {})
    assert [n.name for n in rest] == ["m2"] and "b" not in same and "t2" in same
    # an input whose interface a rule changed: nothing that reads it is proven
    ch = IoChange("x", "input", "int8", 0.1, 0, "float32")
    same, rest = gate_parts.proven_equal(orig, _chain(), {"x": ch})
    assert len(rest) == 3 and "x" not in same


def test_the_part_is_fed_the_originals_values_at_its_frontier():
    fp = gate_parts.fixed_part(_chain(), _chain(alpha=0.2), {}, ["y", "t1"])
    assert fp is not None and fp.frontier == ("t1",)
    assert [n.name for n in fp.part.model.graph.node] == ["lr", "m2"]


def test_a_part_of_most_of_the_model_runs_the_whole_model(monkeypatch):
    monkeypatch.setattr(gate_parts, "PART_MAX_FRACTION", 0.5)
    assert gate_parts.fixed_part(_chain(), _chain(alpha=0.2), {}, ["y", "t1"]) is None  # 2 of 3 nodes
    assert gate_parts.fixed_part(_chain(), _chain(scale_b=0.25), {}, ["y", "t1"]) is not None  # 1 of 3


def test_no_part_with_subgraphs_or_when_nothing_is_proven():
    orig = _chain()
    sub = helper.make_graph([helper.make_node("Identity", ["t1"], ["o"])], "s", [],
                            [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, 4])])
    with_if = onnx.ModelProto()
    with_if.CopyFrom(orig)
    with_if.graph.initializer.append(numpy_helper.from_array(np.array(True), "c"))
    with_if.graph.node.append(helper.make_node("If", ["c"], ["z"], then_branch=sub, else_branch=sub))
    assert gate_parts.proven_equal(orig, with_if, {}) is None
    ch = IoChange("x", "input", "int8", 0.1, 0, "float32")
    assert gate_parts.fixed_part(orig, _chain(alpha=0.2), {"x": ch}, ["y", "t1"]) is None


def test_a_wrong_rewrite_below_the_frontier_is_still_rejected():
    orig = _chain()
    v = gate_check.verify(orig, _chain(alpha=0.2), contract=gate_contracts.VerifyContract("exact"), rules=["X"])
    assert not v.ok and [o.name for o in v.outputs if not o.ok] == ["y"]
    v = gate_check.verify(orig, _chain(), contract=gate_contracts.VerifyContract("exact"), rules=["X"])
    assert v.ok


def test_a_part_onnxruntime_cannot_run_fails_the_gate_as_the_whole_model_does():
    orig = _chain()
    fixed = _chain(alpha=0.2)
    # Mul of (1, 4) by (3,): no broadcast; the part fails, the whole model runs and fails the gate
    fixed.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones((3,), np.float32), "b"))
    v = gate_check.verify(orig, fixed, contract=gate_contracts.VerifyContract("exact"), rules=["X"])
    assert not v.ok and v.outputs[0].name == "<model>", v.outputs[0].detail
