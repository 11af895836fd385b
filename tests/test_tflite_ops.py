"""The TFLite operators transformers and other int8 models use (fixer/importers/tflite_ops.py): a ViT
encoder block is imported, checked against LiteRT op by op and audited with an estimated time; every
supported operator is a LiteRT builtin and is exercised by a generated model; a wrong mapping of a new
operator is refused with the operator named.

The models are made by tests/data/tflite/generate.py (int8_transformer, int8_ops, float_ops)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from fixer.importers.tflite import import_tflite, read_tflite, supported_ops
from fixer.importers.tflite_check import OP_TOLERANCE_LSB, check_import, interpreter_class
from tests.helpers import run_cli as run
from tests.test_tflite import tflite_ops

DATA = Path(__file__).resolve().parent / "data" / "tflite"
needs_interpreter = pytest.mark.skipif(interpreter_class() is None,
                                       reason="no TFLite interpreter installed (pip install 'nafix[test]')")

#: What a quantized ViT / DeiT / MobileViT encoder is made of in TFLite (LayerNorm, attention, GELU MLP).
TRANSFORMER_OPS = {"MEAN", "SUB", "MUL", "ADD", "RSQRT", "SQRT", "SQUARED_DIFFERENCE", "POW", "DIV", "EXP", "LOG",
                   "SUM", "REDUCE_MAX", "REDUCE_MIN", "BATCH_MATMUL", "FULLY_CONNECTED", "SOFTMAX", "GELU", "TANH",
                   "LOGISTIC", "GATHER", "SELECT", "SELECT_V2", "SPLIT", "SPLIT_V", "TRANSPOSE", "STRIDED_SLICE",
                   "RESHAPE", "CONCATENATION", "QUANTIZE", "DEQUANTIZE", "CONV_2D", "DEPTHWISE_CONV_2D", "HARD_SWISH"}
#: Supported operators no committed model uses: each shares its handler with one that is tested
#: (ARG_MIN: ARG_MAX, RELU_N1_TO_1: RELU6, SPLIT_V: SPLIT); SHAPE is folded (the real pair models use it).
SHARED_HANDLERS = {"ARG_MIN", "RELU_N1_TO_1", "SPLIT_V", "SHAPE"}


def test_transformer_ops_are_supported_litert_builtins():
    import tflite

    builtins = {k for k in vars(tflite.BuiltinOperator) if not k.startswith("_")}
    assert set(supported_ops()) <= builtins
    assert TRANSFORMER_OPS <= set(supported_ops()), sorted(TRANSFORMER_OPS - set(supported_ops()))


def test_every_supported_op_is_exercised_by_a_generated_model():
    used = set()
    for path in DATA.glob("*.tflite"):
        if path.stem not in ("custom_op", "flex_op", "float16", "unsupported_op", "hybrid"):
            used |= set(tflite_ops(path))
    assert used <= set(supported_ops())
    assert set(supported_ops()) - used == SHARED_HANDLERS


def test_transformer_block_imports_the_layer_norm_and_attention():
    imp = read_tflite(DATA / "int8_transformer.tflite")
    onnx.checker.check_model(imp.model)
    counts = imp.op_counts
    assert counts["BATCH_MATMUL"] == 2 and counts["RSQRT"] == 2 and counts["GELU"] == 1 and counts["SOFTMAX"] == 1
    by_op: dict[str, list[str]] = {}
    for n in imp.model.graph.node:
        props = {p.key: p.value for p in n.metadata_props}
        by_op.setdefault(props.get("tflite.op", ""), []).append(n.op_type)
    assert by_op["RSQRT"].count("Pow") == 2 and "Reciprocal" not in by_op["RSQRT"]  # one node per RSQRT
    assert "Erf" in by_op["GELU"] and by_op["BATCH_MATMUL"].count("MatMul") == 2
    # adj_y transposes the int8 keys before they are dequantized (Q -> Transpose -> DQ)
    prod = {o: n for n in imp.model.graph.node for o in n.output}
    mm = [n for n in imp.model.graph.node if n.op_type == "MatMul"]
    k_dq = prod[mm[0].input[1]]
    assert k_dq.op_type == "DequantizeLinear" and prod[k_dq.input[0]].op_type == "Transpose"


@needs_interpreter
def test_transformer_block_audits_with_an_estimate(tmp_path, capsys):
    model = tmp_path / "vit_block.tflite"
    shutil.copy(DATA / "int8_transformer.tflite", model)
    code, out, err = run(["audit", model, "--format", "json"], capsys)
    assert code == 0, err
    row = json.loads(out)["models"][0]
    assert row["error"] is None and row["source_format"] == "tflite"
    check = row["import_check"]
    assert check["ok"] and check["op_max_lsb"] <= OP_TOLERANCE_LSB and check["ops_checked"] >= 35, check
    est = row["estimate"]
    assert est["epochs"] > 0 and est["latency_ms"] > 0 and est["latency"]["estimated"] is True
    assert len(row["epochs"]) == est["epochs"] and all(e["ms"] >= 0 for e in row["epochs"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vit_block.tflite"]


@needs_interpreter
def test_float_ops_match_the_interpreter_and_a_wrong_one_is_caught():
    imp = read_tflite(DATA / "float_ops.tflite")
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in imp.model.graph.node)
    check = check_import(imp, imp.data, samples=2)
    assert check.ok and len(check.outputs) == 13, check.reason
    assert all(o.max_rel <= 1e-5 for o in check.outputs), check.summary()
    # FILL, ZEROS_LIKE, RANGE and the constant GREATER_EQUAL are folded: no node carries them
    stamped = {p.value for n in imp.model.graph.node for p in n.metadata_props if p.key == "tflite.op"}
    assert not stamped & {"FILL", "ZEROS_LIKE", "RANGE", "GREATER_EQUAL"} and "FLOOR_MOD" in stamped
    floor = next(n for n in imp.model.graph.node if n.op_type == "Floor" and
                 any(p.value == "FLOOR_DIV" for p in n.metadata_props))
    floor.op_type = "Ceil"
    check = check_import(imp, imp.data)
    assert not check.ok and "'floor_div'" in check.reason


@needs_interpreter
@pytest.mark.parametrize("tflite_op,break_it", [
    ("SELECT_V2", lambda n: n.input.__setitem__(slice(1, 3), [n.input[2], n.input[1]])),
    ("MIRROR_PAD", lambda n: n.attribute.append(onnx.helper.make_attribute("mode", "edge"))),
    ("SQUARED_DIFFERENCE", lambda n: setattr(n, "op_type", "Add")),
    ("NEG", lambda n: setattr(n, "op_type", "Identity")),
])
def test_a_wrong_mapping_of_a_new_op_is_refused_with_the_op_named(tflite_op, break_it):
    imp = read_tflite(DATA / "int8_ops.tflite")
    kinds = {"SELECT_V2": "Where", "MIRROR_PAD": "Pad", "SQUARED_DIFFERENCE": "Sub", "NEG": "Neg"}
    node = next(n for n in imp.model.graph.node if n.op_type == kinds[tflite_op]
                and any(p.key == "tflite.op" and p.value == tflite_op for p in n.metadata_props))
    if tflite_op == "MIRROR_PAD":
        node.attribute.remove(next(a for a in node.attribute if a.name == "mode"))
    break_it(node)
    check = check_import(imp, imp.data)
    assert not check.ok and tflite_op in check.reason and "LSB" in check.reason, check.reason


@needs_interpreter
def test_neg_negates_the_integers_whatever_the_scales():
    """TFLite's int8 NEG negates the stored integers (-(-128) wraps to -128) and ignores the two tensors'
    scales; the import reproduces that, bit for bit, also for parameters that do not mirror each other."""
    from tests.data.tflite.generate import Model

    m = Model(seed=0)
    x = m.act("x", (1, 32, 32), 0.05, 3)
    y = m.act("y", (1, 32, 32), 0.02, -7)
    m.op("NEG", [x], [y])
    m.inputs, m.outputs = [x], [y]
    data = m.build()
    imp = import_tflite(data)
    from fixer.importers.tflite_check import seeded_inputs

    assert (seeded_inputs(imp, seed=0, samples=1)[0]["x"] == -128).any()  # the wrap is exercised
    check = check_import(imp, data)
    assert check.ok and check.op_max_lsb == 0 and check.outputs[0].exact_fraction == 1.0, check.summary()


def test_space_to_batch_conv_batch_to_space_is_one_dilated_conv():
    """SPACE_TO_BATCH_ND -> DEPTHWISE_CONV_2D -> BATCH_TO_SPACE_ND (an older converter's dilated conv) is
    imported as one Conv with dilations = the block; with another operator between them, the general
    Pad/Reshape/Transpose form stays."""
    imp = read_tflite(DATA / "int8_ops.tflite")
    props = [({p.key: p.value for p in n.metadata_props}, n) for n in imp.model.graph.node]
    dilated = [(d, n) for d, n in props if n.op_type == "Conv" and
               [a.ints for a in n.attribute if a.name == "dilations"][0] == [2, 2]]
    assert len(dilated) == 1
    d, n = dilated[0]
    assert d["tflite.op"] == "DEPTHWISE_CONV_2D" and "SPACE_TO_BATCH_ND" in d["nafix.tflite.fused"]
    assert [a.ints for a in n.attribute if a.name == "pads"][0] == [2, 2, 2, 2]
    general = {n.op_type for d, n in props if d.get("tflite.op") in ("SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND")}
    assert {"Reshape", "Transpose", "Slice"} <= general


@needs_interpreter
def test_token_id_inputs_are_fed_in_range():
    """EMBEDDING_LOOKUP / GATHER indexed by a graph input: the check feeds it indices the table has (the
    interpreter refuses others), and the lookups, TOPK_V2 and the dequantizing per-row lookup match LiteRT."""
    from fixer.importers.tflite_check import seeded_inputs

    imp = read_tflite(DATA / "int8_text.tflite")
    assert imp.index_bounds == {"token_ids": 50, "positions": 12}
    for feed in seeded_inputs(imp, seed=0, samples=3):
        assert 0 <= feed["token_ids"].min() and feed["token_ids"].max() < 50 and feed["positions"].max() < 12
        assert len(set(feed["token_ids"].tolist())) > 3
    check = check_import(imp, imp.data, samples=3)
    assert check.ok and check.op_max_lsb == 0, check.summary()
    assert {o.name: o.exact_fraction for o in check.outputs} == {"topk_values": 1.0, "topk_indices": 1.0,
                                                                 "dense_embedding": 1.0}
