"""Tests of fixer.stedgeai: discovery, report/c_info/CSV parsers, known errors, run_generate.

Real reports under ../shared/reference are used when present (those tests skip otherwise); the
verbatim excerpts in tests/data/reports keep the parsers tested without them. run_generate is
exercised against the stand-in tests/fake_stedgeai/stedgeai.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer.errors import InputError, ToolError, UsageError
from fixer.stedgeai import (
    KNOWN_ERROR_PATTERNS,
    explain,
    find_stedgeai,
    load_c_info,
    load_report,
    parse_c_info,
    parse_epoch_csv,
    parse_report,
    parse_version,
    run_generate,
    stedgeai_version,
)

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data" / "reports"
FAKE = TESTS / "fake_stedgeai" / "stedgeai"
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
REFERENCE = SHARED / "reference"
needs_shared = pytest.mark.skipif(
    not REFERENCE.is_dir(), reason=f"{REFERENCE} is not available (shared reference data)"
)


# ---------------------------------------------------------------------------------------------
# Expected numbers, copied from shared/reference/reports/README.md and pairs/*/README.md
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    version: str | None
    fmt: str
    epochs: int
    sw: int
    hybrid: int | None
    sw_ops: dict[str, int]
    hybrid_ops: dict[str, int] | None = None


REPORTS: dict[str, Expected] = {
    "compal_sh_240_quant_v2.2.0.txt": Expected(
        "2.2.0-20266", "A", 123, 70, None,
        {"DequantizeLinear": 20, "QuantizeLinear": 20, "ReduceSum": 10, "Gather": 10, "Concat": 5, "Softmax": 5},
    ),
    "compal_sh_240_quant_v4.0.1.txt": Expected(
        "4.0.1-20581", "B", 87, 35, 5,
        {"DequantizeLinear": 10, "ReduceSum(float)": 10, "QuantizeLinear": 10, "Softmax": 5},
        {"Concat": 5},
    ),
    "compal_sh_240_quant_opt_v2.2.0.txt": Expected(
        "2.2.0-20266", "A", 245, 181, None,
        {"QuantizeLinear": 46, "DequantizeLinear": 42, "Add": 29, "Conv": 23, "Mul": 15, "ReduceSum": 10,
         "Softmax": 5, "Tanh": 5, "Concat": 4, "AveragePool": 1, "Sigmoid": 1},
    ),
    "dahuangelululu_best_perchannel_quant_v2.2.0.txt": Expected(
        "2.2.0-20266", "A", 237, 69, None,
        {"Slice": 33, "Concat": 8, "AveragePool": 6, "QuantizeLinear": 6, "DequantizeLinear": 5, "Transpose": 3,
         "Pow": 3, "Sub": 3, "DepthToSpace": 2},
    ),
    "syafizzudin_bestsampah_int8_v2.2.0.txt": Expected(
        "2.2.0-20266", "A", 127, 3, None, {"DepthToSpace": 2, "Concat": 1}
    ),
    "willisk_mnist_model_v2.2.0.txt": Expected(
        "2.2.0-20266", "A", 22, 15, None, {"Conv": 5, "Tanh": 4, "Add": 3, "AveragePool": 2, "Softmax": 1}
    ),
    "hansangmin_tiny_yolo_v2_224_int8_v2.0.0.txt": Expected(
        "2.0.0-20049", "A", 21, 1, None, {"DequantizeLinear": 1}
    ),
    "larochec_stt_q800_real_v4.0.1.txt": Expected("4.0.1-20581", "B", 618, 0, 0, {}),
    "pelea_sface_2021dec_perchannel_random_v2.1.0.txt": Expected(
        "2.1.0-20194", "A", 156, 115, None,
        {"QuantizeLinear": 28, "DequantizeLinear": 28, "BatchNormalization": 28, "PRelu": 27, "Sub": 1,
         "Mul": 1, "Add": 1, "Conv": 1},
    ),
    "pelea_face_recognition_integer_quant_v2.1.0.txt": Expected(
        "2.1.0-20194", "A", 78, 3, None, {"QuantizeLinear": 1, "Conv": 1, "DequantizeLinear": 1}
    ),
    # The two excerpts (first table of reports/README.md): numbers as printed in them.
    "denoiser_v2.1.0_excerpt.txt": Expected("2.1.0-20194", "A", 23, 3, None, {"Conv": 3}),
    "mnist_v3.0.0_doc_excerpt.txt": Expected(None, "B", 5, 1, 0, {"Softmax": 1}),
}

_MOBILEFACENET_21 = {"QuantizeLinear": 34, "DequantizeLinear": 37, "PRelu": 33, "Conv": 3, "Cast": 3, "Mul": 1, "Add": 1}
PAIR_REPORTS: dict[str, Expected] = {
    "mobilefacenet_int8_faces/report.txt": Expected(
        "2.2.0-20266", "A", 164, 111, None,
        {"QuantizeLinear": 34, "DequantizeLinear": 37, "PRelu": 33, "Conv": 3, "Cast": 3, "BatchNormalization": 1},
    ),
    "mobilefacenet_int8_faces/report_2.txt": Expected("2.1.0-20194", "A", 170, 112, None, _MOBILEFACENET_21),
    "mobilefacenet_int8_faces/report_3.txt": Expected("2.1.0-20194", "A", 165, 112, None, _MOBILEFACENET_21),
    "mobilefacenet_int8_faces/report_4.txt": Expected(
        "2.2.0-20266", "A", 183, 110, None,
        {"DequantizeLinear": 37, "PRelu": 33, "QuantizeLinear": 33, "Conv": 3, "Cast": 3, "BatchNormalization": 1},
    ),
    "mobilenet_v2_128_0.5_qdq_OE/report.txt": Expected("3.0.0-20426", "B", 56, 1, 0, {"Softmax": 1}),
    "mobilenet_v2_128_0.5_qdq_OE/report_2.txt": Expected("2.1.0-20194", "A", 56, 1, None, {"Softmax": 1}),
    "mobilenet_v2_128_0.5_qdq_OE/report_3.txt": Expected("2.2.0-20266", "A", 56, 1, None, {"Softmax": 1}),
    "npu_conv2d_OE/report.txt": Expected("4.0.0-20500", "B", 18, 0, 0, {}),
    "npu_conv2d_OE/report_2.txt": Expected("4.0.0-20500", "B", 18, 0, 0, {}),
    "yamnet_1024_64x96_tl_qdq_int8/report.txt": Expected(
        "2.2.0-20266", "A", 39, 3, None, {"Transpose": 1, "DequantizeLinear": 1, "Softmax": 1}
    ),
    "yamnet_1024_64x96_tl_qdq_int8/report_2.txt": Expected(
        "2.1.0-20194", "A", 39, 3, None, {"Transpose": 1, "DequantizeLinear": 1, "Softmax": 1}
    ),
    "mediapipe_face_landmark_OE/report.txt": Expected("2.1.0-20194", "A", 93, 6, None, {"Transpose": 6}),
}

PAIRS_WITH_C_INFO = (
    "mediapipe_face_landmark_OE",
    "mobilefacenet_int8_faces",
    "mobilenet_v2_128_0.5_qdq_OE",
    "npu_conv2d_OE",
)


def _check(report, expected: Expected) -> None:
    assert report.version == expected.version
    assert report.format == expected.fmt
    assert report.epochs == expected.epochs
    assert report.sw_epochs == expected.sw
    assert report.hybrid_epochs == expected.hybrid
    assert Counter(report.sw_ops) == Counter(expected.sw_ops)
    if expected.hybrid_ops is not None:
        assert Counter(report.hybrid_ops) == Counter(expected.hybrid_ops)
    # Every real report's table is complete: one row per counted epoch, ids increasing.
    assert len(report.epoch_rows) == report.epochs
    ids = [row.id for row in report.epoch_rows]
    assert ids == sorted(set(ids))
    assert sum(1 for row in report.epoch_rows if row.kind == "SW") == report.sw_epochs
    if report.format == "B":
        assert report.sw_epochs + report.hybrid_epochs + report.hw_epochs == report.epochs
        assert sum(1 for row in report.epoch_rows if row.kind == "HYBRID") == report.hybrid_epochs
    else:
        assert report.hw_epochs == report.epochs - report.sw_epochs
    assert report.hw_ratio == pytest.approx((report.epochs - report.sw_epochs) / report.epochs)


# ---------------------------------------------------------------------------------------------
# Reports from shared/reference
# ---------------------------------------------------------------------------------------------


@needs_shared
def test_every_reference_report_is_in_the_expectation_table() -> None:
    on_disk = {p.name for p in (REFERENCE / "reports").iterdir() if p.suffix == ".txt"}
    assert on_disk == set(REPORTS)
    pair_reports = {
        f"{p.parent.name}/{p.name}" for p in (REFERENCE / "pairs").glob("*/report*.txt")
    }
    assert pair_reports == set(PAIR_REPORTS)


@needs_shared
@pytest.mark.parametrize("name", sorted(REPORTS))
def test_reference_report_parses(name: str) -> None:
    _check(load_report(REFERENCE / "reports" / name), REPORTS[name])


@needs_shared
@pytest.mark.parametrize("name", sorted(PAIR_REPORTS))
def test_pair_report_parses(name: str) -> None:
    _check(load_report(REFERENCE / "pairs" / name), PAIR_REPORTS[name])


@needs_shared
def test_v4_report_counts_ec_ranges_and_hybrid_epochs() -> None:
    report = load_report(REFERENCE / "reports" / "compal_sh_240_quant_v4.0.1.txt")
    kinds = Counter(row.kind for row in report.epoch_rows)
    # EC ranges ("epochs 1 -> 13 | EC") expand to the 47 pure-hardware epochs; "<no executed
    # epochs>" rows carry no id and are not counted.
    assert kinds == {"EC": 47, "SW": 35, "HYBRID": 5}
    assert report.hw_epochs == 47
    assert report.ec_blobs == 15
    # ids skip numbers the compiler elided: the largest id is not the count.
    assert report.epoch_rows[-1].id == 92
    assert {15, 17, 19, 21, 24}.isdisjoint(row.id for row in report.epoch_rows)
    assert report.hw_ratio == pytest.approx(52 / 87)  # hybrid counts as offloaded


@needs_shared
def test_v4_report_ids_start_at_two() -> None:
    report = load_report(REFERENCE / "reports" / "larochec_stt_q800_real_v4.0.1.txt")
    assert report.epoch_rows[0].id == 2
    assert report.epoch_rows[-1].id == 619
    assert report.hw_ratio == 1.0


@needs_shared
def test_core_2_2_question_mark_rows_are_unknown_and_not_sw() -> None:
    report = load_report(REFERENCE / "reports" / "compal_sh_240_quant_opt_v2.2.0.txt")
    kinds = Counter(row.kind for row in report.epoch_rows)
    assert kinds == {"SW": 181, "UNKNOWN": 47, "HW": 17}
    assert report.hw_epochs == 64


@needs_shared
def test_report_with_console_preamble_reads_version_io_and_memory() -> None:
    report = load_report(REFERENCE / "pairs" / "mobilefacenet_int8_faces" / "report_4.txt")
    assert report.version == "2.2.0-20266"
    assert report.command is not None and "analyze --target stm32n6" in report.command
    (inp,) = report.inputs
    assert (inp.name, inp.dtype, inp.shape, inp.scale, inp.zero_point) == (
        "Input_0_out_0", "int8", (1, 3, 112, 112), 0.007843138, 0)
    assert inp.size_bytes == 37632  # 36.75 KBytes, as the report's "Input: 37632 B" says
    (out,) = report.outputs
    assert (out.dtype, out.shape, out.scale, out.zero_point) == ("f32", (1, 128), None, None)
    hyper = report.pool("hyperRAM")
    assert hyper is not None and hyper.activations_bytes == round(1.531 * 1024 * 1024)
    assert report.pool("cpuRAM2").used_bytes == 1024 * 1024


# ---------------------------------------------------------------------------------------------
# c_info.json from the pairs
# ---------------------------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize("pair", PAIRS_WITH_C_INFO)
def test_c_info_agrees_with_the_report_next_to_it(pair: str) -> None:
    folder = REFERENCE / "pairs" / pair
    c_info = load_c_info(folder / "c_info.json")
    report = load_report(folder / "report.txt")
    assert c_info.epoch_count == report.epochs
    assert c_info.sw_epochs == report.sw_epochs
    assert c_info.sw_ops == report.sw_ops
    assert [e.id for e in c_info.counted_epochs] == [row.id for row in report.epoch_rows]
    assert [e.kind for e in c_info.counted_epochs] == [row.kind for row in report.epoch_rows]
    # What is not counted: the parameters-only epoch_0, the __NN__RETURN__ epoch, NODE_NO_X.
    uncounted = [e for e in c_info.epochs if not e.counted]
    assert uncounted[0].name == "epoch_0" and uncounted[0].ops == ()
    assert all(e.kind == "NO_X" or e.ops == () for e in uncounted)
    assert c_info.schema_version == "2.0"


@needs_shared
def test_c_info_memory_pools_and_buffers() -> None:
    c_info = load_c_info(REFERENCE / "pairs" / "mobilefacenet_int8_faces" / "c_info.json")
    hyper = c_info.pool("hyperRAM")
    assert hyper is not None and (hyper.size_bytes, hyper.used_size_bytes) == (16777216, 1605632)
    virtual = c_info.pool("cpuRAM2_npuRAM3_npuRAM4_npuRAM5_npuRAM6")
    assert virtual is not None and virtual.virtual and virtual.size_bytes == 1024 * 1024 + 4 * 448 * 1024
    assert c_info.activations_bytes == 4116480
    first = c_info.buffers[0]
    assert (first.name, first.format, first.mpool_name) == ("Input_0_out_0", "STAI_FORMAT_FLOAT", "npuRAM5")
    quantized = next(b for b in c_info.buffers if b.name == "Quantize_7_out_0")
    assert quantized.scales == (0.0107148718,) and quantized.offsets == (-46,)


@needs_shared
def test_npu_conv2d_c_info_no_x_transpose_is_why_ids_start_at_two() -> None:
    c_info = load_c_info(REFERENCE / "pairs" / "npu_conv2d_OE" / "c_info.json")
    epoch_1 = next(e for e in c_info.epochs if e.name == "epoch_1")
    assert (epoch_1.kind, epoch_1.ops, epoch_1.counted) == ("NO_X", ("Transpose",), False)


# ---------------------------------------------------------------------------------------------
# Fixtures in tests/data (no shared/ needed)
# ---------------------------------------------------------------------------------------------


def test_fixture_format_a_denoiser() -> None:
    report = load_report(DATA / "format_a_v2.1.0_denoiser_excerpt.txt")
    _check(report, Expected("2.1.0-20194", "A", 23, 3, None, {"Conv": 3}))
    assert [row.id for row in report.epoch_rows if row.kind == "SW"] == [2, 3, 21]
    assert len(report.inputs) == 5 and len(report.outputs) == 5
    first = report.inputs[0]
    assert (first.name, first.shape, first.scale, first.zero_point, first.size_bytes) == (
        "Input_18_out_0", (1, 257, 1), 0.024541926, 2, 257)
    assert report.outputs[0].zero_point == -128
    assert report.memory == ()


def test_fixture_format_a_memory_pools() -> None:
    report = load_report(DATA / "format_a_v2.2.0_mnist_excerpt.txt")
    _check(report, Expected("2.2.0-20266", "A", 22, 15, None,
                            {"Conv": 5, "Tanh": 4, "Add": 3, "AveragePool": 2, "Softmax": 1}))
    assert report.compiler_version == "1.1.1-14"
    assert [p.name for p in report.memory] == [
        "flexMEM", "cpuRAM1", "cpuRAM2", "npuRAM3", "npuRAM4", "npuRAM5", "npuRAM6", "octoFlash", "hyperRAM"]
    npu5 = report.pool("npuRAM5")
    # 26.031 kB (KiB) = the 26,656 activation bytes of the report's section table
    assert (npu5.used_bytes, npu5.total_bytes, npu5.weights_bytes, npu5.activations_bytes) == (
        26656, 458752, 0, 26656)
    assert (npu5.start_address, npu5.end_address) == (0x342E0000, 0x34350000)
    flash = report.pool("octoFlash")
    assert (flash.weights_bytes, flash.total_bytes) == (246840, 112 * 1024 * 1024)
    assert report.pool("cpuRAM2").total_bytes == 1024 * 1024
    assert report.pool("flexMEM").total_bytes == 0


def test_fixture_format_b_doc() -> None:
    report = load_report(DATA / "format_b_v3.0.0_doc_excerpt.txt")
    _check(report, Expected(None, "B", 5, 1, 0, {"Softmax": 1}))
    assert [row.id for row in report.epoch_rows] == [2, 3, 4, 5, 6]
    assert report.ec_blobs == 0
    assert report.hw_ratio == pytest.approx(0.8)


def test_fixture_format_b_hybrid_and_ec_ranges() -> None:
    report = load_report(DATA / "format_b_v4.0.1_hybrid_excerpt.txt")
    _check(report, Expected("4.0.1-20581", "B", 87, 35, 5,
                            {"DequantizeLinear": 10, "ReduceSum(float)": 10, "QuantizeLinear": 10, "Softmax": 5},
                            {"Concat": 5}))
    assert Counter(row.kind for row in report.epoch_rows)["EC"] == 47
    assert report.ec_blobs == 15
    assert report.pool("npuRAM5").activations_bytes == round(45.078 * 1024)
    assert report.pool("hyperRAM").total_bytes == 0


def test_fixture_c_info_v3_with_types() -> None:
    c_info = parse_c_info(json.loads((DATA / "c_info_v3.0.0_mobilenet_excerpt.json").read_text()))
    assert [(e.name, e.kind, e.counted) for e in c_info.epochs] == [
        ("epoch_0", "NO_X", False), ("epoch_1", "HW", True), ("epoch_2", "HW", True),
        ("epoch_55", "HW", True), ("epoch_56", "SW", True), ("epoch_57", "NO_X", False)]
    assert c_info.epoch_count == 4 and c_info.sw_epochs == 1 and c_info.hw_epochs == 3
    assert c_info.sw_ops == ("Softmax",)
    assert c_info.epochs[2].ops == ("Conv", "Add", "Sub")
    assert c_info.epochs[4].node_names == ("Softmax_212",)
    assert c_info.pool("cpuRAM2_npuRAM3_npuRAM4_npuRAM5_npuRAM6").subpools == (5, 4, 3, 2, 1)
    assert c_info.buffers[1].offsets == (-128,)
    assert c_info.weights_bytes == 212609


def test_fixture_c_info_v2_without_types_uses_description() -> None:
    c_info = load_c_info(DATA / "c_info_v2.1.0_mediapipe_excerpt.json")
    by_name = {e.name: e for e in c_info.epochs}
    assert by_name["epoch_0"].kind == "HW" and not by_name["epoch_0"].counted  # params only
    assert by_name["epoch_94"].kind == "EC" and not by_name["epoch_94"].counted  # __NN__RETURN__
    assert by_name["epoch_12"].ops == ("Transpose",) and by_name["epoch_12"].kind == "SW"
    assert by_name["epoch_13"].ops == ("Identity", "Conv", "Mul", "Add")
    assert by_name["epoch_13"].ec_blob == "_ec_blob_13"
    assert c_info.sw_ops == ("Transpose",)


def test_c_info_falls_back_to_the_node_name() -> None:
    data = {"graphs": [{"nodes": [
        {"name": "epoch_1", "mapping": "NODE_SW_HW", "subgraph_nodes": [{"name": "Concat_7"}]},
        {"name": "epoch_2", "mapping": "NODE_SW", "subgraph_nodes": [{"name": "x", "type": "Softmax"}]},
    ]}]}
    c_info = parse_c_info(data)
    assert c_info.epochs[0].ops == ("Concat_7",) and c_info.epochs[0].kind == "HYBRID"
    assert (c_info.epoch_count, c_info.hybrid_epochs, c_info.sw_epochs) == (2, 1, 1)


@pytest.mark.parametrize("data", [[], {}, {"graphs": []}, {"graphs": [{"name": "g"}]}])
def test_c_info_rejects_other_json(data: object) -> None:
    with pytest.raises(InputError, match="c_info"):
        parse_c_info(data)  # type: ignore[arg-type]


def test_load_c_info_bad_json_names_line(tmp_path: Path) -> None:
    path = tmp_path / "network_c_info.json"
    path.write_text('{"graphs": [\n  {"nodes": [}\n]}')
    with pytest.raises(InputError, match=r"line 2"):
        load_c_info(path)


def test_parse_report_rejects_other_text() -> None:
    with pytest.raises(InputError, match="Total number of epochs"):
        parse_report("ST Edge AI Core v2.1.0-20194\nsomething else entirely\n", source="log.txt")


def test_parse_report_format_b_without_counters() -> None:
    with pytest.raises(InputError, match="pure software"):
        parse_report("Total number of epochs                               5\n")


def test_parse_report_reads_labels_not_columns() -> None:
    text = "\n".join([
        "Total number of epochs   3",
        ">>  pure hardware (HW or EC) epochs   2   (implemented in 1 epoch controller blobs/meta epochs)",
        ">> hybrid epochs (using both software and hardware) 0",
        ">> pure software (SW) epochs 1",
        "+-----------+---------+------+",
        "| Details   | Type    | epoch ID |",
        "+-----------+---------+------+",
        "|           |  EC     | epochs 1 -> 2 |",
        "| Resize    |  SW     | epoch_3 |",
        "+-----------+---------+------+",
    ])
    report = parse_report(text)
    assert (report.epochs, report.sw_epochs, report.hybrid_epochs, report.hw_epochs, report.ec_blobs) == (3, 1, 0, 2, 1)
    assert [(r.id, r.kind, r.ops) for r in report.epoch_rows] == [(1, "EC", ()), (2, "EC", ()), (3, "SW", ("Resize",))]


# ---------------------------------------------------------------------------------------------
# Epoch CSV
# ---------------------------------------------------------------------------------------------


def test_parse_epoch_csv_by_header_names() -> None:
    table = parse_epoch_csv("Epoch ID;Type;Cycles\nepoch_2;HW;1200\nepoch_3;SW;560\n")
    assert table.columns == ("Epoch ID", "Type", "Cycles")
    assert table.epoch_ids == (2, 3)
    assert table.values("type") == ("HW", "SW")
    assert table.column("epoch_id") == "Epoch ID"
    assert table.records()[1] == {"Epoch ID": "epoch_3", "Type": "SW", "Cycles": "560"}
    reordered = parse_epoch_csv("cycles,type,epoch\n10,SW,7\n")
    assert reordered.epoch_ids == (7,) and reordered.values("Cycles") == ("10",)


@pytest.mark.parametrize("text", ["", "\n\n", "1,2,3\n4,5,6\n"])
def test_parse_epoch_csv_needs_a_header(text: str) -> None:
    with pytest.raises(InputError):
        parse_epoch_csv(text)


# ---------------------------------------------------------------------------------------------
# Known errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("log", "code", "details"),
    [
        ("E010: quantized unsigned integer format is not supported", "uint8-activations",
         {"option": "--quantize"}),
        ("TOOL ERROR: list index out of range", "gemm-dynamic-bias", {"rule": "NAF011"}),
        ("TOOL ERROR: Error in computation of shapes", "shape-computation", {"option": "--input-shape"}),
        ("INTERNAL ERROR: Mismatch in channel position", "channel-position", {}),
        ("atonn terminated: signo=11", "atonn-crash", {}),
        ("total bytes left unallocated=3515456\nWarning: Oauto did not find valid compile options: aborting",
         "memory-overflow", {"unallocated_bytes": 3515456}),
        ("WARNING: _conv1_prelu_PRelu_output_0 is not quantized \nWARNING: output is not quantized \n"
         "WARNING: output is not quantized", "not-quantized",
         {"option": "--quantize", "tensors": ("_conv1_prelu_PRelu_output_0", "output"), "count": 2}),
        ("HW lowering not done for Conv node=Conv2D_28 because output tensor (id=113) has scale-offset format\n"
         "Lowering Conv2D_28 with Lowerer SW (scale offset)", "scale-offset-sw",
         {"rule": "NAF013", "alternative_rule": "NAF001", "op": "Conv", "node": "Conv2D_28", "tensor_id": 113}),
    ],
)
def test_explain_known_errors(log: str, code: str, details: dict[str, object]) -> None:
    (error,) = explain(log)
    assert error.code == code
    assert dict(error.details) == details
    assert error.cause and error.fix and error.tag in ("OBS", "3P", "INF", "DOC")
    assert error.evidence_line in [line.strip() for line in log.splitlines()]


def test_explain_shape_error_node_and_order() -> None:
    log = "\n".join([
        "WARNING: t1 is not quantized",
        "TOOL ERROR: Error in computation of shapes for node Reshape_12",
    ])
    errors = explain(log)
    assert [e.code for e in errors] == ["not-quantized", "shape-computation"]
    assert errors[1].details["nodes"] == ("Reshape_12",)


def test_explain_one_entry_per_scale_offset_node() -> None:
    line = "HW lowering not done for {op} node={node} because output tensor (id={id}) has scale-offset format"
    log = "\n".join([line.format(op="Conv", node="A", id=1), line.format(op="Gemm", node="B", id=2),
                     line.format(op="Conv", node="A", id=1)])
    assert [(e.details["op"], e.details["node"]) for e in explain(log)] == [("Conv", "A"), ("Gemm", "B")]


def test_explain_mpool_parse_error_is_not_a_memory_overflow() -> None:
    log = ("Error: memory pool JSON ERROR:\nINVALID_ARGUMENT:Expected a value.\n// stm32n6_nucleo_ap\n^\n"
           "Warning: Oauto did not find valid compile options: aborting\ntotal bytes left unallocated=12")
    assert [e.code for e in explain(log)] == ["mpool-json-error"]


@needs_shared
def test_explain_on_a_real_log_with_float_islands() -> None:
    text = (REFERENCE / "pairs" / "mobilefacenet_int8_faces" / "report_4.txt").read_text()
    (error,) = explain(text)
    assert error.code == "not-quantized"
    # 33 PRelu outputs (the report's 33 SW PRelu epochs) and the graph output
    assert error.details["count"] == 34
    assert sum("PRelu" in t for t in error.details["tensors"]) == 33
    assert error.details["tensors"][-1] == "output"


def test_explain_nothing_and_table_is_data() -> None:
    assert explain("") == ()
    assert explain("ST Edge AI Core v2.1.0-20194\nall good") == ()
    codes = [p.code for p in KNOWN_ERROR_PATTERNS]
    assert len(codes) == len(set(codes))


# ---------------------------------------------------------------------------------------------
# Discovery and version
# ---------------------------------------------------------------------------------------------


def _executable(path: Path, body: str = "echo 'ST Edge AI Core v2.1.0-20194 329b0e98d'\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_find_explicit_path_wins(tmp_path: Path) -> None:
    explicit = _executable(tmp_path / "mine" / "stedgeai")
    core = tmp_path / "core"
    _executable(core / "Utilities" / "linux" / "stedgeai")
    env = {"STEDGEAI_CORE_DIR": str(core), "PATH": str(tmp_path / "mine")}
    assert find_stedgeai(explicit, env, platform="linux") == explicit
    assert find_stedgeai(str(explicit), env, platform="linux") == explicit


def test_find_explicit_missing_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "stedgeai"
    with pytest.raises(ToolError, match=r"does not exist") as info:
        find_stedgeai(missing, {})
    assert str(missing) in str(info.value)


def test_find_explicit_folder_or_not_executable(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="folder"):
        find_stedgeai(tmp_path, {})
    plain = tmp_path / "stedgeai"
    plain.write_text("not a program")
    if os.name == "posix":
        with pytest.raises(ToolError, match="not executable"):
            find_stedgeai(plain, {})


@pytest.mark.parametrize(("platform", "folder", "exe"), [
    ("linux", "linux", "stedgeai"), ("win32", "windows", "stedgeai.exe"), ("darwin", "mac", "stedgeai")])
def test_find_through_core_dir(tmp_path: Path, platform: str, folder: str, exe: str) -> None:
    core = tmp_path / "STEdgeAI" / "2.2"
    tool = _executable(core / "Utilities" / folder / exe)
    on_path = _executable(tmp_path / "bin" / "stedgeai")
    env = {"STEDGEAI_CORE_DIR": str(core), "PATH": str(on_path.parent)}
    assert find_stedgeai(None, env, platform=platform) == tool


def test_find_on_path_and_fallback(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    on_path = _executable(tmp_path / "bin" / "stedgeai")
    assert find_stedgeai(None, {"PATH": str(on_path.parent)}, platform="linux") == on_path
    with caplog.at_level(logging.WARNING, logger="fixer.stedgeai"):
        found = find_stedgeai(None, {"STEDGEAI_CORE_DIR": str(tmp_path / "empty"),
                                     "PATH": str(on_path.parent)}, platform="linux")
    assert found == on_path
    assert "STEDGEAI_CORE_DIR" in caplog.text


def test_find_nothing(tmp_path: Path) -> None:
    assert find_stedgeai(None, {"PATH": str(tmp_path)}) is None
    assert find_stedgeai(None, {}) is None


def test_parse_version_lines() -> None:
    assert parse_version("ST Edge AI Core v2.1.0-20194 329b0e98d") == "2.1.0-20194"
    assert parse_version("Analyzing model\nST Edge AI Core v4.0.1-20581 7ed50de05 \n") == "4.0.1-20581"
    assert parse_version("ST Edge AI Core v2.0.0-20049") == "2.0.0-20049"
    assert parse_version("stedgeai 1.0") is None


def test_stedgeai_version_runs_the_tool(tmp_path: Path) -> None:
    assert stedgeai_version(FAKE) == "2.2.0-20266"
    tool = _executable(tmp_path / "stedgeai", "echo 'ST Edge AI Core v2.1.0-20194 329b0e98d'\n")
    assert stedgeai_version(tool) == "2.1.0-20194"
    odd = _executable(tmp_path / "odd" / "stedgeai", "echo 'hello'\nexit 3\n")
    with pytest.raises(ToolError, match="exit code 3"):
        stedgeai_version(odd)
    with pytest.raises(ToolError, match="could not be started"):
        stedgeai_version(tmp_path / "missing")


def test_fake_tool_version_follows_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_STEDGEAI_FORMAT", "B")
    assert stedgeai_version(FAKE) == "4.0.1-20581"


def test_fake_tool_is_not_part_of_the_package() -> None:
    package = Path(__file__).resolve().parents[1] / "fixer"
    assert not any("fake_stedgeai" in p.read_text() for p in package.rglob("*.py"))
    assert os.access(FAKE, os.X_OK)
    assert FAKE.read_text().startswith("#!/usr/bin/env python3\n")


# ---------------------------------------------------------------------------------------------
# run_generate against the stand-in
# ---------------------------------------------------------------------------------------------


def _tiny_model(path: Path, *, uint8: bool = False) -> Path:
    """x -> Conv -> Relu -> Resize(linear) -> Flatten -> Softmax: the stand-in makes Conv and
    Relu HW epochs, Resize (bilinear) and Softmax SW epochs, and folds Flatten."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])
    inits = [
        numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Resize", ["r", "", "scales"], ["z"], name="resize", mode="linear"),
        helper.make_node("Flatten", ["z"], ["f"], name="flatten"),
        helper.make_node("Softmax", ["f"], ["y"], name="softmax"),
    ]
    if uint8:
        inits += [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
                  numpy_helper.from_array(np.array(128, np.uint8), "zp")]
        nodes[0:0] = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"], name="q"),
                      helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"], name="dq")]
        nodes[2].input[0] = "xd"
    model = helper.make_model(helper.make_graph(nodes, "tiny", [x], [y], inits))
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    return _tiny_model(tmp_path / "models" / "tiny.onnx")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_STEDGEAI_")}
    # The stand-in runs "#!/usr/bin/env python3": put the interpreter running the tests (which
    # has onnx) first on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


