"""``nafix audit`` at zoo scale: worker processes, timeouts, the result cache, shards and merge,
baselines, the zoo summary and the CI report formats (SARIF, GitHub annotations, HTML)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli as run
from fixer.zoo import cache as zcache
from fixer.zoo.runner import Shard, ZooOptions, audit_rows, build_report
from fixer.api import AnalysisOptions
from tests.helpers import QDQ, save

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
SOFTMAX = SAMPLES / "classifier_softmax.onnx"



def softmax_chain(n: int):
    """int8 Conv followed by ``n`` Softmax nodes (each estimated SW): n = 0 has no SW node."""
    b = QDQ()
    y = b.op("Conv", [b.input("x", [1, 2, 4, 4]), b.weight("w", [4, 2, 1, 1])], name="conv")
    for i in range(n):
        y = b.op("Softmax", [y], name=f"softmax{i}", axis=1)
    b.output(y)
    return b.model()


@pytest.fixture
def zoo(tmp_path) -> Path:
    """Five models in two folders plus one corrupt file."""
    folder = tmp_path / "zoo"
    (folder / "sub").mkdir(parents=True)
    for p in sorted(SAMPLES.glob("*.onnx"))[:3]:
        shutil.copy(p, folder / p.name)
    save(softmax_chain(0), folder / "sub" / "clean.onnx")
    save(softmax_chain(2), folder / "sub" / "two_softmax.onnx")
    (folder / "sub" / "broken.onnx").write_bytes(b"not a protobuf")
    return folder


def strip_volatile(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("shard",)}


# ---------------------------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------------------------


def test_jobs_1_and_2_give_the_same_report_sorted_by_path(zoo, capsys):
    code1, out1, err1 = run(["audit", zoo, "-f", "json", "--jobs", "1", "--no-cache"], capsys)
    code2, out2, err2 = run(["audit", zoo, "-f", "json", "--jobs", "2", "--no-cache"], capsys)
    assert code1 == code2 == 2  # the broken model
    assert out1 == out2
    rows = json.loads(out1)["models"]
    assert [r["path"] for r in rows] == sorted(r["path"] for r in rows) and len(rows) == 6
    broken = next(r for r in rows if r["path"].endswith("broken.onnx"))
    assert "broken.onnx" in broken["error"] and broken["estimate"] is None
    two = next(r for r in rows if r["path"].endswith("two_softmax.onnx"))
    assert [n["name"] for n in two["sw_nodes"]] == ["softmax0", "softmax1"]
    assert all(r["sha256"] and len(r["sha256"]) == 64 for r in rows)
    assert err1.count("error:") == 1 and "broken.onnx" in err1


def long_chain(n: int):
    """A float chain of ``n`` Relu nodes: the analysis takes about n/4 ms (15 s for 60,000 nodes
    on the development machine), standing in for a model that hangs."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"r{i}") for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_model_past_the_timeout_becomes_an_error_row(tmp_path, capsys):
    import onnx

    slow = tmp_path / "slow.onnx"
    onnx.save(long_chain(60000), str(slow))
    code, out, err = run(["audit", slow, SOFTMAX, "-f", "json", "--timeout", "2", "--jobs", "2"], capsys)
    assert code == 2
    rows = {Path(r["path"]).name: r for r in json.loads(out)["models"]}
    assert "longer than the per-model timeout of 2 s" in rows["slow.onnx"]["error"]
    assert rows["classifier_softmax.onnx"]["error"] is None and rows["classifier_softmax.onnx"]["estimate"]["sw_epochs"] >= 1
    (line,) = err.splitlines()
    assert line.startswith("error:") and "slow.onnx" in line


