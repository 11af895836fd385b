"""What stops the build is not buried: a model stedgeai is predicted to reject (compile error) or
that compiles but is predicted to hang the board has a status in every format's table, per model
in the JSON, and is counted in the zoo summary; ``--input-shape`` writes the static-shape model
(issue 36)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer.api import AnalysisOptions, FixOptions, audit, fix
from fixer.report import audit_markdown, audit_renderables
from fixer.report_ci import concise_text, github_annotations, sarif_report, step_summary_markdown
from fixer.zoo.runner import audit_dict
from tests.helpers import QDQ, run_cli, save
from tests.test_zoo import softmax_chain

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"


def reshape_relu_hang():
    """QDQ Conv -> Reshape -> Relu: compiles with no SW epoch but hangs the board."""
    b = QDQ()
    y = b.op("Conv", [b.input("x", [1, 4, 8, 8]), b.weight("w", [8, 4, 1, 1])], name="conv")
    y = b.op("Reshape", [y, b.const("shape", np.array([1, 8, 64, 1], np.int64))], name="reshape")
    y = b.op("Relu", [y], name="relu")
    b.output(y)
    return b.model()


@pytest.fixture
def report(tmp_path) -> dict:
    folder = tmp_path / "zoo"
    folder.mkdir()
    shutil.copy(SAMPLES / "uint8_default_quant.onnx", folder / "u8.onnx")
    save(reshape_relu_hang(), folder / "hang.onnx")
    save(softmax_chain(1), folder / "fine.onnx")
    return audit_dict(audit([str(folder)]), profile="stm32n6")


def rows(report):
    return {Path(r["path"]).name: r for r in report["models"]}


def test_json_status_per_model_and_summary_counts(report):
    r = rows(report)
    assert (r["u8.onnx"]["status"], r["hang.onnx"]["status"], r["fine.onnx"]["status"]) == ("compile_error", "hang", "ok")
    s = report["summary"]
    assert s["compile_errors"] == 1 and s["board_hangs"] == 1
    assert [Path(p).name for p in s["status"]["compile_error"]] == ["u8.onnx"]
    assert [Path(p).name for p in s["status"]["hang"]] == ["hang.onnx"]


def _table_line(text: str, name: str) -> str:
    (line,) = [x for x in text.splitlines() if name in x and x.lstrip().startswith(("|", "│"))]
    return line


def test_every_format_table_has_the_status(report):
    md = audit_markdown(report)
    step = step_summary_markdown(report)
    from rich.console import Console

    console = Console(width=400, record=True, color_system=None)
    for r in audit_renderables(report):
        console.print(r)
    table = console.export_text()
    for text in (md, step, table):
        assert "COMPILE ERROR" in _table_line(text, "u8.onnx")
        assert "BOARD HANG" in _table_line(text, "hang.onnx")
        assert " ok " in _table_line(text, "fine.onnx")
    # a model stedgeai would reject is not shown green in the console table
    console = Console(width=400, record=True, color_system="truecolor", force_terminal=True)
    for r in audit_renderables(report):
        console.print(r)
    html = console.export_html(inline_styles=True)
    u8 = [x for x in html.splitlines() if "u8.onnx" in x and "%" in x][0]
    assert "#008000" not in u8 and "green" not in u8
    con = concise_text(report).splitlines()
    assert any("u8.onnx: status: COMPILE ERROR [compile_error]" in x for x in con)
    assert any("hang.onnx: status: BOARD HANG [hang]" in x for x in con)
    assert not any("fine.onnx: status" in x for x in con)
    gh = github_annotations(report).splitlines()
    assert any(x.startswith("::notice") and "u8.onnx" in x and "COMPILE ERROR: estimated" in x for x in gh)
    assert any(x.startswith("::notice") and "hang.onnx" in x and "BOARD HANG: estimated" in x for x in gh)
    sarif = sarif_report(report)["runs"][0]
    levels = {(Path(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]).name, r["level"])
              for r in sarif["results"] if r.get("properties", {}).get("severity") in ("compile_error", "hang")}
    assert levels == {("u8.onnx", "error"), ("hang.onnx", "error")}
    status = {Path(a["location"]["uri"]).name: a["properties"]["status"] for a in sarif["artifacts"]}
    assert status == {"u8.onnx": "compile_error", "hang.onnx": "hang", "fine.onnx": "ok"}
    assert "1 model(s) with a predicted compile error (stedgeai would reject it): u8.onnx" in md
    assert "1 model(s) with a predicted board hang: hang.onnx" in md


def test_cli_json_and_zoo_summary(tmp_path, capsys):
    shutil.copy(SAMPLES / "uint8_default_quant.onnx", tmp_path / "u8.onnx")
    save(softmax_chain(1), tmp_path / "fine.onnx")
    code, out, err = run_cli(["audit", tmp_path, "-f", "json", "--no-cache"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["summary"]["compile_errors"] == 1 and data["summary"]["board_hangs"] == 0
    assert {Path(r["path"]).name: r["status"] for r in data["models"]} == {"u8.onnx": "compile_error", "fine.onnx": "ok"}


# --------------------------------------------------------------------------------------------
# --input-shape writes the static-shape model
# --------------------------------------------------------------------------------------------


def dynamic_model(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, "h", "w"])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"], name="relu")], "g", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def dims(vi) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]


def test_input_shape_alone_writes_the_static_model_verified(tmp_path):
    src = dynamic_model(tmp_path / "dyn.onnx")
    before = audit([str(src)]).models[0].analysis
    assert any(f.constraint == "static_shape" and f.severity == "compile_error" for f in before.findings)
    r = fix(src, FixOptions(analysis=AnalysisOptions(input_shapes={"x": (1, 3, 48, 320)})))
    assert r.written and r.verified and not r.engine.changes
    assert r.verification.ok and r.verification.contract.contract == "exact"
    assert r.static_shape["inputs"] == {"x": [1, 3, 48, 320]}
    out = onnx.load(str(r.output))
    assert dims(out.graph.input[0]) == [1, 3, 48, 320]
    assert dims(out.graph.output[0]) == [1, 4, 48, 320]
    assert all(all(isinstance(d, int) and d > 0 for d in dims(vi)) for vi in out.graph.value_info)
    assert {p.key: p.value for p in out.metadata_props}["nafix.input_shape"] == "x=1,3,48,320"
    # the written model has no dynamic-shape compile error left
    after = audit([str(r.output)]).models[0].analysis
    assert not any(f.constraint == "static_shape" for f in after.findings)
    report = json.loads(r.report_path.read_text())
    assert report["static_shape"]["verification"]["ok"] is True
    # the written model computes what the dynamic one computes at that shape
    import onnxruntime as ort

    x = np.random.default_rng(1).standard_normal((1, 3, 48, 320)).astype(np.float32)
    a = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    b = ort.InferenceSession(str(r.output), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.array_equal(a, b)


def test_input_shape_cli_says_it_and_without_it_nothing_is_written(tmp_path, capsys):
    src = dynamic_model(tmp_path / "dyn.onnx")
    code, out, err = run_cli([src, "--fail-on", "never"], capsys)
    assert code == 0 and not (tmp_path / "dyn.nafix.onnx").exists()
    code, out, err = run_cli([src, "--input-shape", "x=1,3,48,320"], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "static input shape (--input-shape): x=1,3,48,320" in text and "verification: PASSED" in text
    assert (tmp_path / "dyn.nafix.onnx").exists()


# --------------------------------------------------------------------------------------------
# One audit path: api.audit and the zoo workers make their rows, error rows included, in one place
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [MemoryError(), RuntimeError("boom"), KeyError("k")])
def test_api_audit_and_zoo_worker_make_the_same_error_rows(tmp_path, monkeypatch, exc):
    import fixer.api as api
    from fixer.zoo import worker

    path = tmp_path / "m.onnx"
    save(softmax_chain(1), path)

    def broken(*a, **k):
        raise exc

    monkeypatch.setattr(api, "analyze_path", broken)
    worker._resolved.clear()
    zoo_row = worker.audit_one(str(path), AnalysisOptions())
    (api_row,) = audit_dict(audit([str(path)]), profile="stm32n6")["models"]
    assert zoo_row["error"] == api_row["error"] and zoo_row["error"].startswith(str(path))
    assert {k: v for k, v in zoo_row.items() if k != "sha256"} == {k: v for k, v in api_row.items() if k != "sha256"}
    if isinstance(exc, MemoryError):
        assert api_row["error"] == f"{path}: nafix ran out of memory analysing this model."


def test_api_audit_and_zoo_worker_make_the_same_rows(tmp_path):
    from fixer.zoo import worker

    path = tmp_path / "m.onnx"
    shutil.copy(SAMPLES / "classifier_softmax_float.onnx", path)
    worker._resolved.clear()
    zoo_row = worker.audit_one(str(path), AnalysisOptions())
    (api_row,) = audit_dict(audit([str(path)]), profile="stm32n6")["models"]
    assert zoo_row["quantize"] is not None and zoo_row["status"] == "ok"
    assert {k: v for k, v in zoo_row.items() if k != "sha256"} == {k: v for k, v in api_row.items() if k != "sha256"}
