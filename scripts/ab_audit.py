"""Compare the one-process audit time of two nafix checkouts on one folder, A/B.

    python scripts/ab_audit.py BASE_CHECKOUT NEW_CHECKOUT [FOLDER] [--rounds 8]
    python scripts/ab_audit.py BASE_CHECKOUT NEW_CHECKOUT --fix MODEL [--rounds 4] [--repeat 3]
    python scripts/ab_audit.py BASE_CHECKOUT NEW_CHECKOUT --quantize FLOAT_MODEL [--rounds 6]

Each round runs both checkouts in fresh processes, one after the other (the order alternates); each
process audits FOLDER once to warm up, then 5 times, interleaved with the ``onnx.load`` +
``infer_shapes`` floor, and reports the fastest of each (on a noisy machine the fastest of repeated
CPU-bound runs moves least). Prints per checkout the median over rounds, and the time ratio new/base.
A checkout is a source tree with ``fixer/`` at its top (e.g. ``git worktree add /tmp/base REV``); the
interpreter running this script must have nafix's dependencies.

``--fix MODEL``: the same A/B of ``fix(MODEL, FixOptions(dry_run=True))`` (load, analysis, engine,
gate), the fastest of ``--repeat`` fixes per process after one to warm up (e.g. the large QDQ chain of
``scripts/bench_speed.py``, saved with ``onnx.save(qdq_chain(5710), path)``).

``--quantize FLOAT_MODEL``: the whole ``nafix FLOAT_MODEL --quantize`` (16 random calibration samples,
seed 0, written to a temporary file), one per process, beside onnxruntime's plain ``quantize_static``
in a third process of each round: the children of ``scripts/bench_speed.py``, timed from the
process's start as it times them (imports included); prints each side's median and the ratios.

Both checkouts' modules are compiled to bytecode first (``compileall``), as an installed package's
are: where ``PYTHONDONTWRITEBYTECODE`` is set, every process would otherwise compile them again.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
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

FIX_CHILD = r'''
import gc, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import fixer
from fixer.api import FixOptions, fix
assert Path(fixer.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve()), fixer.__file__
fix(sys.argv[2], FixOptions(dry_run=True))
t = []
for _ in range(int(sys.argv[3])):
    gc.collect()
    t0 = time.perf_counter(); fix(sys.argv[2], FixOptions(dry_run=True)); t.append(time.perf_counter() - t0)
print(min(t), 0.0)
'''

#: a child of ``scripts/bench_speed.py`` (the whole ``nafix MODEL --quantize``, or plain
#: ``quantize_static``), run from the process's start as that script times it. argv: checkout, the
#: child's code, then the child's own arguments (model, output, samples)
TIMED_CHILD = r'''
import time
t0 = time.perf_counter()
import sys
from pathlib import Path
checkout, code = sys.argv[1], sys.argv[2]
sys.argv = [sys.argv[0], *sys.argv[3:]]
sys.path.insert(0, checkout)
exec(code, {"__name__": "__child__", "sys": sys})
dt = time.perf_counter() - t0
if "fixer" in sys.modules:
    assert Path(sys.modules["fixer"].__file__).resolve().is_relative_to(Path(checkout).resolve())
print(dt, 0.0)
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("folder", type=Path, nargs="?", default=Path(__file__).resolve().parents[2] / "shared" / "models")
    ap.add_argument("--rounds", type=int, default=None, help="default 8 (4 with --fix, 6 with --quantize)")
    ap.add_argument("--fix", type=Path, metavar="MODEL", help="time a dry-run fix of MODEL instead of the audit")
    ap.add_argument("--repeat", type=int, default=3, help="fixes per process with --fix (the fastest counts)")
    ap.add_argument("--quantize", type=Path, metavar="FLOAT_MODEL",
                    help="time the whole `nafix FLOAT_MODEL --quantize` instead, beside plain quantize_static")
    args = ap.parse_args()
    if args.fix is not None and args.quantize is not None:
        sys.exit("--fix and --quantize: one at a time")
    rounds = args.rounds or (4 if args.fix else 6 if args.quantize else 8)
    for p in (args.base, args.new):
        if not (p / "fixer" / "__init__.py").is_file():
            sys.exit(f"{p}: not a nafix checkout (no fixer/__init__.py)")
    for m in (args.fix, args.quantize):
        if m is not None and not m.is_file():
            sys.exit(f"{m}: no such model")
    if args.fix is None and args.quantize is None and not any(args.folder.glob("*.onnx")):
        sys.exit(f"{args.folder}: no .onnx model")
    for p in (args.base, args.new):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(p / "fixer")], check=True)
    if args.fix is not None:
        code, tail = FIX_CHILD, [str(args.fix.resolve()), str(args.repeat)]
    elif args.quantize is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_speed import _PLAIN_CHILD, _QUANTIZE_CHILD

        tmp = tempfile.TemporaryDirectory(prefix="nafix-ab-")
        code, tail = TIMED_CHILD, [str(args.quantize.resolve()), str(Path(tmp.name) / "q.onnx"), "16"]
    else:
        code, tail = CHILD, [str(args.folder)]
    runs: dict[str, list[tuple[float, float]]] = {"base": [], "new": []}
    sides = [("base", args.base), ("new", args.new)]
    if args.quantize is not None:
        runs["plain"] = []
        sides.append(("plain", args.base))
    for r in range(rounds):
        for name, path in (sides if r % 2 == 0 else sides[::-1]):
            # with --quantize, the timing wrapper's second argument is the child's code
            inner = [] if args.quantize is None else [_PLAIN_CHILD if name == "plain" else _QUANTIZE_CHILD]
            out = subprocess.run([sys.executable, "-c", code, str(path), *inner, *tail],
                                 capture_output=True, text=True, cwd="/")
            if out.returncode:
                sys.exit(f"{name} ({path}) failed:\n{out.stderr[-2000:]}")
            runs[name].append(tuple(map(float, out.stdout.split())))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    if args.quantize is not None:
        med = {name: statistics.median(x[0] for x in v) for name, v in runs.items()}
        for name, v in runs.items():
            print(f"{name}: {med[name]:.3f} s (min {min(x[0] for x in v):.3f})")
        for name in ("base", "new"):
            ratio = statistics.median(a[0] / b[0] for a, b in zip(runs[name], runs["plain"]))
            print(f"{name}/plain quantize_static: {med[name] / med['plain']:.3f} (median of per-round ratios {ratio:.3f})")
        print(f"new/base whole --quantize time: {med['new'] / med['base']:.3f} (medians over {rounds} rounds)")
        return
    if args.fix is not None:
        for name, v in runs.items():
            print(f"{name}: fix --dry-run {statistics.median(x[0] for x in v):.3f} s (min {min(x[0] for x in v):.3f})")
        b = statistics.median(x[0] for x in runs["base"])
        n = statistics.median(x[0] for x in runs["new"])
        print(f"new/base fix time: {n / b:.3f} (medians over {rounds} rounds of the fastest of {args.repeat})")
        return
    for name, v in runs.items():
        audit_s = statistics.median(x[0] for x in v)
        floor_s = statistics.median(x[1] for x in v)
        ratio = statistics.median(x[0] / x[1] for x in v)
        print(f"{name}: audit {audit_s:.3f} s, floor {floor_s:.3f} s, ratio {ratio:.2f}x")
    b = statistics.median(x[0] for x in runs["base"])
    n = statistics.median(x[0] for x in runs["new"])
    print(f"new/base audit time: {n / b:.3f} (medians over {rounds} rounds of the fastest of 5)")


if __name__ == "__main__":
    main()
