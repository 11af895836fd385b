"""Hostile JSON that nafix reads back (merged reports, baselines, cache entries) and hostile output
conditions (two outputs naming one file, a deleted current folder, a full stdout, a full disk).

Every case must end as documented: exit 0/1/2, one ``error:`` line naming the file (and the JSON
path of the bad value), no traceback, no temporary file left; a bad cache entry is recomputed."""

from __future__ import annotations

import copy
import errno
import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from fixer import json_schema as js
from fixer.errors import InputError, OutputError
from fixer.zoo import cache as zcache
from tests.helpers import run_cli as run

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "sample_models" / "classifier_softmax.onnx"
FORMATS = ["json", "table", "markdown", "sarif", "github", "html"]
NAFIX = Path(sys.executable).with_name("nafix")


@lru_cache(maxsize=1)
def _report() -> str:
    """A real one-model audit report (JSON text) of the softmax sample."""
    from fixer.api import AnalysisOptions
    from fixer.zoo.runner import build_report
    from fixer.zoo.worker import audit_one

    row = audit_one(str(SOFTMAX), AnalysisOptions())
    assert row["error"] is None and row["sw_nodes"] and row["sw_nodes"][0]["why"]
    return json.dumps(build_report([row], profile="stm32n6"))


def report() -> dict:
    return json.loads(_report())


def dump(obj) -> str:
    """JSON text with the placeholders "@NaN@", "@Infinity@", "@-Infinity@", "@1e400@" written raw."""
    text = json.dumps(obj)
    for raw in ("NaN", "Infinity", "-Infinity", "1e400"):
        text = text.replace(f'"@{raw}@"', raw)
    return text.replace('"@DEEP@"', "[" * 200_000 + "]" * 200_000)


def one_error_line(err: str) -> str:
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, err
    assert "internal error" not in errors[0], err
    return errors[0]


def no_temp_files(folder: Path) -> None:
    left = [p for p in folder.rglob("*") if p.name.endswith(".tmp")]
    assert left == [], left


def deep(n: int):
    v: list = []
    for _ in range(n):
        v = [v]
    return v


def _set(path: str, value):
    """A mutation of row 0 setting the value at ``path`` (dot and [i] separated)."""
    def mutate(row: dict) -> None:
        parts = path.replace("[", ".").replace("]", "").split(".")
        obj = row
        for p in parts[:-1]:
            obj = obj[int(p)] if isinstance(obj, list) else obj[p]
        last = parts[-1]
        if isinstance(obj, list):
            obj[int(last)] = value
        else:
            obj[last] = value
    return mutate


