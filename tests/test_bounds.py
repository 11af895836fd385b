"""Input that costs nothing to make must not take the machine (issue 32, "Hangs and resource
exhaustion"): report parsing bounded by the input's size, regular files everywhere a path is read
(FIFOs), the stedgeai runner's process group, a time limit on the stages of ``nafix MODEL`` that run
onnxruntime, ``calibrate`` paths confined to the pairs folder, time limits validated at the CLI.

Every test that could hang runs under a hang guard (a subprocess timeout, or a thread joined with a
timeout); no test asserts on wall time otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_stedgeai" / "stedgeai"
MOVENET = ROOT / "sample_models" / "movenet_like.onnx"
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX process groups")

FORMAT_B = """ST Edge AI Core v4.0.1-20581
Compiler version: 1.2.3
Parameters: generate -m model.onnx --target stm32n6 --st-neural-art --input-data-type float32

Epochs details
Total number of epochs 3
 >> pure software (SW) epochs  1
 >> hybrid epochs  0
 >> pure hardware (HW or EC) epochs  2 (implemented in 1 epoch controller blobs)

+----------+------+---------+
| epoch ID | Type | Details |
+----------+------+---------+
{rows}
+----------+------+---------+
"""


def _format_b(rows: str) -> str:
    return FORMAT_B.format(rows=rows)


def _nafix(args, *, timeout: float = 60, env=None, cwd=None) -> subprocess.CompletedProcess:
    """``nafix ARGS`` as a real command, under a hang guard."""
    return subprocess.run([sys.executable, "-c", "from fixer.cli import main; main()", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def _guarded(fn, seconds: float = 20):
    """``fn()`` in a thread, joined with a timeout: a blocking call fails the test instead of hanging it."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"blocked for more than {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


# ------------------------------------------------------------------------------------------------
# 1. report parsing bounded by the input
# ------------------------------------------------------------------------------------------------

def test_an_epoch_range_larger_than_the_report_is_refused_not_expanded():
    from fixer.stedgeai import MalformedReport, parse_report

    ok = parse_report(_format_b("| epoch 1 | SW | Softmax |\n| epochs 2 -> 3 | EC | |"))
    assert [r.id for r in ok.epoch_rows] == [1, 2, 3] and ok.sw_ops == ("Softmax",)
    assert ok.command.startswith("generate -m model.onnx") and ok.compiler_version == "1.2.3"
    assert ok.ec_blobs == 1 and (ok.sw_epochs, ok.hybrid_epochs, ok.hw_epochs) == (1, 0, 2)
    hostile = _format_b("| epochs 1 -> 1000000000 | SW | Conv |")
    assert len(hostile) < 1000
    with pytest.raises(MalformedReport, match="spans 1000000000 epochs"):
        _guarded(lambda: parse_report(hostile))
    # many single rows beyond the report's total are refused too
    with pytest.raises(MalformedReport, match="more rows"):
        parse_report(_format_b("\n".join(f"| epoch {i} | HW | |" for i in range(1, 400))))


def test_explain_compile_and_calibrate_say_so_on_a_hostile_epoch_range(tmp_path, capsys, monkeypatch):
    hostile = _format_b("| epochs 1 -> 1000000000 | SW | Conv |")
    report = tmp_path / "r.txt"
    report.write_text(hostile)
    code, out, err = _guarded(lambda: run_cli(["explain", report, "--format", "json"], capsys))
    data = json.loads(out)
    assert code == 0 and "report" not in data and "spans 1000000000 epochs" in data["report_error"]

    pairs = tmp_path / "pairs"
    (pairs / "p").mkdir(parents=True)
    shutil.copy(MOVENET, pairs / "p" / "m.onnx")
    (pairs / "p" / "network_generate_report.txt").write_text(hostile)
    from fixer.calibrate import calibrate

    rows = _guarded(lambda: calibrate(pairs))
    assert len(rows) == 1 and rows[0].status == "error" and "spans 1000000000 epochs" in rows[0].note

    # compile: the stand-in writes the hostile report; no measurement -> exit 1 with one error line
    tool = _wrapper(tmp_path, f"""
        "{sys.executable}" "{FAKE}" "$@" || exit $?
        for f in $(find "$OUT" -name '*_generate_report.txt'); do cat "{report}" > "$f"; done
        """)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    code, out, err = _guarded(lambda: run_cli(["compile", MOVENET, "--stedgeai", tool, "--timeout", "60"], capsys), 60)
    assert code == 1 and len(_error_lines(err)) == 1 and "no report" in _error_lines(err)[0], err


def test_long_runs_of_blanks_parse_in_linear_time(tmp_path):
    """400 KB of spaces (or blank lines) around the labels the parsers look for: each parse must end
    well within the hang guard (the old patterns took over a minute on these)."""
    script = textwrap.dedent("""
        from fixer.stedgeai import parse_report, explain
        from fixer import calibrate as c
        N = 400_000
        base = ("ST Edge AI Core v2.2.0\\nTotal number of epochs 3\\n >> pure software (SW) epochs 1\\n"
                " >> hybrid epochs 0\\n >> pure hardware (HW or EC) epochs 2\\n")
        texts = ["Parameters : a" + " " * N + "b\\n" + base, "Compiler version :" + " " * N + "\\n" + base,
                 "stedgeai generate" + " " * N + "x\\n" + base, " " * N + "stedgeai\\n" + base,
                 "model file : a" + " " * N + "b\\n" + base, "\\n" * N + base, " \\n" * (N // 2) + base,
                 base + ">> a" + " 1" * (N // 2) + "\\n", "WARNING:" * (N // 8), "WARNING: " + "a" * N,
                 "../" * (N // 3), ">" * N + "\\n" + base, "stedgeai" * (N // 8) + "\\n" + base]
        for t in texts:
            try:
                parse_report(t)
            except Exception:
                pass
            explain(t)
            c._command(t, None), c._model_file_names(t), c._relative_paths(t), c.placement_options(t)
        from fixer.stedgeai import parse_epoch_csv
        for t in ('epoch,"' + ',"' * 200_000, "epoch;a\\n" + ';" ' * 100_000):
            try:
                parse_epoch_csv(t)
            except Exception:
                pass
        assert parse_epoch_csv("epoch;ms\\n1;2\\n").values("ms") == ("2",)
        r = parse_report("Parameters :   generate -m a.onnx   \\n" + base)
        assert r.command == "generate -m a.onnx", r.command
        print("done")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr


# ------------------------------------------------------------------------------------------------
# 2. regular files only: FIFOs never block
# ------------------------------------------------------------------------------------------------

@needs_fifo
def test_open_regular_refuses_fifos_and_folders_without_blocking(tmp_path):
    from fixer.fsutil import NotRegularFileError, open_regular, read_bytes, read_text

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError, match="FIFO"):
        _guarded(lambda: read_bytes(fifo))
    with pytest.raises(NotRegularFileError, match="folder"):
        open_regular(tmp_path)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")
    (tmp_path / "t.txt").write_bytes(b"a\r\nb")
    assert read_text(tmp_path / "t.txt") == "a\nb"


def _external_data_model(folder: Path) -> Path:
    """A model whose weight lives in external data ``w.bin`` (then swapped for a FIFO)."""
    import numpy as np
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")  # raw_data: saved as external data
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = folder / "ext.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                    size_threshold=0)
    (folder / "w.bin").unlink()
    os.mkfifo(folder / "w.bin")
    return path


@needs_fifo
def test_an_external_data_fifo_is_an_error_not_a_hang(tmp_path):
    model = _external_data_model(tmp_path)
    from fixer.errors import InputError
    from fixer.model_io import load_model
    from fixer.zoo.cache import content_sha256

    assert _guarded(lambda: content_sha256(model)) is None  # no cache key: the worker reports why
    with pytest.raises(InputError, match="w.bin.*FIFO"):
        _guarded(lambda: load_model(model))
    # the cached audit (the main process hashes before any worker or --timeout)
    done = _nafix(["audit", model, "--cache-dir", tmp_path / "cache"])
    assert done.returncode == 2 and len(_error_lines(done.stderr)) == 1 and "FIFO" in done.stderr, done.stderr


@needs_fifo
def test_a_fifo_in_the_cache_folder_is_a_miss(tmp_path):
    from fixer.zoo.cache import Cache

    cache = Cache(tmp_path)
    key = "ab" + "0" * 62
    entry = cache._file(key)
    entry.parent.mkdir(parents=True)
    os.mkfifo(entry)
    assert _guarded(lambda: cache.get(key)) is None and cache.misses == 1
    # and the audit that looks that entry up goes on (its key is unknown here: every entry is a FIFO)
    model = tmp_path / "m.onnx"
    shutil.copy(MOVENET, model)
    cache_dir = tmp_path / "c2"
    first = _nafix(["audit", model, "--cache-dir", cache_dir, "-f", "json"])
    assert first.returncode == 0, first.stderr
    entries = list((cache_dir / "v1").rglob("*.json"))
    assert len(entries) == 1
    entries[0].unlink()
    os.mkfifo(entries[0])
    again = _nafix(["audit", model, "--cache-dir", cache_dir, "-f", "json"])
    assert again.returncode == 0 and json.loads(again.stdout)["models"][0]["estimate"] is not None, again.stderr


@needs_fifo
def test_fifo_inputs_named_by_the_user_are_refused(tmp_path, capsys):
    fifo = tmp_path / "in.npz"
    os.mkfifo(fifo)
    model = tmp_path / "m.onnx"
    shutil.copy(MOVENET, model)
    code, out, err = _guarded(lambda: run_cli([model, "--inputs", fifo, "--dry-run", "--timeout", "0"], capsys), 60)
    assert code == 2 and len(_error_lines(err)) == 1 and "FIFO" in err, err
    report = tmp_path / "r.txt"
    os.mkfifo(report)
    code, out, err = _guarded(lambda: run_cli(["explain", report], capsys))
    assert code == 2 and len(_error_lines(err)) == 1, err
    from fixer.errors import InputError
    from fixer.stedgeai import load_report

    with pytest.raises(InputError, match="not a regular file"):
        _guarded(lambda: load_report(report))


def _wrapper(tmp_path: Path, generate_body: str) -> Path:
    """A stedgeai stand-in: ``--version`` from tests/fake_stedgeai, ``generate`` runs ``generate_body``
    (``$OUT`` / ``$WS`` are its --output / --workspace folders)."""
    tool = tmp_path / "bin" / "stedgeai"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then exec "{sys.executable}" "{FAKE}" "$@"; fi
        OUT=""; WS=""; prev=""
        for a in "$@"; do
          [ "$prev" = "--output" ] && OUT="$a"
          [ "$prev" = "--workspace" ] && WS="$a"
          prev="$a"
        done
        """) + textwrap.dedent(generate_body))
    tool.chmod(0o755)
    return tool


