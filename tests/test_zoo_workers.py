"""Issue 32: the audit's worker processes. A worker never inherits onnxruntime's state from the
process that starts it (the flaky per-model timeout), dies with its parent (SIGKILL included), and
Ctrl-C ends ``nafix audit -j 2`` with one line, exit 130, nothing left running or lying around."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from fixer.api import AnalysisOptions
from fixer.zoo import worker
from fixer.zoo.runner import ZooOptions, audit_rows
from tests.test_zoo import long_chain

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "sample_models" / "classifier_softmax.onnx"

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: the nafix command, run as a program: its 2 workers are forked from it; the second one has
#: onnxruntime loaded before the audit starts (as in a program that embeds nafix, or the test
#: process): its 2 workers come from a fork server, with multiprocessing's resource tracker beside
CLI = "import sys; from fixer.cli import main; main(sys.argv[1:])"
CLI_ORT = "import sys, onnxruntime; from fixer.cli import main; main(sys.argv[1:])"


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) of a live process, None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every live process below ``root``: pid -> start time (to tell a reused pid apart)."""
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None:
            stats[int(d)] = st
    found: dict[int, int] = {}
    frontier = {root}
    while frontier:
        kids = {pid for pid, (ppid, _, _) in stats.items() if ppid in frontier and pid not in found}
        for k in kids:
            found[k] = stats[k][2]
        frontier = kids
    return found


def still_running(procs: dict[int, int]) -> list[int]:
    return [pid for pid, start in procs.items() if (st := _stat(pid)) is not None and st[2] == start]


def wait_for_workers(parent: subprocess.Popen, n: int, timeout: float = 60.0) -> dict[int, int]:
    """The parent's descendants once ``n`` of them are running, and they have had time to start on a
    model."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert parent.poll() is None, parent.communicate()
        procs = descendants(parent.pid)
        if len(procs) >= n:
            time.sleep(1.0)  # each worker is into its model by now
            return descendants(parent.pid)
        time.sleep(0.05)
    raise AssertionError(f"no {n} worker processes after {timeout} s")


@pytest.fixture(scope="module")
def busy_zoo(tmp_path_factory) -> Path:
    """Three models that each keep a worker busy for far longer than the tests below wait (15 s on
    the development machine)."""
    folder = tmp_path_factory.mktemp("busy")
    onnx.save(long_chain(60000), str(folder / "a.onnx"))
    for name in ("b.onnx", "c.onnx"):
        shutil.copy(folder / "a.onnx", folder / name)
    return folder


def _ort_session_in_garbage():
    """An onnxruntime session (that has run) reachable only from a reference cycle: garbage that the
    next collection frees, wherever it runs."""
    import onnxruntime as ort

    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [64, 64])],
                     [h.make_tensor_value_info("y", T.FLOAT, [64, 64])],
                     [onnx.numpy_helper.from_array(np.ones((64, 64), np.float32), "w")])
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    sess.run(None, {"x": np.ones((64, 64), np.float32)})
    holder: dict = {"session": sess}
    holder["self"] = holder


def test_a_worker_never_inherits_onnxruntime_state(tmp_path, monkeypatch):
    """The flaky 120 s timeout: a worker forked from a process holding an onnxruntime session (here
    garbage in a reference cycle, as earlier tests leave in the test process) froze for ever when
    its garbage collector freed that copy (the session's destructor joins threads that exist only in
    the parent). The worker here collects garbage before each model, as it may at any allocation: a
    worker with a copy of this process's memory would hang; one from the fork server has no such copy."""
    pytest.importorskip("onnxruntime")
    model = tmp_path / "m.onnx"
    shutil.copy(SOFTMAX, model)
    real = worker.audit_and_store

    def collecting(*args):
        gc.collect()
        return real(*args)

    monkeypatch.setattr(worker, "audit_and_store", collecting)
    gc.disable()  # the garbage must still be there when the worker starts
    try:
        _ort_session_in_garbage()
        # own_process: the nafix command's choice, which used to fork here (one Python thread)
        rows, _ = audit_rows([model], AnalysisOptions(), ZooOptions(jobs=1, use_cache=False, timeout=60,
                                                                    own_process=True))
    finally:
        gc.enable()
        gc.collect()
    assert rows[0]["error"] is None, rows[0]["error"]
    assert rows[0]["estimate"]["sw_epochs"] >= 1