# Each: a mutation of the row nafix wrote, and the JSON path the error must name.
ROW_CASES = {
    "why_empty_object": (_set("sw_nodes[0].why", [{}]), "models[0].sw_nodes[0].why[0].constraint"),
    "string_count": (_set("estimate.sw_epochs", "1"), "models[0].estimate.sw_epochs"),
    "string_op_count": (_set("estimate.sw_ops", {"Softmax": "1"}), "models[0].estimate.sw_ops.Softmax"),
    "list_for_string": (_set("sw_nodes[0].op_type", ["Softmax"]), "models[0].sw_nodes[0].op_type"),
    "list_in_reasons": (_set("sw_nodes[0].reasons", [["nested"]]), "models[0].sw_nodes[0].reasons[0]"),
    "string_constraints": (_set("sw_nodes[0].constraints", "sw_op:Softmax"), "models[0].sw_nodes[0].constraints"),
    "unit_list": (_set("sw_nodes[0].unit", ["SW"]), "models[0].sw_nodes[0].unit"),
    "epoch_nodes_objects": (_set("epochs[0].nodes", [{}]), "models[0].epochs[0].nodes[0]"),
    "note_without_requirement": (_set("notes", [{"name": "n", "op_type": "Conv", "note": "x"}]),
                                 "models[0].notes[0].constraint"),
    "finding_int_severity": (_set("findings", [{"constraint": "c", "requirement": "r", "detail": "d", "tag": "t",
                                                "severity": 3}]), "models[0].findings[0].severity"),
    "huge_bytes": (_set("memory.weights_bytes", 10**400), "models[0].memory.weights_bytes"),
    "negative_epochs": (_set("estimate.epochs", -5), "models[0].estimate.epochs"),
    "ratio_out_of_range": (_set("estimate.hw_ratio", 7), "models[0].estimate.hw_ratio"),
    "ratio_bool": (_set("estimate.hw_ratio", True), "models[0].estimate.hw_ratio"),
    "ratio_nan": (_set("estimate.hw_ratio", "@NaN@"), "NaN"),
    "ratio_infinity": (_set("estimate.hw_ratio", "@Infinity@"), "Infinity"),
    "ratio_1e400": (_set("estimate.hw_ratio", "@1e400@"), "1e400"),
    "fits_string": (_set("memory.fits_on_chip", "yes"), "models[0].memory.fits_on_chip"),
    "path_nul": (_set("path", "/abs/a\0b.onnx"), "models[0].path"),
    "name_surrogate": (_set("sw_nodes[0].name", "bad\udc80"), "models[0].sw_nodes[0].name"),
    "path_list": (_set("path", ["a.onnx"]), "models[0].path"),
    "empty_error_no_estimate": (_set("estimate", None), "models[0].estimate"),
    "error_not_text": (_set("error", {"x": 1}), "models[0].error must be a non-empty string"),
    "deep_import_check": (_set("import_check", {"x": deep(60)}), "nested too deeply"),
    "very_deep": (_set("import_check", "@DEEP@"), "nested too deeply"),
    "row_is_text": (lambda r: r.clear() or r.update(path=1), "models[0].path"),
}


@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_merge_refuses_a_hostile_row_with_one_error_line(tmp_path, capsys, case):
    mutate, needle = ROW_CASES[case]
    rep = report()
    mutate(rep["models"][0])
    p = tmp_path / "r.json"
    p.write_text(dump(rep), encoding="utf-8", errors="surrogatepass")
    for fmt in ("sarif", "markdown"):
        out_file = tmp_path / f"merged.{fmt}"
        code, out, err = run(["audit", "merge", p, "-f", fmt, "-o", out_file], capsys)
        line = one_error_line(err)
        assert code == 2 and out == "" and str(p) in line and needle in line, line
        assert not out_file.exists()
    no_temp_files(tmp_path)


def test_the_schema_takes_every_row_nafix_writes():
    """The rows of the sample models (and their baseline) fit the schema: it is not stricter than
    the writers."""
    from fixer.api import AnalysisOptions
    from fixer.zoo.baseline import make_baseline
    from fixer.zoo.runner import build_report
    from fixer.zoo.worker import audit_one, error_row

    models = sorted(SOFTMAX.parent.glob("*.onnx"))[:4] + [SOFTMAX.parent / "denoiser_257.onnx",  # notes
                                                         ROOT / "tests" / "data" / "tflite" / "int8_cnn.tflite"]
    rows = [audit_one(str(p), AnalysisOptions()) for p in models]
    assert all(r["error"] is None for r in rows) and any(r["notes"] for r in rows)
    assert any(r.get("import_check") for r in rows)
    rows.append(error_row("broken.onnx", "broken.onnx: not a model."))
    rep = json.loads(js.dumps(build_report(rows, profile="stm32n6")))
    assert js.problem(rep, js.REPORT) is None
    assert js.problem(json.loads(js.dumps(make_baseline(rep))), js.BASELINE) is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_well_formed_report_merges_in_every_format(tmp_path, capsys, fmt):
    p = tmp_path / "r.json"
    p.write_text(_report())
    code, out, err = run(["audit", "merge", p, "-f", fmt], capsys)
    assert code == 0 and "error" not in err and out


