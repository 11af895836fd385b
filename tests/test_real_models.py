"""Real models (../shared/models) and the calibration against real stedgeai reports
(../shared/reference/pairs). Skipped when the shared folder is absent.

The calibration itself (every report of every pair, with the core version and options the report
states) is tests/test_calibrate.py; here: the whole model folder audits cleanly and consistently, and
the predicted SW nodes of the ONNX pairs fail for the documented reasons.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixer.api import AnalysisOptions, AuditOptions, audit

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MODELS = SHARED / "models"
PAIRS = SHARED / "reference" / "pairs"

pytestmark = pytest.mark.skipif(not MODELS.is_dir() or not PAIRS.is_dir(),
                                reason=f"{SHARED} (real models and reports) is not available")

@pytest.fixture(scope="module")
def folder_audit():
    """One audit of the whole folder, shared by every test of this module (about 3 s)."""
    result = audit([MODELS], AuditOptions(analysis=AnalysisOptions()))
    return {m.path.name: m for m in result.models}


# ---------------------------------------------------------------------------------------------
# (a) the whole folder
# ---------------------------------------------------------------------------------------------


def test_folder_audit_has_no_error_rows(folder_audit):
    onnx_files = sorted(p.name for p in MODELS.glob("*.onnx"))
    assert sorted(folder_audit) == onnx_files
    errors = {name: m.error for name, m in folder_audit.items() if m.error}
    assert errors == {}
    assert all(m.analysis is not None for m in folder_audit.values())


def test_every_sw_node_has_a_reason_that_names_it(folder_audit):
    checked = 0
    for name, m in folder_audit.items():
        for p in m.analysis.placement.sw_nodes():
            assert p.reasons, f"{name}: SW node {p.name} has no reason"
            for r in p.reasons:
                assert r.requirement.strip() and r.detail.strip(), f"{name}: {p.name} {r.constraint}"
                assert f"'{p.name}'" in r.detail, f"{name}: reason {r.constraint} of {p.name} does not name it: {r.detail}"
                assert "{" not in r.requirement, f"{name}: unformatted requirement {r.requirement}"
                assert r.text().strip()
            checked += 1
    assert checked > 100  # the zoo has plenty of SW nodes: the loop really ran


def test_every_finding_and_note_is_a_sentence(folder_audit):
    for name, m in folder_audit.items():
        a = m.analysis
        for r in a.findings:
            assert r.requirement.strip() and r.detail.strip() and r.severity in ("sw", "note", "compile_error", "hang"), name
        for n in a.notes():
            assert f"'{n['name']}'" in n["note"], (name, n)


def test_estimates_are_consistent(folder_audit):
    for name, m in folder_audit.items():
        e = m.analysis.estimate
        assert e.epochs == len(e.groups) and 0 <= e.sw_epochs <= e.epochs, name
        assert e.sw_epochs == sum(1 for g in e.groups if g.unit == "SW"), name
        assert e.hybrid_epochs == sum(1 for g in e.groups if g.unit == "hybrid"), name
        assert e.epochs == e.sw_epochs + e.hybrid_epochs + e.hw_epochs, name
        sw_nodes = {p.name for p in m.analysis.placement.sw_nodes()}
        # every SW node is in SW/hybrid epochs (its own, or those its lowering made); the other nodes of
        # SW/hybrid epochs are HW nodes that the compiler lowers with an inserted op
        in_sw_epochs = {n for g in e.groups if g.unit != "HW" and not g.inserted for n in g.nodes}
        lowered = {n for g in e.groups if g.unit != "HW" and g.inserted for n in g.nodes}
        assert in_sw_epochs <= sw_nodes <= in_sw_epochs | lowered, name
        assert sum(e.sw_ops.values()) == e.sw_epochs and sum(e.hybrid_ops.values()) == e.hybrid_epochs, name
        assert m.analysis.memory.peak_activation_bytes > 0 and m.analysis.memory.weights_bytes >= 0, name


# ---------------------------------------------------------------------------------------------
# (b) calibration against real reports: tests/test_calibrate.py runs `nafix calibrate` on every pair
# with the core version and options each report states; here, the reasons of the predicted SW nodes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pid,model,options,core,expected", [
    ("mobilenet_v2_128_0.5_qdq_OE", "pair__mobilenet_v2_128_0.5_qdq_OE.onnx", (), "3.0", {"Softmax": {"sw_op:Softmax"}}),
    ("npu_conv2d_OE", "pair__npu_conv2d_OE.onnx", (), "4.0", {}),
    ("mediapipe_face_landmark_OE", "pele__MediaPipeFaceLandmarkDetector_OE_3_2_0.onnx", (), "2.1",
     {"Transpose": {"transpose_perm"}}),
    # report.txt was built with --input-data-type float32: the input QuantizeLinear is a SW epoch
    ("mobilefacenet_int8_faces", "pele__mobilefacenet_int8_faces.onnx", ("--input-data-type float32",), "2.2", {
        "PRelu": {"params_quantized", "prelu_slope_quantized"},
        "QuantizeLinear": {"graph_edge_quantize", "float_island"},
        "DequantizeLinear": {"float_island"},
        "BatchNormalization": {"batchnorm_folded", "quantized_activations"},
    }),
    ("yamnet_1024_64x96_tl_qdq_int8", "pair__yamnet_1024_64x96_tl_qdq_int8.onnx", (), "2.2", {
        "Transpose": {"quantized_activations"},  # float input prologue (Transpose + Q, one SW epoch)
        "QuantizeLinear": {"graph_edge_quantize"},
        "DequantizeLinear": {"float_island"},  # feeds the float Softmax
        "Softmax": {"sw_op:Softmax"},
    }),
])
def test_pair_sw_reasons_are_the_documented_ones(pid, model, options, core, expected):
    """Each predicted SW op of a pair fails for the reason NEURAL_ART.md gives for it."""
    from fixer.api import analyze_path

    a = analyze_path(MODELS / model, AnalysisOptions(stedgeai_options=frozenset(options), core=core))
    got: dict[str, set[str]] = {}
    for p in a.placement.sw_nodes():
        got.setdefault(p.op_type, set()).update(r.constraint for r in p.reasons)
    assert got == expected


def test_mobilefacenet_gdconv_lowering():
    """The 7x7 depthwise conv over the whole 7x7 map (GDConv): three SW (DequantizeLinear, Conv, Cast)
    bands, as in all four MobileFaceNet reports (c_info epochs 151-159), on top of its HW epoch."""
    from fixer.api import analyze_path

    a = analyze_path(MODELS / "pele__mobilefacenet_int8_faces.onnx", AnalysisOptions(core="2.2"))
    name = "/output_layer/conv_6_dw/conv/Conv_quant"
    assert a.placement.by_name[name].unit == "HW"
    inserted = [g.reported_as for g in a.estimate.groups if g.inserted and g.nodes == [name]]
    assert inserted == ["DequantizeLinear", "Conv", "Cast"] * 3
    # one entry per inserted op, counting its 3 bands' epochs (the audit's groups add up to the header)
    entries = [e for e in a.sw_nodes() if e["from_nodes"] == [name]]
    assert [e["op_type"] for e in entries] == ["DequantizeLinear", "Conv", "Cast"]
    assert all(e["unit"] == "SW" and e["sw_epochs"] == 3 and e["hybrid_epochs"] == 0 for e in entries)
    assert sorted(i for e in entries for i in e["epochs"]) == sorted(
        g.index for g in a.estimate.groups if g.inserted and g.nodes == [name])