@linux_only
def test_the_fork_server_never_loads_onnxruntime(tmp_path):
    """The process the workers are forked from (when this one has onnxruntime loaded) starts clean
    and stays so: no onnxruntime library mapped in it."""
    pytest.importorskip("onnxruntime")
    import multiprocessing.forkserver as fs

    import onnxruntime  # noqa: F401 - loaded here, so no worker may be forked from this process

    shutil.copy(SOFTMAX, tmp_path / "m.onnx")
    rows, _ = audit_rows([tmp_path], AnalysisOptions(), ZooOptions(jobs=1, use_cache=False, timeout=60,
                                                                  own_process=True))
    assert rows[0]["error"] is None
    server = fs._forkserver._forkserver_pid
    assert server is not None and server != os.getpid()
    maps = Path(f"/proc/{server}/maps").read_text()
    assert "libonnxruntime" not in maps and "onnxruntime_pybind11_state" not in maps


@linux_only
@pytest.mark.parametrize("script,processes", [(CLI, 2), (CLI_ORT, 4)], ids=["forked-workers", "fork-server"])
def test_sigkill_of_the_parent_takes_every_worker_with_it(busy_zoo, tmp_path, script, processes):
    """SIGKILL (the OOM killer, ``timeout -s KILL``, a CI hard cancel) leaves no worker, fork server
    or resource tracker behind."""
    p = subprocess.Popen([sys.executable, "-c", script, "audit", str(busy_zoo), "-j", "2", "--no-cache",
                          "--timeout", "600", "-f", "json"], cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        procs = wait_for_workers(p, processes)
        p.kill()
        p.wait(timeout=30)
        end = time.monotonic() + 5  # they go at once; a worker left alive would be busy for far longer
        while still_running(procs) and time.monotonic() < end:
            time.sleep(0.05)
        assert still_running(procs) == [], procs
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        with_pgid_cleanup(p.pid)


def with_pgid_cleanup(pgid: int) -> None:
    """Whatever a failed test left in the session started for it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _sigint_default() -> None:
    """The nafix under test starts as from a terminal, where Ctrl-C is not ignored: a job that a shell
    without job control started in the background (a CI runner's script, ``cmd &``) has SIGINT ignored,
    and Python then leaves it ignored (nafix then rightly finishes its work)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@linux_only
@pytest.mark.parametrize("script,processes", [(CLI, 2), (CLI_ORT, 4)], ids=["forked-workers", "fork-server"])
def test_ctrl_c_ends_the_audit_with_one_line_and_nothing_left(busy_zoo, tmp_path, script, processes):
    """Ctrl-C sends SIGINT to the whole process group: the workers ignore it, the parent cancels the
    pool and exits 130 with one line; no traceback, no process, no temporary file left."""
    cache = tmp_path / "cache"
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([sys.executable, "-c", script, "audit", str(busy_zoo), "-j", "2", "--cache-dir", str(cache),
                          "--timeout", "600", "-o", str(out / "report.json")], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=_sigint_default)
    try:
        procs = wait_for_workers(p, processes)
        os.killpg(p.pid, signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 130, stderr
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
        assert [ln for ln in stderr.splitlines() if ln.strip()] == ["interrupted"], stderr
        end = time.monotonic() + 5
        while still_running(procs) and time.monotonic() < end:
            time.sleep(0.05)
        assert still_running(procs) == [], procs
        assert list(out.iterdir()) == []  # no report, no temporary file
        # no temporary file (entries are .json, the options-fingerprint memo .fp)
        assert [f for f in cache.rglob("*") if f.is_file() and f.suffix not in (".json", ".fp")] == []
        assert sorted(f.name for f in busy_zoo.iterdir()) == ["a.onnx", "b.onnx", "c.onnx"]
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        with_pgid_cleanup(p.pid)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_worker_ends_on_sigterm_only_after_its_cache_write():
    """The parent ends workers with SIGTERM (Ctrl-C, a timeout): one that is writing a cache entry
    finishes it first, so no temporary file is left, and then ends by that SIGTERM."""
    script = ("import os, signal\n"
              "from fixer.zoo import worker\n"
              "worker._in_worker = True\n"
              "with worker._sigterm_deferred():\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    print('write finished', flush=True)\n"
              "print('went on', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout == "write finished\n", (done.stdout, done.stderr)
    assert done.returncode == -signal.SIGTERM, done.stderr
