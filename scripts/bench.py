#!/usr/bin/env python3
"""Speed and memory figures for nafix (printed, not asserted: machines here are noisy).

    python scripts/bench.py [FOLDER] [--repeat 5]

Times `audit` over every model in FOLDER (default ../shared/models, else sample_models) and
`fix --dry-run` on each sample model; prints the median and min of each over the repeats and the
peak resident memory of this process. ``--speed all`` prints the speed-at-scale figures instead
(scripts/bench_speed.py: audit vs its floor, fix of growing QDQ chains, --quantize at scale, nafix
vs onnxslim).
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", nargs="?")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--speed", metavar="SECTIONS",
                    help="only the speed-at-scale figures (scripts/bench_speed.py): all, or a comma list of "
                         "audit,chains,quantize,onnxslim")
    args = ap.parse_args()
    shared = ROOT.parent / "shared" / "models"
    folder = Path(args.folder) if args.folder else (shared if shared.is_dir() else ROOT / "sample_models")
    if args.speed:
        import bench_speed

        bench_speed.run(args.speed, folder, max(1, min(args.repeat, 3)))
        return
    models = sorted(folder.glob("*.onnx"))
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