@pytest.mark.parametrize(("fmt", "version"), [("A", "2.2.0-20266"), ("B", "4.0.1-20581")])
def test_run_generate_success(tmp_path: Path, model: Path, fmt: str, version: str) -> None:
    lines: list[str] = []
    before = sorted(model.parent.iterdir())
    result = run_generate(tool=FAKE, model=model, workdir=tmp_path / "work", on_line=lines.append,
                          env=_env(FAKE_STEDGEAI_FORMAT=fmt), timeout_s=120)
    assert result.ok and result.returncode == 0, result.log
    report = result.report
    assert report is not None
    assert (report.format, report.version, report.epochs, report.sw_epochs) == (fmt, version, 4, 2)
    assert report.sw_ops == ("Resize", "Softmax")
    assert report.hybrid_epochs == (0 if fmt == "B" else None)
    assert report.hw_ratio == pytest.approx(0.5)
    assert report.inputs[0].name == "x" and report.inputs[0].shape == (1, 3, 8, 8)
    assert report.pool("npuRAM5") is not None
    assert result.report_path == result.output_dir / "network_generate_report.txt"
    assert result.c_info is not None and result.c_info_path == result.output_dir / "network_c_info.json"
    assert (result.c_info.epoch_count, result.c_info.sw_ops) == (4, ("Resize", "Softmax"))
    assert result.epoch_csv is None and result.problems == () and result.known_errors == ()
    assert any("Total number of epochs" in line for line in lines)
    assert result.log.splitlines() == lines
    assert sorted(model.parent.iterdir()) == before  # nothing written next to the model
    command = list(result.command)
    assert command[1:4] == ["generate", "-m", str(model.resolve())]
    assert command[command.index("--target") + 1] == "stm32n6"
    assert command[command.index("--st-neural-art") + 1] == "--output"


