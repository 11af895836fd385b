"""`nafix calibrate`: the placement model against every real stedgeai report in ../shared/reference/pairs
(skipped when absent), and the report reading it relies on (on small texts, always)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from fixer.calibrate import CalibrationRow, calibrate, clean_report_text, core_of, placement_options

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT.parent / "shared" / "reference" / "pairs"
EXCEPTIONS = yaml.safe_load((ROOT / "docs" / "calibration_exceptions.yaml").read_text())

needs_pairs = pytest.mark.skipif(not PAIRS.is_dir(), reason=f"{PAIRS} (real reports) is not available")


@lru_cache(maxsize=None)
def rows() -> tuple[CalibrationRow, ...]:
    return tuple(calibrate(PAIRS))


# ------------------------------------------------------------------------------ on the real pairs


@needs_pairs
def test_every_pair_folder_gives_rows_and_every_row_is_estimated():
    folders = {p.name for p in PAIRS.iterdir() if p.is_dir()}
    assert {r.pair for r in rows()} == folders  # adding a pair is dropping a folder: nothing lists them
    assert [r.report for r in rows() if not r.estimated] == []


@needs_pairs
def test_every_report_is_on_target_or_a_documented_exception():
    """SW op multiset equal to the report's, hybrid ops too where the report counts them (3.x/4.x), the
    estimated epoch total within 10 %; the exceptions are exactly those docs/calibration_exceptions.yaml
    gives evidence for, missing exactly the parts it lists."""
    got = {r.report: sorted(r.failed()) for r in rows() if r.failed()}
    want = {k: sorted(v["fails"]) for k, v in EXCEPTIONS.items()}
    assert got == want


@needs_pairs
def test_documented_exceptions_name_real_reports_with_evidence():
    reports = {r.report for r in rows()}
    for key, entry in EXCEPTIONS.items():
        assert key in reports, key
        assert len(entry["why"].split()) >= 15, key  # a reason with its evidence, not a label


@needs_pairs
def test_rows_read_core_options_and_model_from_the_report_itself():
    by = {r.report: r for r in rows()}
    face = by["jjtan_face_landmark_ptq/face_landmark_generate_report__44f316f.txt"]
    assert face.core == "2.2.0"
    assert face.options == ("--input-data-type uint8", "--inputs-ch-position chlast", "--output-data-type int8")
    assert face.model == "jjtan_face_landmark_ptq/face_landmark_ptq.tflite"
    mfn = by["mobilefacenet_int8_faces/report.txt"]
    assert mfn.options == ("--input-data-type float32",) and mfn.core == "2.2.0"
    # the 4.0.1 console log names its model by model_hash: the md5-named file in the folder, not ../models
    mnv2 = by["magnus_mobilenet_v2_224_int8/aistudio_core4.0.1_mobilenet_v2_224.txt"]
    assert mnv2.model.endswith("mobilenet_v2_224_int8__md5_459f32cf.onnx") and mnv2.core == "4.0.1"
    assert mnv2.real_sw_ops == Counter({"DequantizeLinear": 1, "GlobalAveragePool(float)": 1, "QuantizeLinear": 1})
    assert mnv2.est_sw_ops == mnv2.real_sw_ops  # the float GAP tail, named as 4.x names it
    # duplicated runs (same model, core, options and figures) are folded into one row
    assert by["st_yolo_x_nano_480_core3/network_generate_report.txt"].runs == 2


@needs_pairs
def test_hybrid_epochs_and_lowerings_match_the_3x_reports():
    by = {r.report: r for r in rows()}
    yolox = by["st_yolo_x_nano_480_core3/network_generate_report.txt"]
    assert (yolox.real_sw, yolox.real_hybrid) == (0, 2)
    assert (yolox.est_sw, yolox.est_hybrid) == (0, 2)
    assert yolox.est_hybrid_ops == Counter({"DepthToSpace": 2})  # two RESIZE_NEAREST, lowered
    steel = by["steel_yolov8n/network_generate_report.txt"]  # the same lowering is pure SW in 2.0
    assert steel.est_sw_ops["DepthToSpace"] == 2 and steel.est_hybrid == 0


@needs_pairs
def test_readme_calibration_and_core_tables_are_current():
    from fixer.calibrate import (CALIBRATION_BEGIN, CALIBRATION_END, CORES_BEGIN, CORES_END, calibration_block,
                                 cores_block, replace_block)
    from fixer.npu.profile import load_profile

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    want = replace_block(text, CORES_BEGIN, CORES_END, cores_block(load_profile()))
    want = replace_block(want, CALIBRATION_BEGIN, CALIBRATION_END, calibration_block(list(rows()), EXCEPTIONS))
    assert text == want, "README is stale: run python scripts/calibration_readme.py"


@needs_pairs
def test_calibrate_cli_json(tmp_path):
    exe = Path(sys.executable).with_name("nafix")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "fixer.cli"]
    # a user's own folder: one pair copied, its reports only next to its model
    src = PAIRS / "yamnet_1024_64x96_tl_qdq_int8"
    own = tmp_path / "pairs" / "yamnet"
    own.mkdir(parents=True)
    for f in ("report.txt", "report_2.txt"):
        (own / f).write_text((src / f).read_text())
    (own / "model.onnx").write_bytes((ROOT.parent / "shared" / "models" / "pair__yamnet_1024_64x96_tl_qdq_int8.onnx")
                                     .read_bytes())
    proc = subprocess.run(cmd + ["calibrate", str(tmp_path / "pairs"), "--format", "json"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["estimated"] is True and data["summary"]["rows"] == 2
    cores = sorted(r["core"] for r in data["rows"])
    assert cores == ["2.1.0", "2.2.0"]
    for r in data["rows"]:
        assert r["on_target"] and r["sw_ops_diff"] == [] and r["real"]["epochs"] == 39
    table = subprocess.run(cmd + ["calibrate", str(tmp_path / "pairs")], capture_output=True, text=True, timeout=300)
    assert table.returncode == 0 and "| yamnet | report.txt | 2.2.0 |" in table.stdout
    assert "2 of 2 estimated reports on target" in table.stdout
    bad = subprocess.run(cmd + ["calibrate", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "not a folder" in bad.stderr


# ------------------------------------------------------------------------------ report reading


def test_console_log_prefixes_and_blank_table_lines_are_removed():
    text = ("2026-06-16 21:38:16,983 [INFO] CmdLine:76 - Total number of epochs: 3 of which 1 implemented in software\n"
            "2026-06-16 21:38:16,983 [INFO] CmdLine:76 - epoch 1       HW\n\n"
            "| epoch_2 | SW | Softmax |\n")
    assert clean_report_text(text).splitlines() == [
        "Total number of epochs: 3 of which 1 implemented in software", "epoch 1       HW", "| epoch_2 | SW | Softmax |"]


def test_core_and_placement_options_from_a_command_line():
    assert core_of("4.0.1-20581") == "4.0.1" and core_of(None) == ""
    cmd = ("generate --name fl --model m.tflite --target stm32n6 --st-neural-art fl@user.json "
           "--input-data-type uint8 --inputs-ch-position chlast --output-data-type=int8 --no-inputs-allocation "
           "--workspace /tmp/w")
    assert placement_options(cmd) == ("--input-data-type uint8", "--inputs-ch-position chlast",
                                      "--no-inputs-allocation", "--output-data-type int8")
    assert placement_options(None) == ()


def test_row_failure_kinds():
    r = CalibrationRow(pair="p", report="p/r.txt", core="4.0.1", real_epochs=100, real_sw=1, real_hybrid=2,
                       real_sw_ops=Counter({"Softmax": 1}), real_hybrid_ops=Counter({"DepthToSpace": 2}),
                       est_epochs=111, est_sw=1, est_hybrid=1, est_sw_ops=Counter({"Softmax": 1}),
                       est_hybrid_ops=Counter({"DepthToSpace": 1}))
    assert sorted(r.failed()) == ["epochs", "hybrid_ops"]
    assert r.hybrid_diff() == ["-DepthToSpace"]
    r.est_epochs, r.est_hybrid_ops = 109, Counter({"DepthToSpace": 2})
    assert r.failed() == {}
    assert CalibrationRow(pair="p", report="p/r.txt", status="no model").failed() == {"not_estimated": "no model"}