@needs_fifo
@posix_only
def test_a_fifo_csv_in_the_workspace_does_not_hang_compile(tmp_path, monkeypatch):
    tool = _wrapper(tmp_path, f"""
        "{sys.executable}" "{FAKE}" "$@" || exit $?
        mkfifo "$WS/epochs.csv"
        """)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    done = _nafix(["compile", MOVENET, "--stedgeai", tool, "--timeout", "60", "-f", "json"], env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stedgeai"]["epochs"] > 0


# ------------------------------------------------------------------------------------------------
# 3. the stedgeai runner
# ------------------------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@posix_only
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_child_holding_stedgeai_output_open_is_stopped(tmp_path):
    pidfile = tmp_path / "sleep.pid"
    tool = _wrapper(tmp_path, f"""
        "{sys.executable}" "{FAKE}" "$@" || exit $?
        sleep 1000 &
        echo $! > "{pidfile}"
        exit 0
        """)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    try:
        done = _nafix(["compile", MOVENET, "--stedgeai", tool, "--timeout", "5", "-f", "json"], env=env, timeout=90)
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert data["stedgeai"]["epochs"] > 0
        assert any("kept its output open" in p for p in data["stedgeai"].get("problems", [])) or \
            "kept its output open" in done.stderr
        assert not _alive(int(pidfile.read_text())), "the process stedgeai left behind still runs"
    finally:  # also when nafix hung (the guard fired): the test leaves no sleep behind
        pid = int(pidfile.read_text()) if pidfile.exists() else 0
        if pid and _alive(pid):
            os.kill(pid, 9)


@posix_only
def test_compile_without_a_report_is_an_error(tmp_path):
    tool = _wrapper(tmp_path, """
        echo "ST Edge AI Core v2.2.0-20266"
        echo "nothing generated"
        exit 0
        """)
    done = _nafix(["compile", MOVENET, "--stedgeai", tool, "--timeout", "60"])
    assert done.returncode == 1 and len(_error_lines(done.stderr)) == 1, done.stderr
    assert "no report" in _error_lines(done.stderr)[0]


# ------------------------------------------------------------------------------------------------
# 4. nafix MODEL: a time limit on the stages that run onnxruntime
# ------------------------------------------------------------------------------------------------

def _endless_loop_model(trips: int = 10**15) -> onnx.ModelProto:
    """A Loop run ``trips`` times whose output shape only a run tells (the body's output has none)."""
    T = TensorProto
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("cond_in", T.BOOL, []),
         helper.make_tensor_value_info("v_in", T.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), helper.make_tensor_value_info("v_out", T.FLOAT, None)],
        [helper.make_tensor("one", T.FLOAT, [], [1.0])])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "x"], ["v_final"], body=body),
         helper.make_node("Relu", ["v_final"], ["y"])],
        "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 4])], [helper.make_tensor_value_info("y", T.FLOAT, None)],
        [helper.make_tensor("M", T.INT64, [], [trips]), helper.make_tensor("cond", T.BOOL, [], [True])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@posix_only
def test_fix_stops_a_stage_that_onnxruntime_never_finishes(tmp_path):
    model = tmp_path / "loop.onnx"
    onnx.save(_endless_loop_model(), str(model))
    done = _nafix([model, "--timeout", "3"], timeout=120)
    assert done.returncode == 2, done.stderr
    lines = _error_lines(done.stderr)
    assert len(lines) == 1 and "--timeout" in lines[0] and "3 s" in lines[0] and "loop.onnx" in lines[0], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop.onnx"]  # nothing written, nothing left
    # audit bounds the same model the same way
    audit = _nafix(["audit", model, "--timeout", "3", "--no-cache"], timeout=120)
    assert audit.returncode == 2 and "timeout" in audit.stderr


def test_fix_in_its_child_process_gives_the_same_result(tmp_path):
    """The bounded fix (a forked child) writes what the unbounded one writes, with the same exit code."""
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        shutil.copy(MOVENET, d / "m.onnx")
    bounded = _nafix([a / "m.onnx", "-f", "json"])
    unbounded = _nafix([b / "m.onnx", "-f", "json", "--timeout", "0"])
    assert bounded.returncode == unbounded.returncode == 0, bounded.stderr + unbounded.stderr
    ra, rb = json.loads(bounded.stdout), json.loads(unbounded.stdout)
    assert ra["written"] and rb["written"] and ra["changes"] == rb["changes"] and ra["estimate"] == rb["estimate"]
    assert (a / "m.nafix.onnx").read_bytes() == (b / "m.nafix.onnx").read_bytes()


def test_the_deadline_helper_forwards_results_and_errors():
    from fixer import deadline
    from fixer.errors import InputError

    # in pytest (captured stdout, onnxruntime loaded) nothing is forked: the work runs here, unbounded
    assert deadline.run_bounded(lambda: 7, limit=5, what="x", first_stage="s") == 7
    with pytest.raises(InputError, match="boom"):
        deadline.run_bounded(lambda: (_ for _ in ()).throw(InputError("boom")), limit=5, what="x", first_stage="s")
    deadline.stage("outside a bounded run: nothing happens")


# ------------------------------------------------------------------------------------------------
# 5. calibrate: paths a README names stay inside the pairs folder
# ------------------------------------------------------------------------------------------------

REPORT_A = """ST Edge AI Core v2.2.0-20266
model file : {name}
Total number of epochs: 3 of which 1 implemented in software
 epoch 1 HW
 epoch 2 SW (Softmax)
 epoch 3 HW
"""


def _pair(pairs: Path, name: str, readme: str, model_name: str = "m.onnx") -> Path:
    folder = pairs / name
    folder.mkdir(parents=True)
    (folder / "README.md").write_text(readme)
    (folder / "network_generate_report.txt").write_text(REPORT_A.format(name=model_name))
    return folder


def test_calibrate_refuses_paths_out_of_the_pairs_folder(tmp_path):
    from fixer.calibrate import calibrate

    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(MOVENET, outside / "m.onnx")
    root = tmp_path / "ref" / "a"
    pairs = root / "pairs"
    _pair(pairs, "abs", f"Model: `{outside / 'm.onnx'}`\n")
    _pair(pairs, "escape", "Model: `../../../../outside/m.onnx` and ../../../../outside/m.onnx\n")
    loop = _pair(pairs, "loop", "Model: `loop.onnx`\n", "loop.onnx")
    (loop / "loop.onnx").symlink_to("loop.onnx")
    link = _pair(pairs, "link", "")
    (link / "m.onnx").symlink_to(outside / "m.onnx")
    # the documented place: ../../models beside the pairs folder, named from a pair's README
    (root.parent / "models").mkdir()
    shutil.copy(MOVENET, root.parent / "models" / "m.onnx")
    _pair(pairs, "ok", "Model: `../../../models/m.onnx`\n")
    rows = {r.pair: r for r in _guarded(lambda: calibrate(pairs), 120)}
    assert rows["abs"].status == "error" and "absolute" in rows["abs"].note and rows["abs"].model is None
    assert rows["escape"].status == "error" and "outside the pairs folder" in rows["escape"].note
    assert rows["loop"].status == "error" and "cannot be resolved" in rows["loop"].note
    assert rows["link"].status == "error" and "outside the pairs folder" in rows["link"].note
    assert rows["ok"].status in ("ok", "off") and rows["ok"].estimated, rows["ok"].note


# ------------------------------------------------------------------------------------------------
# 6. time limits validated at the command line
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["inf", "nan", "-1", "-inf", "1e400"])
def test_a_time_limit_must_be_a_number_of_seconds(value, capsys, tmp_path):
    """stedgeai's timeouts are finite and above 0; audit's and fix's limits also take 0 or infinity for
    none (test_hostile_json runs those), never NaN or a negative number."""
    model = tmp_path / "m.onnx"
    shutil.copy(MOVENET, model)
    cases = [["compile", model, f"--timeout={value}"], [model, "--compile", f"--compile-timeout={value}"]]
    if value not in ("inf", "1e400"):
        cases += [["audit", model, "--no-cache", f"--timeout={value}"], [model, f"--timeout={value}"]]
    for args in cases:
        code, out, err = run_cli(args, capsys)
        assert code == 2 and len(_error_lines(err)) == 1 and ("finite" in err or "time limit" in err), (args, err)
    code, out, err = run_cli(["compile", model, "--timeout=0"], capsys)
    assert code == 2 and "above 0" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