def test_a_worker_that_dies_costs_one_error_row(tmp_path):
    """A worker killed mid-model (as the kernel's OOM killer would) becomes that model's error row;
    a fresh worker audits the rest."""
    import multiprocessing
    import threading

    import onnx

    slow = tmp_path / "a_slow.onnx"
    onnx.save(long_chain(60000), str(slow))
    shutil.copy(SOFTMAX, tmp_path / "b_softmax.onnx")

    def kill_workers():
        for p in multiprocessing.active_children():
            p.kill()

    timer = threading.Timer(1.5, kill_workers)  # the single worker is on the slow model by then
    timer.start()
    try:
        rows, _ = audit_rows([tmp_path], AnalysisOptions(), ZooOptions(jobs=1, use_cache=False, timeout=60))
    finally:
        timer.cancel()
    by = {Path(r["path"]).name: r for r in rows}
    assert "worker process analysing this model died" in by["a_slow.onnx"]["error"]
    assert by["b_softmax.onnx"]["error"] is None and by["b_softmax.onnx"]["estimate"]["sw_epochs"] >= 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_fifo_is_an_error_row_not_a_hang(tmp_path, capsys):
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)  # reading it would block forever
    code, out, err = run(["audit", fifo, SOFTMAX, "-f", "json", "--timeout", "30"], capsys)
    assert code == 2
    rows = {Path(r["path"]).name: r for r in json.loads(out)["models"]}
    assert rows["pipe.onnx"]["error"] and rows["pipe.onnx"]["sha256"] is None
    assert rows["classifier_softmax.onnx"]["error"] is None


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------


def test_cache_serves_the_second_run_and_ignores_corrupt_or_foreign_entries(zoo, tmp_path):
    opts = ZooOptions(jobs=2, cache_dir=tmp_path / "cache")
    rows1, st1 = audit_rows([zoo], AnalysisOptions(), opts)
    assert st1 == {"models": 6, "cached": 0, "analysed": 6}
    rows2, st2 = audit_rows([zoo], AnalysisOptions(), opts)
    assert st2 == {"models": 6, "cached": 5, "analysed": 1}  # error rows are never cached
    assert rows1 == rows2
    entries = sorted((tmp_path / "cache").rglob("*.json"))
    assert len(entries) == 5
    entries[0].write_text("{not json")
    other = json.loads(entries[2].read_text())
    entries[1].write_text(json.dumps(other))  # a valid entry filed under another key: foreign
    e3 = json.loads(entries[3].read_text())
    e3["schema"] = "something-else/9"
    entries[3].write_text(json.dumps(e3))
    e4 = json.loads(entries[4].read_text())
    e4["row"]["estimate"] = "tampered"
    entries[4].write_text(json.dumps(e4))
    rows3, st3 = audit_rows([zoo], AnalysisOptions(), opts)
    assert st3["cached"] == 1 and st3["analysed"] == 5
    assert rows3 == rows1


def test_cache_key_follows_content_options_and_external_data(tmp_path):
    m = tmp_path / "m.onnx"
    shutil.copy(SOFTMAX, m)
    cache_dir = tmp_path / "cache"
    zo = ZooOptions(jobs=1, cache_dir=cache_dir)
    (r1,), _ = audit_rows([m], AnalysisOptions(), zo)
    (r2,), st = audit_rows([m], AnalysisOptions(stedgeai_options=frozenset({"--expand-softmax"})), zo)
    assert st["cached"] == 0 and r2["estimate"]["sw_epochs"] < r1["estimate"]["sw_epochs"]
    save(softmax_chain(1), m)
    (r3,), st = audit_rows([m], AnalysisOptions(), zo)
    assert st["cached"] == 0 and [n["name"] for n in r3["sw_nodes"]] == ["softmax0"]
    # external data: the key covers the data file too
    import onnx

    ext = tmp_path / "ext" / "e.onnx"
    ext.parent.mkdir()
    onnx.save_model(softmax_chain(1), str(ext), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="e.data", size_threshold=0)
    sha1 = zcache.content_sha256(ext)
    data = ext.parent / "e.data"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 1
    data.write_bytes(bytes(raw))
    assert zcache.content_sha256(ext) != sha1 is not None