def test_run_generate_profile_csv_and_warnings(tmp_path: Path, model: Path) -> None:
    result = run_generate(
        tool=FAKE, model=model, workdir=tmp_path / "work", profile="n6-allmems-O3@user_neuralart.json",
        extra_args=["--name", "net"], timeout_s=120,
        env=_env(FAKE_STEDGEAI_CSV="1", FAKE_STEDGEAI_WARN="t_a,t_b"),
    )
    assert result.ok, result.log
    assert result.command[result.command.index("--st-neural-art") + 1] == "n6-allmems-O3@user_neuralart.json"
    assert result.command[-2:] == ("--name", "net")
    assert result.report_path is not None and result.report_path.name == "net_generate_report.txt"
    assert result.epoch_csv is not None
    assert result.epoch_csv.epoch_ids == (1, 2, 3, 4)
    assert result.epoch_csv.values("type") == ("HW", "HW", "SW", "SW")
    (warning,) = result.known_errors
    assert warning.code == "not-quantized" and warning.details["tensors"] == ("t_a", "t_b")


@pytest.mark.parametrize(("failure", "code"), [
    ("uint8", "uint8-activations"), ("gemm-bias", "gemm-dynamic-bias"), ("segv", "atonn-crash"),
    ("memory", "memory-overflow")])
