"""The gate's speed-ups against what they replace: the original's and the fixed model's sessions
begun together and made by the gate's shared threads (the same verdicts as sessions made one after
the other where each is waited for, the same failures, no thread left behind)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer import segments
import fixer.gate.check as gate_check
import fixer.gate.inputs as gate_inputs
import fixer.gate.parts as gate_parts
import fixer.gate.runs as gate_runs
from fixer.errors import InputError
from fixer.rules import VerifyContract


def _model(op="LeakyRelu", alpha=0.1, w_scale=1.0):
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((4, 4, 1, 1)) * 0.5 * w_scale).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["t"], name="conv", kernel_shape=[1, 1]),
             helper.make_node(op, ["t"], ["y"], name="act", **({"alpha": alpha} if op == "LeakyRelu" else {}))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _gate_threads():
    return [t for t in threading.enumerate() if t.name.startswith("nafix-segment")]


@pytest.mark.parametrize("fixed", [_model(), _model(alpha=0.2), _model(w_scale=1.001), _model(op="Relu")])
def test_sessions_made_by_the_shared_threads_give_the_verdicts_of_sessions_one_after_the_other(fixed, monkeypatch):
    orig = _model()
    shared = gate_check.verify(orig, fixed, contract=VerifyContract("exact"))
    monkeypatch.setattr(segments, "current_workers", lambda: None)  # each session made where it is waited for
    inline = gate_check.verify(orig, fixed, contract=VerifyContract("exact"))
    assert shared.as_dict() == inline.as_dict()
    assert not _gate_threads()


def test_a_fixed_model_onnxruntime_rejects_fails_the_gate_from_the_shared_threads():
    bad = _model(op="NoSuchOp")
    v = gate_check.verify(_model(), bad, contract=VerifyContract("exact"))
    assert not v.ok
    assert [c.name for c in v.outputs] == ["<model>"]
    assert "does not load in onnxruntime" in v.outputs[0].detail and "NoSuchOp" in v.outputs[0].detail
    assert not _gate_threads()


def test_an_original_onnxruntime_rejects_is_an_input_error_with_no_session_left_loading():
    with pytest.raises(InputError):
        gate_check.verify(_model(op="NoSuchOp"), _model(), contract=VerifyContract("exact"))
    assert not _gate_threads()


def _chain_pair():
    """A QDQ-free conv chain and a copy with its middle activation changed and a weight renamed."""
    rng = np.random.default_rng(9)
    def build(alpha, wname):
        inits, nodes, x = [], [], "x"
        for i in range(4):
            name = wname if i == 1 else f"w{i}"
            inits.append(numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.4).astype(np.float32), name))
            nodes.append(helper.make_node("Conv", [x, name], [f"c{i}"], name=f"conv{i}", kernel_shape=[1, 1]))
            nodes.append(helper.make_node("LeakyRelu", [f"c{i}"], [f"a{i}"], name=f"act{i}",
                                          alpha=alpha if i == 2 else 0.1))
            x = f"a{i}"
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    rng = np.random.default_rng(9)
    orig = build(0.1, "w1")
    rng = np.random.default_rng(9)
    return orig, build(0.2, "w1_new")


def test_facts_give_what_each_check_reads_of_the_graphs_itself():
    orig, fixed = _chain_pair()
    facts = gate_parts._Facts(orig, fixed)
    assert facts.o_made == gate_runs._tensor_names(orig) and facts.f_made == gate_runs._tensor_names(fixed)
    assert facts.f_const == gate_parts._computed_from_initializers(fixed)
    assert facts.o.producer == {o: n for n in orig.graph.node for o in n.output if o}
    assert facts.f.producer["a2"].name == "act2"
    for models in ((orig, fixed), (orig, orig), (fixed, orig)):
        facts = gate_parts._Facts(*models)
        alone = gate_parts.proven_equal(*models, {})
        shared = gate_parts.proven_equal(*models, {}, facts=facts)
        assert alone[0] == shared[0] and [n.name for n in alone[1]] == [n.name for n in shared[1]]
        fp_alone = gate_parts.fixed_part(*models, {}, ["a3"])
        fp_shared = gate_parts.fixed_part(*models, {}, ["a3"], proof=shared, facts=facts)
        assert (fp_alone is None) == (fp_shared is None)
        if fp_alone is not None:
            assert fp_alone.part.model == fp_shared.part.model and fp_alone.frontier == fp_shared.frontier
        rp_alone = gate_parts.rewritten_part(*models, alone, ["a3"])
        rp_shared = gate_parts.rewritten_part(*models, shared, ["a3"], facts=facts)
        assert (rp_alone is None) == (rp_shared is None)
        if rp_alone is not None:
            assert rp_alone.part.model == rp_shared.part.model and rp_alone.checked == rp_shared.checked
    # the pair above has a part and rewritten nodes: the comparisons were not all None == None
    facts = gate_parts._Facts(orig, fixed)
    proof = gate_parts.proven_equal(orig, fixed, {}, facts=facts)
    assert gate_parts.rewritten_part(orig, fixed, proof, ["a3"], facts=facts).checked == ("c1", "a2")  # conv1 reads the renamed weight


def test_the_collector_is_paused_during_a_fix_and_restored_after_it_also_on_error(monkeypatch):
    import gc
    from pathlib import Path

    from fixer import engine as engine_mod
    from fixer.api import FixOptions, fix

    sample = Path(__file__).resolve().parents[1] / "sample_models" / "movenet_like.onnx"
    seen = []
    real = engine_mod.run_engine

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(engine_mod, "run_engine", spy)
    thresholds = gc.get_threshold()
    assert gc.isenabled()
    fix(sample, FixOptions(dry_run=True))
    assert seen == [False] and gc.isenabled() and gc.get_threshold() == thresholds

    def broken(*a, **k):
        seen.append(gc.isenabled())
        raise RuntimeError("engine broke")

    monkeypatch.setattr(engine_mod, "run_engine", broken)
    with pytest.raises(RuntimeError, match="engine broke"):
        fix(sample, FixOptions(dry_run=True))
    assert seen == [False, False] and gc.isenabled() and gc.get_threshold() == thresholds
    gc.disable()  # a caller's disabled collector stays disabled
    try:
        with pytest.raises(RuntimeError):
            fix(sample, FixOptions(dry_run=True))
        assert not gc.isenabled()
    finally:
        gc.enable()


def _input_range_by_tables(model, name):
    """The gate's input range as it was looked up before (name tables of every initializer and
    Constant node, then the first QuantizeLinear reading ``name``): the reference."""
    inits = {t.name: t for t in model.graph.initializer}
    consts = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant" and n.output}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input and node.input[0] == name:
            def val(t):
                try:
                    if t in inits:
                        return numpy_helper.to_array(inits[t])
                    if t in consts and consts[t].attribute:
                        return numpy_helper.to_array(consts[t].attribute[0].t)
                except Exception:  # noqa: BLE001
                    return None
                return None
            s = val(node.input[1]) if len(node.input) > 1 else None
            z = val(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
            return gate_inputs._quantized_range(s, z)  # (the arithmetic, unchanged, is shared)
    return None


def _q_input(scale_src, zero_src, *, extra_inits=(), extra_nodes=(), second_q=None):
    """x -> QuantizeLinear(x, s, z) -> DequantizeLinear -> y, with the scale and zero-point given as
    an initializer ("init", value), a Constant node ("const", value) or left out (None)."""
    inits, nodes = list(extra_inits), list(extra_nodes)
    q_in = ["x"]
    for name, src in (("s", scale_src), ("z", zero_src)):
        if src is None:
            q_in.append("")
            continue
        kind, value = src
        q_in.append(name)
        if kind == "init":
            inits.append(numpy_helper.from_array(np.asarray(value), name))
        else:
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value))))
    while q_in and q_in[-1] == "":
        q_in.pop()
    if second_q is not None:
        nodes.append(helper.make_node("QuantizeLinear", ["x", second_q], ["q2"]))
    nodes += [helper.make_node("QuantizeLinear", q_in, ["q"]),
              helper.make_node("DequantizeLinear", ["q", q_in[1] if len(q_in) > 1 else "s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


_F, _I8, _U8 = np.float32, np.int8, np.uint8


@pytest.mark.parametrize("model", [
    _q_input(("init", _F(0.05)), ("init", _I8(3))),
    _q_input(("const", _F(0.05)), ("const", _U8(128))),
    _q_input(("init", _F(0.05)), ("const", _I8(-2))),
    _q_input(("init", _F(0.02)), None),  # no zero-point: uint8
    _q_input(("init", _F(0.0)), ("init", _I8(0))),  # zero scale
    _q_input(("init", _F(np.inf)), ("init", _I8(0))),
    _q_input(("init", np.array([0.1, 0.2], _F)), ("init", _I8(0))),  # per axis
    _q_input(("init", _F(0.1)), ("init", _F(0.0))),  # float zero-point
    _q_input(None, None),
    # a repeated initializer name: the last one counts, as in a name table
    _q_input(("init", _F(0.05)), ("init", _I8(3)), extra_inits=[numpy_helper.from_array(_F(9.0), "s")]),
    # a Constant node and an initializer of the same name: the initializer
    _q_input(("init", _F(0.05)), ("init", _I8(3)),
             extra_nodes=[helper.make_node("Constant", [], ["z"], value=numpy_helper.from_array(_I8(7)))]),
    # an earlier QuantizeLinear of x: the first one counts (its scale is missing: no range)
    _q_input(("init", _F(0.05)), ("init", _I8(3)), second_q="missing_scale"),
], ids=lambda m: None)
def test_the_input_range_is_the_one_name_tables_gave(model):
    assert gate_inputs._input_range(model, "x") == _input_range_by_tables(model, "x")
    assert gate_inputs._input_range(model, "nothing") is None


_SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "models"


@pytest.mark.skipif(not _SHARED.is_dir(), reason="../shared/models is absent")
def test_the_input_range_of_every_real_models_inputs_is_the_one_name_tables_gave():
    import onnx

    checked = 0
    for path in sorted(_SHARED.glob("*.onnx")):
        m = onnx.load(str(path))
        for i in m.graph.input:
            want = _input_range_by_tables(m, i.name)
            assert gate_inputs._input_range(m, i.name) == want, (path.name, i.name)
            checked += want is not None
    assert checked >= 10  # most of them are QDQ models with a QuantizeLinear on the input
