"""Compare the one-process audit time of two nafix checkouts on one folder, A/B.

    python scripts/ab_audit.py BASE_CHECKOUT NEW_CHECKOUT [FOLDER] [--rounds 8]

Each round runs both checkouts in fresh processes, one after the other (the order alternates); each
process audits FOLDER once to warm up, then 5 times, interleaved with the ``onnx.load`` +
``infer_shapes`` floor, and reports the fastest of each (on a noisy machine the fastest of repeated
CPU-bound runs moves least). Prints per checkout the median over rounds, and the time ratio new/base.
A checkout is a source tree with ``fixer/`` at its top (e.g. ``git worktree add /tmp/base REV``); the
interpreter running this script must have nafix's dependencies.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import onnx
import fixer
from fixer.api import AuditOptions, audit
assert Path(fixer.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve()), fixer.__file__
folder = Path(sys.argv[2])
models = sorted(folder.glob("*.onnx"))
audit([folder], AuditOptions())
a, f = [], []
for _ in range(5):
    t = time.perf_counter(); audit([folder], AuditOptions()); a.append(time.perf_counter() - t)
    t = time.perf_counter()
    for p in models:
        onnx.shape_inference.infer_shapes(onnx.load(str(p)))
    f.append(time.perf_counter() - t)
print(min(a), min(f))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("folder", type=Path, nargs="?", default=Path(__file__).resolve().parents[2] / "shared" / "models")
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    for p in (args.base, args.new):
        if not (p / "fixer" / "__init__.py").is_file():
            sys.exit(f"{p}: not a nafix checkout (no fixer/__init__.py)")
    if not any(args.folder.glob("*.onnx")):
        sys.exit(f"{args.folder}: no .onnx model")
    runs: dict[str, list[tuple[float, float]]] = {"base": [], "new": []}
    sides = [("base", args.base), ("new", args.new)]
    for r in range(args.rounds):
        for name, path in (sides if r % 2 == 0 else sides[::-1]):
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(args.folder)],
                                 capture_output=True, text=True, cwd="/")
            if out.returncode:
                sys.exit(f"{name} ({path}) failed:\n{out.stderr[-2000:]}")
            runs[name].append(tuple(map(float, out.stdout.split())))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    for name, v in runs.items():
        audit_s = statistics.median(x[0] for x in v)
        floor_s = statistics.median(x[1] for x in v)
        ratio = statistics.median(x[0] / x[1] for x in v)
        print(f"{name}: audit {audit_s:.3f} s, floor {floor_s:.3f} s, ratio {ratio:.2f}x")
    b = statistics.median(x[0] for x in runs["base"])
    n = statistics.median(x[0] for x in runs["new"])
    print(f"new/base audit time: {n / b:.3f} (medians over {args.rounds} rounds of the fastest of 5)")


if __name__ == "__main__":
    main()