@pytest.mark.skipif(sys.platform != "linux", reason="file names of any bytes")
def test_a_model_named_with_bytes_that_are_not_utf8_reports_and_merges_in_every_format(tmp_path, capsys):
    folder = tmp_path / "zoo"
    folder.mkdir()
    (folder / os.fsdecode(b"\xff.onnx")).write_bytes(SOFTMAX.read_bytes())
    code, out, err = run(["audit", folder, "-f", "json", "-o", tmp_path / "r.json"], capsys)
    assert code == 0, err
    for fmt in FORMATS:
        for dest in (["-o", tmp_path / f"out.{fmt}"], []):
            code, out, err = run(["audit", "merge", tmp_path / "r.json", "-f", fmt, *dest], capsys)
            assert code == 0 and "error" not in err, err
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    assert sarif["runs"][0]["artifacts"][0]["location"]["uri"].endswith("zoo/%FF.onnx")
    assert "\\udcff.onnx" in (tmp_path / "out.markdown").read_text()


def test_merge_of_a_report_with_an_error_row_says_why(tmp_path, capsys):
    from fixer.zoo.runner import build_report
    from fixer.zoo.worker import error_row

    p = tmp_path / "r.json"
    p.write_text(json.dumps(build_report([error_row("m.onnx", "m.onnx: not a valid ONNX model.")], profile="stm32n6")))
    code, out, err = run(["audit", "merge", p, "-f", "json"], capsys)
    assert code == 2 and json.loads(out)["models"][0]["error"] == "m.onnx: not a valid ONNX model."
    assert one_error_line(err) == "error: m.onnx: not a valid ONNX model."


def test_a_shard_count_of_a_trillion_costs_nothing(tmp_path, capsys):
    rep = report()
    rep["shard"] = {"index": 3, "count": 10**12}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(rep))
    code, out, err = run(["audit", "merge", p, "-f", "json"], capsys)  # a set of 10^12 would never end
    assert code == 0 and "warning: shard(s) 1/1000000000000, 2/1000000000000, 4/1000000000000" in err
    assert "and 999,999,999,979 more missing" in err
    merged = js.parse_json(out)  # strict: no NaN/Infinity
    assert "shard" not in merged and merged["models"][0]["path"] == str(SOFTMAX)


@pytest.mark.parametrize("shard,needle", [
    ({"index": 5, "count": 3}, "shard.index 5 is more than shard.count 3"),
    ({"index": 1, "count": 10**30}, "shard.count must be an integer from 1 to"),
    ({"index": 0, "count": 3}, "shard.index must be an integer from 1 to"),
    ({"index": "1", "count": 3}, "shard.index must be an integer"),
])
def test_a_bad_shard_header_is_one_error_line(tmp_path, capsys, shard, needle):
    rep = report()
    rep["shard"] = shard
    p = tmp_path / "r.json"
    p.write_text(json.dumps(rep))
    code, out, err = run(["audit", "merge", p], capsys)
    assert code == 2 and needle in one_error_line(err)


@pytest.mark.parametrize("text,needle", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("[]", "not a nafix audit JSON report"),
    ('{"nafix_version": "0.1.0", "profile": "p", "models": 3}', "models must be a list"),
    ('{"nafix_version": "0.1.0", "profile": 7, "models": []}', "profile must be a string"),
    ('{"nafix_version": NaN, "profile": "p", "models": []}', "NaN"),
    ("\xff\xfe{", "not"),
    ('{"models": [], "x": ' + "9" * 5000 + "}", "not valid JSON"),
])
def test_a_hostile_report_file_is_one_error_line(tmp_path, capsys, text, needle):
    p = tmp_path / "r.json"
    p.write_bytes(text.encode("latin-1"))
    code, out, err = run(["audit", "merge", p], capsys)
    line = one_error_line(err)
    assert code == 2 and str(p) in line and needle in line, line


