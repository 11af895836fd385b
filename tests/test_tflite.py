"""TFLite models in: the importer, its check against the TFLite interpreter, audit/fix of a .tflite,
bad TFLite input, and the shared real TFLite pair models (skipped when ../shared is absent).

The small models are made by tests/data/tflite/generate.py (committed, no TensorFlow needed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from fixer.api import AnalysisOptions, FixOptions, analyze_path, fix
from fixer.errors import InputError
from fixer.importers import check_loaded, is_tflite, source_format
from fixer.importers import tflite_check
from fixer.importers.tflite import import_tflite, read_tflite, supported_ops
from fixer.importers.tflite_check import OP_TOLERANCE_LSB, check_import, interpreter_class
from fixer.model_io import load_model
from tests.test_cli_audit import run

DATA = Path(__file__).resolve().parent / "data" / "tflite"
GOOD = ["movenet_like.tflite", "int8_cnn.tflite", "int8_misc.tflite", "int8_more.tflite", "int8_layout.tflite",
        "uint8_model.tflite", "int8_transformer.tflite", "int8_ops.tflite", "int8_text.tflite"]
PAIRS = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "pairs"
PAIR_MODELS = sorted(PAIRS.glob("*/*.tflite")) + sorted(PAIRS.glob("*/models/*.tflite")) if PAIRS.is_dir() else []

needs_interpreter = pytest.mark.skipif(interpreter_class() is None,
                                       reason="no TFLite interpreter installed (pip install 'nafix[test]')")


def tflite_ops(path: Path) -> list[str]:
    import tflite

    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    m = tflite.Model.GetRootAsModel(path.read_bytes(), 0)
    sg = m.Subgraphs(0)
    out = []
    for i in range(sg.OperatorsLength()):
        oc = m.OperatorCodes(sg.Operators(i).OpcodeIndex())
        out.append(names[max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())])
    return out


def test_generator_reproduces_the_committed_files(tmp_path):
    from tests.data.tflite import generate

    assert generate.main([str(tmp_path)]) == 0
    for name in generate.MODELS:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), f"{name} is stale: rerun generate.py"


@pytest.mark.parametrize("name", GOOD)
def test_import_records_origin_and_tflite_ops(name):
    path = DATA / name
    imp = read_tflite(path)
    model = imp.model
    onnx.checker.check_model(model)
    assert source_format(model) == "tflite"
    meta = {p.key: p.value for p in model.metadata_props}
    counts = json.loads(meta["nafix.tflite.op_counts"])
    assert sum(counts.values()) == len(tflite_ops(path))
    # Every TFLite operator is traceable to the ONNX nodes made from it.
    stamped = {}
    for n in model.graph.node:
        props = {p.key: p.value for p in n.metadata_props}
        if "tflite.op" in props:
            stamped.setdefault(props["tflite.op"], set()).add(props["tflite.index"])
            for part in filter(None, props.get("nafix.tflite.fused", "").split(", ")):  # a pattern read as one op
                op, index = part.split(" #")
                stamped.setdefault(op, set()).add(index)
        elif "nafix.tflite.edge" not in props:
            assert props.get("nafix.tflite.layout") in ("NHWC->NCHW", "NCHW->NHWC"), n.name
    for op in set(tflite_ops(path)) - {"TILE", "RESHAPE"}:  # folded/aliased ops may leave no node
        assert op in stamped, op
    # The graph edges keep the TFLite shapes (NHWC) and element types.
    import tflite

    m = tflite.Model.GetRootAsModel(path.read_bytes(), 0).Subgraphs(0)
    first_in = m.Tensors(m.Inputs(0))
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [int(d) for d in first_in.ShapeAsNumpy()]


def test_markers_placement_reads():
    """The documented markers (docs/TFLITE.md) that placement reads: operator, options, edges."""
    model = read_tflite(DATA / "movenet_like.tflite").model
    props = [({p.key: p.value for p in n.metadata_props}, n) for n in model.graph.node]
    resize = [(d, n) for d, n in props if n.op_type == "Resize"]
    assert len(resize) == 1 and resize[0][0]["tflite.op"] == "RESIZE_BILINEAR"
    assert json.loads(resize[0][0]["tflite.options"]) == {"AlignCorners": False, "HalfPixelCenters": True}
    assert "tflite.op=RESIZE_BILINEAR" in resize[0][1].doc_string
    first_q = next(n for d, n in props if n.op_type == "QuantizeLinear")
    assert first_q.input[0] == "input" and dict((p.key, p.value) for p in first_q.metadata_props)["tflite.op"] == "QUANTIZE"
    last_dq = next(n for n in model.graph.node if "heatmap" in n.output)
    assert last_dq.op_type == "DequantizeLinear"
    assert dict((p.key, p.value) for p in last_dq.metadata_props)["tflite.op"] == "DEQUANTIZE"
    fused = {d.get("tflite.fused_activation") for d, n in props if d.get("tflite.op") == "CONV_2D"}
    assert "RELU6" in fused
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["nafix.source_format"] == "tflite" and meta["nafix.tflite.layout"] == "NHWC"


def test_per_axis_weights_become_per_axis_dequantize():
    imp = read_tflite(DATA / "int8_cnn.tflite")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in imp.model.graph.initializer}
    convs = [n for n in imp.model.graph.node if n.op_type == "Conv"]
    prod = {o: n for n in imp.model.graph.node for o in n.output}
    assert convs
    for c in convs:
        dq = prod[c.input[1]]
        assert dq.op_type == "DequantizeLinear"
        w, scale = inits[dq.input[0]], inits[dq.input[1]]
        axis = {a.name: a.i for a in dq.attribute}.get("axis", 1)
        assert w.dtype == np.int8 and axis == 0 and scale.shape == (w.shape[0],)
    # Fused activations are the ONNX activation between the operator and its QuantizeLinear.
    relu_convs = [n for n in imp.model.graph.node
                  if any(p.key == "tflite.fused_activation" and p.value == "RELU" for p in n.metadata_props)]
    assert any(n.op_type == "Relu" for n in relu_convs)


@needs_interpreter
@pytest.mark.parametrize("name", GOOD)
def test_import_matches_the_interpreter_op_by_op(name):
    path = DATA / name
    imp = read_tflite(path)
    check = check_import(imp, path.read_bytes())
    assert check.checked and check.ok, check.reason
    assert check.ops_checked >= 5 and check.op_max_lsb <= OP_TOLERANCE_LSB
    # Every one-LSB difference is a rounding of a value (nearly) on a .5 tie.
    assert all(d < 0.1 for d in check.tie_distance_by_op.values()), check.tie_distance_by_op
    # End to end, one-LSB ties inside move a few values (a 5-class softmax: 3 of 5 exact, 2 LSB off).
    assert check.outputs and all(o.exact_fraction > 0.5 for o in check.outputs), check.summary()


@needs_interpreter
def test_float_model_imports_within_float_rounding():
    imp = read_tflite(DATA / "float_model.tflite")
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in imp.model.graph.node)
    check = check_import(imp, imp.data)
    assert check.ok and check.ops_checked == 0, check.reason
    assert check.outputs[0].max_rel <= tflite_check.FLOAT_RTOL
    # A float model has no op-by-op check: a wrong float operator must fail end to end.
    div = next(n for n in imp.model.graph.node if n.op_type == "Div")
    div.op_type = "Mul"
    check = check_import(imp, imp.data)
    assert not check.ok and "float output 'output'" in check.reason


@needs_interpreter
def test_generated_models_are_not_degenerate():
    """Values that saturate everywhere would make the comparison trivially exact."""
    Interp = interpreter_class()
    for name in GOOD:
        imp = read_tflite(DATA / name)
        it = tflite_check.make_interpreter(Interp, imp.data, preserve=True)
        feed = tflite_check.seeded_inputs(imp, seed=0, samples=1)[0]
        for d, n in zip(it.get_input_details(), imp.input_names):
            it.set_tensor(d["index"], feed[n])
        it.invoke()
        for t in imp.quantized_outputs:
            v = it.get_tensor(t)
            assert len(np.unique(v)) > 3, (name, t)


@needs_interpreter
def test_a_wrong_import_is_refused_with_the_operator_named():
    path = DATA / "int8_cnn.tflite"
    imp = read_tflite(path)
    # Break one operator: the depthwise convolution's weights change sign.
    prod = {o: n for n in imp.model.graph.node for o in n.output}
    dw = next(n for n in imp.model.graph.node if n.op_type == "Conv" and
              any(a.name == "group" and a.i > 1 for a in n.attribute))
    wname = prod[dw.input[1]].input[0]
    for t in imp.model.graph.initializer:
        if t.name == wname:
            t.CopyFrom(onnx.numpy_helper.from_array(-onnx.numpy_helper.to_array(t), wname))
    check = check_import(imp, path.read_bytes())
    assert not check.ok and "DEPTHWISE_CONV_2D" in check.reason and "LSB" in check.reason


def test_an_interpreter_crash_is_an_error_not_the_end_of_nafix(tmp_path, capsys, monkeypatch):
    """The interpreter is native code: a hostile model that parses can still crash it (a corrupt
    movenet_like did, with SIGSEGV). It runs in a child process; here the child crashes on purpose."""
    crash = tmp_path / "crash.py"
    crash.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.setattr(tflite_check, "WORKER", crash)
    model = tmp_path / "m.tflite"
    shutil.copy(DATA / "int8_cnn.tflite", model)
    good = tmp_path / "int8_more.tflite"
    shutil.copy(DATA / "int8_more.tflite", good)
    # the audit's workers check the imports: the same crash in a nafix process of its own, whose
    # workers are forked from it (this test process has loaded onnxruntime: its workers never are)
    import subprocess
    import sys

    script = ("import sys, pathlib\n"
              "from fixer.importers import tflite_check\n"
              "real, crash, model = tflite_check.check_import, pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
              "interpreter = tflite_check.WORKER\n"
              "def check(imp, data, **kw):\n"
              "    tflite_check.WORKER = crash if data == model.read_bytes() else interpreter\n"
              "    return real(imp, data, **kw)\n"
              "tflite_check.check_import = check\n"
              "from fixer.cli import main; main(sys.argv[3:])\n")
    done = subprocess.run([sys.executable, "-c", script, str(crash), str(model), "audit", str(model), str(good),
                           "--format", "json"], capture_output=True, text=True, timeout=300)
    code, out, err = done.returncode, done.stdout, done.stderr
    rows = {Path(r["path"]).name: r for r in json.loads(out)["models"]}
    monkeypatch.setattr(tflite_check, "check_import", _check_or_crash(tflite_check.check_import, model))
    assert code == 2 and "crashed on this model (signal" in rows["m.tflite"]["error"], (out, err)
    assert rows["int8_more.tflite"]["error"] is None  # the other model is still audited
    code, out, err = run([model], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "crashed on this model" in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crash.py", "int8_more.tflite", "m.tflite"]


def _check_or_crash(real_check, crashing_model: Path):
    """check_import, with the crashing child process only for ``crashing_model``."""
    def check(imp, data, **kw):
        if data == crashing_model.read_bytes():
            return real_check(imp, data, **kw)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tflite_check, "WORKER", Path(tflite_check.__file__).with_name("_tflite_worker.py"))
            return real_check(imp, data, **kw)
    return check


def test_load_model_reads_tflite_by_content(tmp_path):
    disguised = tmp_path / "model.bin"
    shutil.copy(DATA / "int8_cnn.tflite", disguised)
    assert is_tflite(disguised.read_bytes())
    loaded = load_model(disguised)
    assert loaded.imported is not None and source_format(loaded.model) == "tflite"
    assert loaded.opset >= 13


def test_no_interpreter_audit_warns_and_fix_refuses(tmp_path, monkeypatch):
    monkeypatch.setattr(tflite_check, "interpreter_class", lambda: None)
    model = tmp_path / "m.tflite"
    shutil.copy(DATA / "movenet_like.tflite", model)
    a = analyze_path(model, AnalysisOptions())
    assert any("not checked against the TFLite interpreter" in w for w in a.loaded.warnings)
    with pytest.raises(InputError, match=r"nafix\[tflite\]"):
        fix(model, FixOptions())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tflite"]
    assert fix(model, FixOptions(dry_run=True)).before.estimate.epochs > 0


# ---------------------------------------------------------------------------------------------
# CLI: fix and audit of a .tflite
# ---------------------------------------------------------------------------------------------


@needs_interpreter
def test_fix_movenet_like_writes_a_verified_onnx_no_worse_than_the_tflite(tmp_path, capsys):
    model = tmp_path / "movenet_like.tflite"
    shutil.copy(DATA / "movenet_like.tflite", model)
    original = model.read_bytes()
    code, out, err = run([model], capsys)
    assert code == 0, err
    assert "before (TFLite)" in out and "after (ONNX)" in out
    written = tmp_path / "movenet_like.nafix.onnx"
    report = json.loads((tmp_path / "movenet_like.nafix.json").read_text())
    assert written.is_file() and model.read_bytes() == original
    assert report["source_format"] == {"before": "tflite", "after": "onnx"}
    assert report["import_check"]["ok"] and report["import_check"]["op_max_lsb"] <= OP_TOLERANCE_LSB
    assert report["verification"]["ok"]
    b, a = report["estimate"]["before"], report["estimate"]["after"]
    # fewer SW epochs; the total may grow by what lowers each new ConvTranspose: a hybrid zero-inserting
    # Concat + DepthToSpace and conv_transpose_zero_insert_epochs HW epochs (PP-OCRv4 det 2.2 c_info, OBS)
    assert (a["sw_epochs"], a["epochs"]) < (b["sw_epochs"], b["epochs"])
    from fixer.npu.profile import load_profile

    zi = int(load_profile().limits["conv_transpose_zero_insert_epochs"].value)
    n_ct = sum(1 for n in onnx.load(str(tmp_path / "movenet_like.nafix.onnx")).graph.node if n.op_type == "ConvTranspose")
    assert n_ct >= 1 and a["hybrid_epochs"] == 2 * n_ct
    assert a["epochs"] - a["hybrid_epochs"] <= b["epochs"] - b["hybrid_epochs"] + zi * n_ct
    # The fixed model against the TFLite interpreter itself, on the same seeded inputs.
    vs = report["fixed_vs_tflite"]
    assert vs and all(o["exact_fraction"] > 0.9 for o in vs)
    # NHWC stays NHWC at the edges, and the metadata still says where the model came from.
    m = onnx.load(str(written))
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [1, 32, 32, 3]
    assert [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == [1, 32, 32, 4]
    assert source_format(m) == "tflite"


@needs_interpreter
def test_audit_folder_collects_tflite_and_reports_the_check(tmp_path, capsys):
    for name in GOOD:
        shutil.copy(DATA / name, tmp_path / name)
    code, out, err = run(["audit", tmp_path, "--format", "json"], capsys)
    assert code == 0, err
    rows = json.loads(out)["models"]
    assert sorted(Path(r["path"]).name for r in rows) == sorted(GOOD)
    for r in rows:
        assert r["error"] is None and r["source_format"] == "tflite" and r["import_check"]["ok"]


BAD = {
    "custom_op.tflite": "custom op 'MyCustomOp'",
    "flex_op.tflite": "flex (TensorFlow) op 'FlexAddV2'",
    "float16.tflite": "float16",
    "unsupported_op.tflite": "UNIQUE not supported",
    "hybrid.tflite": "dynamic-range (hybrid) quantized models are not supported",
}


@pytest.mark.parametrize("name,expect", sorted(BAD.items()))
def test_bad_tflite_one_error_line_exit_2_file_untouched(tmp_path, capsys, name, expect):
    model = tmp_path / name
    shutil.copy(DATA / name, model)
    before = model.read_bytes()
    code, out, err = run([model], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], err
    assert model.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_truncated_and_corrupt_tflite(tmp_path, capsys):
    data = (DATA / "int8_cnn.tflite").read_bytes()
    cases = {"cut.tflite": data[: len(data) // 2], "tiny.tflite": data[:12],
             "noise.tflite": data[:8] + bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8))}
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(InputError, match="TFLite"):
            import_tflite(blob, tmp_path / name)
        code, out, err = run([tmp_path / name], capsys)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (name, err)
        assert (tmp_path / name).read_bytes() == blob
    code, out, err = run(["audit", *[tmp_path / n for n in cases], "--format", "json"], capsys)
    rows = json.loads(out)["models"]
    assert len(rows) == 3 and all(r["error"] for r in rows)


def test_supported_ops_cover_the_pair_models():
    need = {"ADD", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D", "DEQUANTIZE", "FULLY_CONNECTED", "LOGISTIC",
            "MAX_POOL_2D", "MEAN", "MUL", "PACK", "PAD", "PRELU", "QUANTIZE", "RESHAPE", "RESIZE_BILINEAR",
            "RESIZE_NEAREST_NEIGHBOR", "SHAPE", "SOFTMAX", "STRIDED_SLICE", "SUB", "TILE", "TRANSPOSE",
            "TRANSPOSE_CONV", "AVERAGE_POOL_2D", "HARD_SWISH"}
    assert need <= set(supported_ops())


# ---------------------------------------------------------------------------------------------
# The real TFLite pair models (../shared/reference/pairs)
# ---------------------------------------------------------------------------------------------


@needs_interpreter
@pytest.mark.skipif(not PAIR_MODELS, reason=f"{PAIRS} (real TFLite pair models) is not available")
@pytest.mark.parametrize("path", PAIR_MODELS, ids=lambda p: p.name)
def test_pair_model_imports_exactly(path):
    loaded = load_model(path)
    check = check_loaded(loaded)
    assert check.checked and check.ok and check.op_max_lsb <= OP_TOLERANCE_LSB, check.summary()
    assert all(d < 0.1 for d in check.tie_distance_by_op.values()), check.tie_distance_by_op
    int8_outs = [o for o in check.outputs if o.dtype == "int8"]
    for o in int8_outs:  # end to end, one-LSB ties inside the network move outputs by a few LSB at most
        assert o.max_lsb is not None and o.max_lsb <= 64 and o.exact_fraction > 0.5, check.summary()


# ---------------------------------------------------------------------------------------------
# compile: the .tflite itself goes to stedgeai (the stand-in in tests/fake_stedgeai)
# ---------------------------------------------------------------------------------------------

FAKE = Path(__file__).resolve().parent / "fake_stedgeai" / "stedgeai"


@needs_interpreter
def test_compile_and_fix_compile_pass_the_tflite_to_stedgeai(tmp_path, capsys, monkeypatch):
    import os
    import sys

    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    for var in ("STEDGEAI_CORE_DIR", "FAKE_STEDGEAI_FORMAT", "FAKE_STEDGEAI_FAIL", "FAKE_STEDGEAI_HANG"):
        monkeypatch.delenv(var, raising=False)
    model = tmp_path / "movenet_like.tflite"
    shutil.copy(DATA / "movenet_like.tflite", model)
    code, out, err = run(["compile", model, "--stedgeai", FAKE, "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["stedgeai"]["model"] == str(model) and data["stedgeai"]["ok"]
    assert "Resize" in data["stedgeai"]["sw_ops"]  # the stand-in's bilinear Resize rule, on the TFLite
    code, out, err = run(["fix", model, "--compile", "--stedgeai", FAKE], capsys)
    assert code == 0, out + err
    st = json.loads((tmp_path / "movenet_like.nafix.json").read_text())["stedgeai"]
    assert st["before"]["ok"] and st["after"]["ok"] and st["after"]["hw_ratio"] > st["before"]["hw_ratio"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["movenet_like.tflite", "movenet_like.nafix.onnx", "movenet_like.nafix.json", "movenet_like.nafix.h"])


def test_xnnpack_requantization_is_told_apart_from_an_import_fault():
    """XNNPACK's int8 -> int8 requantization (the interpreter's default delegate) keeps 8 fractional bits
    of the scale ratio: on a real YOLOv8n-pose QUANTIZE (input scale 1/256, output scale 0.0066836) the step
    64 lands at 37.405 + zp exactly but at 37.5 + zp in the delegate, which rounds it up. The check explains
    such a value by the delegate's arithmetic and nothing else: exact values stay exact."""
    info = np.iinfo(np.int8)
    in_scale, out_scale, zp = 0.00390625, 0.00668359687551856, -111
    steps = np.array([64, 76, 0, -20, 127], dtype=np.float64)
    deq = (steps * in_scale).astype(np.float32)
    got = tflite_check._xnnpack_requantized(deq, in_scale, out_scale, zp, info)
    exact = np.clip(np.floor(steps * in_scale / out_scale + zp + 0.5), info.min, info.max)
    assert got[0] == -73 and exact[0] == -74  # the delegate's rounding, one LSB above the exact one
    assert got[2] == exact[2] == zp
    assert np.all(np.abs(got - exact) <= 1)
