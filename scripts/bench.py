#!/usr/bin/env python3
"""Speed and memory figures for nafix (printed, not asserted: machines here are noisy).

    python scripts/bench.py [FOLDER] [--repeat 5]

Times `nafix audit` of FOLDER with 1 and 2 worker processes and with a cold and a warm result
cache (`--zoo-only` stops there), `audit` over every model in FOLDER (default ../shared/models, else sample_models) and
`fix --dry-run` on each sample model; prints the median and min of each over the repeats and the
peak resident memory of this process. ``--speed all`` prints the speed-at-scale figures instead
(scripts/bench_speed.py: audit vs its floor, fix of growing QDQ chains, --quantize at scale, nafix
vs onnxslim). ``--speed hook`` prints a warm-cache pre-commit hook run on one model against
`nafix --version`, both medians and their ratio measured in one run.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fixer.api import AuditOptions, FixOptions, audit, fix  # noqa: E402


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _burn(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


def parallel_control(repeat: int) -> float:
    """What 2 processes gain over 1 on this machine right now for pure CPU work (ideal 2.0x): the
    ceiling of any --jobs 2 figure measured in the same run on a shared machine."""
    import multiprocessing as mp

    n = 5_000_000
    one: list[float] = []
    two: list[float] = []
    with mp.get_context("spawn").Pool(2) as pool:
        pool.map(_burn, [1, 1])
        for _ in range(repeat):
            one += timed(lambda: (_burn(n), _burn(n)), 1)
            two += timed(lambda: pool.map(_burn, [n, n]), 1)
    return statistics.median(one) / statistics.median(two)


def bench_zoo(folder: Path, repeat: int) -> None:
    """`nafix audit` of a whole folder: --jobs 1 vs --jobs 2 without cache, and a cold vs a warm
    result cache (jobs 2); in-process (fixer.zoo.audit_rows, what the command runs) and end to end
    (the `nafix` console script, interpreter start included). Runs are interleaved so that load
    from other processes on the machine hits both sides alike."""
    import os
    import subprocess
    import tempfile

    from fixer.api import AnalysisOptions
    from fixer.zoo import ZooOptions, audit_rows

    a = AnalysisOptions()
    n = len(audit_rows([folder], a, ZooOptions(jobs=2, use_cache=False, own_process=True))[0])
    def cpu() -> float:  # CPU seconds of this process and its (finished) worker processes
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    j1: list[float] = []
    j2: list[float] = []
    cpu1: list[float] = []
    cpu2: list[float] = []
    for _ in range(repeat):
        c = cpu()
        j1 += timed(lambda: audit_rows([folder], a, ZooOptions(jobs=1, use_cache=False, own_process=True)), 1)
        cpu1.append(cpu() - c)
        c = cpu()
        j2 += timed(lambda: audit_rows([folder], a, ZooOptions(jobs=2, use_cache=False, own_process=True)), 1)
        cpu2.append(cpu() - c)
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            z = ZooOptions(jobs=2, cache_dir=Path(d), own_process=True)
            cold += timed(lambda: audit_rows([folder], a, z), 1)
            warm += timed(lambda: audit_rows([folder], a, z), 1)
    med = statistics.median
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"zoo audit {folder} ({n} models, {os.cpu_count()} CPUs, load average "
          f"{'/'.join(f'{x:.1f}' for x in load) if load else '?'}), medians of {repeat} interleaved runs:")
    print(f"  --jobs 1 --no-cache: {med(j1):.2f} s; --jobs 2 --no-cache: {med(j2):.2f} s; "
          f"speed-up {med(j1) / med(j2):.2f}x")
    print(f"  CPU time (this process + workers): --jobs 1 {med(cpu1):.2f} s, --jobs 2 {med(cpu2):.2f} s "
          f"(parallel overhead {med(cpu2) / med(cpu1) - 1:+.0%})")
    print(f"  control: 2 processes of pure CPU work vs 1 on this machine now: {parallel_control(repeat):.2f}x "
          "(2.0x on an idle 2-CPU machine)")
    print(f"  cache (jobs 2): cold {med(cold):.2f} s, warm {med(warm):.3f} s; speed-up {med(cold) / med(warm):.1f}x")
    exe = Path(sys.executable).with_name("nafix")
    if exe.exists():
        def cli(*extra):
            return lambda: subprocess.run([str(exe), "audit", str(folder), "-f", "json", *extra],
                                          stdout=subprocess.DEVNULL, check=False)

        c1: list[float] = []
        c2: list[float] = []
        ccold: list[float] = []
        cwarm: list[float] = []
        for _ in range(repeat):
            c1 += timed(cli("--jobs", "1", "--no-cache"), 1)
            c2 += timed(cli("--jobs", "2", "--no-cache"), 1)
            with tempfile.TemporaryDirectory() as d:
                ccold += timed(cli("--cache-dir", d), 1)
                cwarm += timed(cli("--cache-dir", d), 1)
        print(f"  end to end (nafix audit, process start included): --jobs 1 {med(c1):.2f} s, --jobs 2 {med(c2):.2f} s "
              f"({med(c1) / med(c2):.2f}x); cache cold {med(ccold):.2f} s, warm {med(cwarm):.2f} s "
              f"({med(ccold) / med(cwarm):.1f}x)")


def bench_hook(repeat: int) -> None:
    """What a pre-commit hook run costs: `nafix audit MODEL --fail-on sw` on one small model from a
    warm result cache, in a project with a [tool.nafix] table, against `nafix --version` (the floor:
    the interpreter and the command line). Both are console-script runs in fresh processes,
    interleaved so that load from other processes hits both alike; medians of ``repeat`` each."""
    import os
    import shutil
    import subprocess
    import tempfile

    nafix = Path(sys.executable).with_name("nafix")
    cmd = [str(nafix)] if nafix.exists() else [sys.executable, "-m", "fixer.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        shutil.copy(ROOT / "sample_models" / "classifier_softmax.onnx", repo / "model.onnx")
        (repo / "pyproject.toml").write_text(  # a team's settings, as in tests/test_scratch_repo.py
            '[tool.nafix]\ncore = "2.2"\nstedgeai-option = ["--input-data-type float32"]\nfail-on = "sw"\n'
            'ignore-finding = ["Softmax"]\n\n[tool.nafix.per-path."models/*.onnx"]\ninput-shape = ["image=1,3,64,64"]\n',
            encoding="utf-8")
        # compiled bytecode cached as in an installed nafix (PYTHONDONTWRITEBYTECODE would make every
        # run compile nafix's own modules from source, which an install never does); in a temporary
        # folder, not the checkout
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(NAFIX_CACHE_DIR=str(repo / "cache"), PYTHONPYCACHEPREFIX=str(repo / "pycache"))
        hook = cmd + ["audit", "model.onnx", "--fail-on", "sw"]

        def run(argv: list[str]) -> float:
            t0 = time.perf_counter()
            subprocess.run(argv, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return time.perf_counter() - t0

        run(hook)  # cold: fills the result cache (and the bytecode cache)
        run(cmd + ["--version"])
        version: list[float] = []
        warm: list[float] = []
        for _ in range(repeat):
            version.append(run(cmd + ["--version"]))
            warm.append(run(hook))
    v, w = statistics.median(version), statistics.median(warm)
    print(f"hook (one model, warm cache, {repeat} runs each): nafix --version median {v:.3f} s, "
          f"nafix audit MODEL --fail-on sw median {w:.3f} s; ratio {w / v:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", nargs="?")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--zoo-only", action="store_true", help="only the zoo audit figures (jobs, cache)")
    ap.add_argument("--speed", metavar="SECTIONS",
                    help="only the speed-at-scale figures (scripts/bench_speed.py): all, or a comma list of "
                         "audit,chains,quantize,onnxslim; or hook: a warm-cache pre-commit run vs nafix --version")
    args = ap.parse_args()
    shared = ROOT.parent / "shared" / "models"
    folder = Path(args.folder) if args.folder else (shared if shared.is_dir() else ROOT / "sample_models")
    if args.speed == "hook":
        bench_hook(max(args.repeat, 11))
        return
    if args.speed:
        import bench_speed

        bench_speed.run(args.speed, folder, max(1, min(args.repeat, 3)))
        return
    models = sorted(folder.glob("*.onnx"))
    bench_zoo(folder, args.repeat)
    if args.zoo_only:
        return
    times = timed(lambda: audit([folder], AuditOptions()), args.repeat)
    print(f"audit {folder} ({len(models)} models): median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f} s over {args.repeat} runs")
    for sample in sorted((ROOT / "sample_models").glob("*.onnx")):
        if sample.name.endswith("_float.onnx"):
            continue
        t = timed(lambda: fix(sample, FixOptions(dry_run=True)), max(1, args.repeat // 2))
        print(f"fix --dry-run {sample.name}: median {statistics.median(t):.2f} s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {rss:.0f} MiB")


if __name__ == "__main__":
    main()