def test_a_report_larger_than_the_bound_is_refused_unread(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(js, "MAX_REPORT_BYTES", 1000)
    p = tmp_path / "r.json"
    p.write_text(_report())
    code, out, err = run(["audit", "merge", p], capsys)
    assert code == 2 and "more than the 1,000 nafix reads" in one_error_line(err)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_given_as_report_or_baseline_does_not_block(tmp_path):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    for args in (["audit", "merge", str(fifo)], ["audit", str(SOFTMAX), "--baseline", str(fifo)]):
        proc = subprocess.run([str(NAFIX), *args], capture_output=True, text=True, timeout=120)  # hang guard
        assert proc.returncode == 2 and "not a regular file" in one_error_line(proc.stderr)


# ---------------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------------


def _baseline(tmp_path, capsys, monkeypatch) -> tuple[Path, dict]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.onnx").write_bytes(SOFTMAX.read_bytes())
    code, _, err = run(["audit", "m.onnx", "--write-baseline", "b.json"], capsys)
    assert code == 0, err
    return tmp_path / "b.json", json.loads((tmp_path / "b.json").read_text())


BASELINE_CASES = {
    "constraints_string": (lambda e: e["sw_nodes"]["softmax"].update(constraints="abc"),
                           'models["m.onnx"].sw_nodes.softmax.constraints must be a list'),
    "constraints_nested": (lambda e: e["sw_nodes"]["softmax"].update(constraints=[[1]]),
                           'models["m.onnx"].sw_nodes.softmax.constraints[0] must be a string'),
    "node_not_object": (lambda e: e["sw_nodes"].update(softmax=[]), 'models["m.onnx"].sw_nodes.softmax must be an object'),
    "op_type_number": (lambda e: e["sw_nodes"]["softmax"].update(op_type=3), "op_type must be a string"),
    "ratio_string": (lambda e: e.update(hw_ratio="0.5"), 'models["m.onnx"].hw_ratio must be a number'),
    "ratio_nan": (lambda e: e.update(hw_ratio="@NaN@"), "NaN"),
    "fits_string": (lambda e: e.update(fits_on_chip="no"), "fits_on_chip must be true or false"),
    "compile_errors_objects": (lambda e: e.update(compile_errors=[{}]), "compile_errors[0] must be a string"),
    "sha_list": (lambda e: e.update(sha256=[]), 'models["m.onnx"].sha256 must be null or a string'),
    "deep_extra": (lambda e: e.update(extra=deep(100)), "nested too deeply"),
    "very_deep": (lambda e: e.update(extra="@DEEP@"), "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(BASELINE_CASES))
def test_a_baseline_with_wrong_types_deeper_down_is_one_error_line(tmp_path, capsys, monkeypatch, case):
    mutate, needle = BASELINE_CASES[case]
    b, data = _baseline(tmp_path, capsys, monkeypatch)
    mutate(data["models"]["m.onnx"])
    b.write_text(dump(data))
    code, out, err = run(["audit", "m.onnx", "--baseline", "b.json"], capsys)
    line = one_error_line(err)
    assert code == 2 and out == "" and "b.json" in line and needle in line, line


def test_a_baseline_keyed_by_a_nul_path_is_refused(tmp_path, capsys, monkeypatch):
    b, data = _baseline(tmp_path, capsys, monkeypatch)
    data["models"]["a\0b.onnx"] = data["models"]["m.onnx"]
    b.write_text(json.dumps(data))
    code, out, err = run(["audit", "m.onnx", "--baseline", "b.json"], capsys)
    assert code == 2 and "must not hold a NUL byte" in one_error_line(err)


# ---------------------------------------------------------------------------------------------
# The cache: a bad entry is ignored and recomputed
# ---------------------------------------------------------------------------------------------


CACHE_CASES = {
    "why_empty_object": lambda e: _set("sw_nodes[0].why", [{}])(e["row"]),
    "string_count": lambda e: _set("estimate.sw_epochs", "1")(e["row"]),
    "reasons_objects": lambda e: _set("sw_nodes[0].reasons", [{}])(e["row"]),
    "nan_ratio": lambda e: _set("estimate.hw_ratio", "@NaN@")(e["row"]),
    "nul_path": lambda e: _set("path", "/x\0y.onnx")(e["row"]),
    "deep": lambda e: _set("import_check", "@DEEP@")(e["row"]),
    "error_row": lambda e: e["row"].update(error="cached failure"),
    "top_level_list": lambda e: e.clear(),
}


@pytest.mark.parametrize("case", sorted(CACHE_CASES))
def test_a_poisoned_cache_entry_is_recomputed(tmp_path, capsys, case):
    cache_dir = Path(os.environ["NAFIX_CACHE_DIR"])  # the conftest's private cache
    model = tmp_path / "m.onnx"
    model.write_bytes(SOFTMAX.read_bytes())
    code, first, err = run(["audit", model, "-f", "json"], capsys)
    assert code == 0, err
    (entry_file,) = cache_dir.rglob("*.json")
    entry = json.loads(entry_file.read_text())
    CACHE_CASES[case](entry)
    entry_file.write_text(dump(entry if entry else []))
    for fmt in FORMATS:
        code, out, err = run(["audit", model, "-f", fmt], capsys)
        assert code == 0 and "error" not in err and "Traceback" not in err, err
        if fmt == "json":
            assert json.loads(out) == json.loads(first)  # recomputed, not the poisoned row
    assert js.problem(json.loads(entry_file.read_text()), js.cache_entry(entry_file.stem)) is None  # replaced
    no_temp_files(cache_dir)


def test_cache_get_ignores_a_fifo_and_an_oversized_entry(tmp_path, monkeypatch):
    cache = zcache.Cache(tmp_path)
    key = "ab" * 32
    f = cache._file(key)
    f.parent.mkdir(parents=True)
    if hasattr(os, "mkfifo"):
        os.mkfifo(f)
        assert cache.get(key) is None  # returns at once (a blocking open would hang here)
        f.unlink()
    cache.put(key, {"path": "m.onnx", "error": None})  # not a row nafix writes: never served
    assert f.is_file() and cache.get(key) is None
    row = report()["models"][0]
    cache.put(key, row)
    assert cache.get(key) == row
    monkeypatch.setattr(zcache, "MAX_CACHE_ENTRY_BYTES", 10)
    assert cache.get(key) is None  # larger than the bound: not even read


class _FullDisk:
    """A file object whose writes fail as on a full disk (or raise ``exc``)."""

    def __init__(self, real, exc):
        self.real, self.exc = real, exc

    def write(self, _data):
        raise self.exc

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.real.close()
        return False


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_cache_put_on_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch, exc):
    real_fdopen = os.fdopen
    monkeypatch.setattr(zcache.os, "fdopen", lambda fd, *a, **k: _FullDisk(real_fdopen(fd, *a, **k), exc))
    cache = zcache.Cache(tmp_path)
    row = json.loads(_report())["models"][0]
    if isinstance(exc, OSError):
        cache.put("cd" * 32, row)  # only costs speed
    else:
        with pytest.raises(KeyboardInterrupt):
            cache.put("cd" * 32, row)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_write_output_on_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    from fixer import outputs

    real_open = open
    monkeypatch.setattr(outputs, "open", lambda *a, **k: _FullDisk(real_open(*a, **k),
                                                                     OSError(errno.ENOSPC, "No space left on device")),
                        raising=False)
    with pytest.raises(OutputError, match="No space left on device"):
        outputs.write_output(tmp_path / "r.json", "{}")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Writers: strict JSON only
# ---------------------------------------------------------------------------------------------


def test_dumps_never_writes_nan_or_infinity():
    text = js.dumps({"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": (2,)}, indent=1)
    assert json.loads(text) == {"a": None, "b": [None, None, 1.5], "c": [2]}
    assert "NaN" not in text and "Infinity" not in text
    with pytest.raises(TypeError):
        js.dumps({"x": object()})


def test_sarif_of_a_nul_or_loop_path_does_not_fail(tmp_path):
    from fixer.report_ci import sarif_text

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    rep = report()
    bad = [dict(rep["models"][0], path=p) for p in ("/abs/a\0b.onnx", str(loop / "m.onnx"))]
    rep["models"] = bad
    rep["models"][0]["import_check"] = {"max_rel": float("nan")}
    sarif = json.loads(sarif_text(rep))
    uris = [a["location"]["uri"] for a in sarif["runs"][0]["artifacts"]]
    assert uris[0] == "file:///abs/a%00b.onnx" and uris[1].startswith("file://")


# ---------------------------------------------------------------------------------------------
# Outputs: two options naming one file, a deleted current folder, a full stdout
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("report_opt,baseline_opt", [
    ("r.json", "r.json"),
    ("./r.json", "sub/../r.json"),
    ("out/", "out/nafix-audit.json"),
    ("link.json", "r.json"),
])
def test_two_outputs_naming_one_file_are_refused(tmp_path, capsys, monkeypatch, report_opt, baseline_opt):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "m.onnx").write_bytes(SOFTMAX.read_bytes())
    if report_opt == "link.json":
        assert run(["audit", "m.onnx", "-f", "json", "-o", "r.json"], capsys)[0] == 0
        (tmp_path / "link.json").symlink_to(tmp_path / "r.json")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, out, err = run(["audit", "m.onnx", "-f", "json", "-o", report_opt, "--write-baseline", baseline_opt], capsys)
    line = one_error_line(err)
    assert code == 2 and "-o/--output and --write-baseline both name" in line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_the_report_never_replaces_the_baseline_it_compares_with(tmp_path, capsys, monkeypatch):
    b, data = _baseline(tmp_path, capsys, monkeypatch)
    text = b.read_text()
    code, out, err = run(["audit", "m.onnx", "--baseline", "b.json", "-f", "json", "-o", "b.json"], capsys)
    assert code == 2 and "refusing to write over the input file" in one_error_line(err)
    assert b.read_text() == text
    # refreshing the baseline it was compared with stays allowed
    code, out, err = run(["audit", "m.onnx", "--baseline", "b.json", "--write-baseline", "b.json"], capsys)
    assert code == 0, err


def test_write_baseline_from_a_deleted_current_folder(tmp_path, capsys, monkeypatch):
    import onnxruntime  # noqa: F401 - loaded: the workers come from the fork server, which takes the current folder

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    code, out, err = run(["audit", SOFTMAX, "--write-baseline", "b.json"], capsys)
    assert code == 2 and "the current folder no longer exists" in one_error_line(err)
    dest = tmp_path / "b.json"
    code, out, err = run(["audit", SOFTMAX, "--write-baseline", dest], capsys)
    assert code == 0, err
    assert str(SOFTMAX) in json.loads(dest.read_text())["models"]  # absolute: no current folder to be relative to


@pytest.mark.parametrize("value,code", [("inf", 0), ("nan", 2)])
def test_timeout_inf_is_no_limit_and_nan_is_refused(capsys, value, code):
    got, out, err = run(["audit", SOFTMAX, "--timeout", value], capsys)
    assert got == code, err
    if code:
        assert "--timeout" in one_error_line(err)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [
    ["audit", str(SOFTMAX)],
    ["audit", str(SOFTMAX), "-f", "json"],
    ["rules", "NAF001"],
    ["--help"],  # printed by typer's own Rich console
])
def test_a_full_stdout_is_one_error_line(args):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([str(NAFIX), *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    line = one_error_line(proc.stderr)
    assert proc.returncode == 2 and "cannot write to standard output" in line and "No space left" in line


def test_read_json_file_names_the_path_of_the_first_bad_value(tmp_path):
    p = tmp_path / "b.json"
    p.write_text(json.dumps({"schema": "nafix-baseline/1", "models": {"a b.onnx": {"sw_nodes": {},
                                                                                   "hw_ratio": 0.5, "fits_on_chip": 1}}}))
    with pytest.raises(InputError) as info:
        js.read_json_file(p, js.BASELINE, what="baseline file", hint="write it again.")
    assert info.value.message == (f'{p}: models["a b.onnx"].fits_on_chip must be true or false, not an integer; '
                                  "write it again.")
    assert js.problem(copy.deepcopy(report()), js.REPORT) is None


def test_other_json_inputs_nested_too_deeply_are_one_error(tmp_path, capsys):
    """The .mpool file and stedgeai's c_info JSON have their own shapes; a few KB of '[' is one
    error there too, not a RecursionError."""
    from fixer.stedgeai.reports import load_c_info

    deep_text = "[" * 100_000 + "]" * 100_000
    mpool = tmp_path / "deep.mpool"
    mpool.write_text(deep_text)
    code, out, err = run(["audit", SOFTMAX, "--mpool", mpool], capsys)
    assert code == 2 and "nested too deeply" in one_error_line(err)
    c_info = tmp_path / "network_c_info.json"
    c_info.write_text(deep_text)
    with pytest.raises(InputError, match="nested too deeply"):
        load_c_info(c_info)