def test_default_cache_dir_is_the_platform_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("NAFIX_CACHE_DIR", str(tmp_path / "explicit"))
    assert zcache.default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("NAFIX_CACHE_DIR")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert zcache.default_cache_dir() == tmp_path / "xdg" / "nafix"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert zcache.default_cache_dir() == Path.home() / ".cache" / "nafix"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert zcache.default_cache_dir() == Path.home() / "Library" / "Caches" / "nafix"
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert zcache.default_cache_dir() == tmp_path / "local" / "nafix" / "Cache"


def test_cli_cache_dir_option_and_no_cache(zoo, tmp_path, capsys):
    cache_dir = tmp_path / "mycache"
    code, _, _ = run(["audit", zoo / "sub" / "clean.onnx", "--no-cache", "--cache-dir", cache_dir, "-f", "json"], capsys)
    assert code == 0 and not cache_dir.exists()
    code, _, _ = run(["audit", zoo / "sub" / "clean.onnx", "--cache-dir", cache_dir, "-f", "json"], capsys)
    assert code == 0 and len(list(cache_dir.rglob("*.json"))) == 1


# ---------------------------------------------------------------------------------------------
# Shards and merge
# ---------------------------------------------------------------------------------------------


def test_shards_merged_equal_the_unsharded_report(zoo, tmp_path, capsys):
    code, full, _ = run(["audit", zoo, "-f", "json", "--jobs", "2"], capsys)
    assert code == 2
    parts, seen = [], []
    for k in (1, 2, 3):
        dest = tmp_path / f"shard{k}.json"
        run(["audit", zoo, "-f", "json", "--shard", f"{k}/3", "-o", dest], capsys)
        rep = json.loads(dest.read_text())
        assert rep["shard"] == {"index": k, "count": 3}
        seen += [r["path"] for r in rep["models"]]
        parts.append(dest)
    assert sorted(seen) == sorted(r["path"] for r in json.loads(full)["models"])  # a partition
    merged = tmp_path / "all.json"
    code, out, err = run(["audit", "merge", *parts, "-o", merged], capsys)
    assert code == 2  # the merged zoo holds the broken model
    assert json.loads(merged.read_text()) == strip_volatile(json.loads(full))
    # a missing shard is a warning, overlapping reports an error
    code, out, err = run(["audit", "merge", parts[0], parts[1]], capsys)
    assert "warning: shard(s) 3/3 missing" in err
    nonempty = next(p for p in parts if json.loads(p.read_text())["models"])  # which shard depends on tmp_path
    code, out, err = run(["audit", "merge", nonempty, nonempty], capsys)
    assert code == 2 and err.startswith("error:") and "overlap" in err and len(err.splitlines()) == 1
    code, out, err = run(["audit", "merge", parts[0], "--format", "markdown"], capsys)
    assert out.startswith("# nafix audit")


def test_a_shard_holding_only_a_broken_model_still_writes_its_report(tmp_path, capsys):
    (tmp_path / "broken.onnx").write_bytes(b"not a protobuf")
    dest = tmp_path / "shard.json"
    code, out, err = run(["audit", tmp_path / "broken.onnx", "-f", "json", "--shard", "1/1", "-o", dest], capsys)
    assert code == 2 and "broken.onnx" in err
    (row,) = json.loads(dest.read_text())["models"]
    assert "broken.onnx" in row["error"]


def test_shard_split_is_deterministic_and_covers_every_path():
    paths = [f"models/m{i}.onnx" for i in range(200)]
    takes = [[p for p in paths if Shard(k, 4).takes(p)] for k in range(1, 5)]
    assert sorted(sum(takes, [])) == sorted(paths) and all(len(t) > 20 for t in takes)
    assert takes[0] == [p for p in paths if Shard(1, 4).takes(p)]


@pytest.mark.parametrize("bad", ["0/3", "4/3", "x", "1/0", "1-3"])
def test_bad_shard_is_a_usage_error(bad, capsys):
    code, out, err = run(["audit", SOFTMAX, "--shard", bad], capsys)
    assert code == 2 and err.startswith("error: --shard") and len(err.splitlines()) == 1