def test_run_generate_compile_failure(tmp_path: Path, model: Path, failure: str, code: str) -> None:
    lines: list[str] = []
    result = run_generate(tool=FAKE, model=model, workdir=tmp_path / "work", on_line=lines.append,
                          env=_env(FAKE_STEDGEAI_FAIL=failure), timeout_s=120)
    assert not result.ok and result.returncode == 1
    assert result.report is None and result.c_info is None
    assert [e.code for e in result.known_errors] == [code]
    assert result.known_errors[0].evidence_line in lines


def test_run_generate_uint8_model_is_rejected(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path / "models" / "u8.onnx", uint8=True)
    result = run_generate(tool=FAKE, model=model, workdir=tmp_path / "work", env=_env(), timeout_s=120)
    assert not result.ok
    (error,) = result.known_errors
    assert error.code == "uint8-activations" and error.details["option"] == "--quantize" and "rule" not in error.details


def _alive(pid: int) -> bool:
    stat_file = Path(f"/proc/{pid}/stat")
    if stat_file.exists():
        try:
            state = stat_file.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")  # a killed orphan may linger as a zombie
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.mark.skipif(os.name != "posix", reason="process-group kill is tested on POSIX")
def test_run_generate_timeout_kills_the_process_group(tmp_path: Path, model: Path) -> None:
    pidfile = tmp_path / "pids"
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"stedgeai did not finish within 2 s") as info:
        run_generate(tool=FAKE, model=model, workdir=tmp_path / "work", timeout_s=2, on_line=lines.append,
                     env=_env(FAKE_STEDGEAI_HANG="60", FAKE_STEDGEAI_PIDFILE=str(pidfile)))
    assert time.monotonic() - started < 20
    assert "EXECUTING NEURAL ART COMPILER" in str(info.value)  # the last line seen
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2  # stedgeai and its child (like atonn)
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def test_run_generate_callback_error_stops_the_tool(tmp_path: Path, model: Path) -> None:
    def explode(line: str) -> None:
        raise RuntimeError("consumer failed")

    with pytest.raises(RuntimeError, match="consumer failed"):
        run_generate(tool=FAKE, model=model, workdir=tmp_path / "work", on_line=explode, env=_env(), timeout_s=60)


def test_run_generate_usage_errors(tmp_path: Path, model: Path) -> None:
    with pytest.raises(UsageError, match="model's own folder"):
        run_generate(tool=FAKE, model=model, workdir=model.parent, env=_env())
    with pytest.raises(InputError, match="does not exist"):
        run_generate(tool=FAKE, model=tmp_path / "missing.onnx", workdir=tmp_path / "w", env=_env())
    with pytest.raises(UsageError, match="timeout"):
        run_generate(tool=FAKE, model=model, workdir=tmp_path / "w", timeout_s=0, env=_env())
    with pytest.raises(ToolError, match="could not be started"):
        run_generate(tool=tmp_path / "no-stedgeai", model=model, workdir=tmp_path / "w", env=_env())