def test_merge_rejects_a_file_that_is_not_a_report(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text('{"a": 1}')
    code, out, err = run(["audit", "merge", p], capsys)
    assert code == 2 and "not a nafix audit JSON report" in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# Zoo summary
# ---------------------------------------------------------------------------------------------


def test_zoo_summary_counts_op_types_ratios_and_rules(zoo, capsys):
    code, out, _ = run(["audit", zoo, "-f", "json"], capsys)
    rep = json.loads(out)
    s = rep["summary"]
    ok = [r for r in rep["models"] if not r["error"]]
    assert (s["models"], s["audited"], s["failed"]) == (6, 5, 1)
    assert s["with_sw"] == sum(1 for r in ok if r["estimate"]["sw_epochs"] > 0)
    assert sum(d["models"] for d in s["hw_ratio"]["distribution"]) == 5
    assert s["hw_ratio"]["max"] == 1.0  # clean.onnx
    softmax = next(o for o in s["sw_op_types"] if o["op_type"] == "Softmax")
    expected = sum(r["estimate"]["sw_ops"].get("Softmax", 0) for r in ok)
    assert softmax["sw_epochs"] == expected >= 2 and softmax["models"] >= 2
    total = sum(o["sw_epochs"] for o in s["sw_op_types"] if not o["op_type"].endswith("(hybrid)"))
    assert total == sum(r["estimate"]["sw_epochs"] for r in ok)
    naf012 = next(r for r in s["rules"] if r["rule"] == "NAF012")  # drop-trailing-softmax (opt-in)
    assert naf012["opt_in"] and naf012["command"] == "nafix MODEL --extend-select NAF012"  # keeps the default rules
    code, out, _ = run(["audit", zoo], capsys)
    assert "zoo summary (estimated):" in out and "5 of 6 models audited, 1 failed" in out
    assert "NAF012" in out


def test_a_second_nafix_process_reuses_the_cache(tmp_path):
    """Keys are the same in every process (set order follows PYTHONHASHSEED; none may leak in)."""
    import subprocess

    nafix = Path(sys.executable).with_name("nafix")
    cache_dir = tmp_path / "cache"
    model = tmp_path / "m.onnx"
    shutil.copy(SOFTMAX, model)

    def audit(seed: str) -> dict:
        proc = subprocess.run([str(nafix), "audit", str(model), "-f", "json", "--cache-dir", str(cache_dir)],
                              capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED=seed), timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["models"][0]

    first = audit("1")
    (entry_file,) = cache_dir.rglob("*.json")
    entry = json.loads(entry_file.read_text())
    entry["row"]["estimate"]["epochs"] = 999  # marks the entry: only a cache hit can report it
    entry_file.write_text(json.dumps(entry))
    assert first["estimate"]["epochs"] != 999 and audit("2")["estimate"]["epochs"] == 999


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r.update(estimate={"epochs": "9"}), "models[0].estimate.epochs must be a non-negative integer, not a string"),
    (lambda r: r.update(memory=None), "models[0].memory must be an object, not null"),
    (lambda r: r["sw_nodes"].append({"name": 3}), ".name must be a string, not an integer"),
    (lambda r: r.update(findings=[{"constraint": 1}]), "models[0].findings[0].constraint must be a string"),
    (lambda r: r.update(path=None), "models[0].path must be a non-empty string, not null"),
])
def test_merge_rejects_malformed_rows_with_one_error_line(tmp_path, capsys, mutate, needle):
    code, out, _ = run(["audit", SOFTMAX, "-f", "json"], capsys)
    rep = json.loads(out)
    mutate(rep["models"][0])
    p = tmp_path / "r.json"
    p.write_text(json.dumps(rep))
    code, out, err = run(["audit", "merge", p], capsys)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"error: {p}: models[0]") and needle in line
