"""Regenerate the README's generated tables: the per-core table, the calibration section (reports)
and the estimated-vs-published time table.

    python scripts/calibration_readme.py [PAIRS_DIR] [--times LATENCY_DIR] [--only {cores,pairs,latency}]
                                         [--readme README.md]

PAIRS_DIR defaults to ../shared/reference/pairs and LATENCY_DIR to ../shared/reference/latency (beside
the repository); ``--only latency`` rewrites the time table alone (``nafix calibrate --times
LATENCY_DIR``). Each table sits between its marker lines in README.md; nothing else is touched.
tests/test_calibrate.py and tests/test_latency_readme.py fail when the README is not what this script
writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fixer.calibrate import (CALIBRATION_BEGIN, CALIBRATION_END, CORES_BEGIN, CORES_END,  # noqa: E402
                             calibrate, calibration_block, cores_block, replace_block)
from fixer.latency_calibration import LATENCY_BEGIN, LATENCY_END, calibrate_times, latency_block  # noqa: E402
from fixer.npu.profile import load_profile  # noqa: E402

SHARED = ROOT.parent / "shared" / "reference"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="?", type=Path, default=SHARED / "pairs", help="folder of (model, report) pairs")
    ap.add_argument("--times", type=Path, default=SHARED / "latency",
                    help="published_times.csv, or the folder holding it")
    ap.add_argument("--only", choices=("cores", "pairs", "latency"), action="append",
                    help="rewrite only this table (repeatable); default: all three")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the README to rewrite")
    args = ap.parse_args(argv)
    only = set(args.only or ("cores", "pairs", "latency"))
    readme = args.readme
    text = readme.read_text(encoding="utf-8")
    if "cores" in only:
        text = replace_block(text, CORES_BEGIN, CORES_END, cores_block(load_profile()))
    if "pairs" in only:
        exceptions = yaml.safe_load((ROOT / "docs" / "calibration_exceptions.yaml").read_text(encoding="utf-8"))
        text = replace_block(text, CALIBRATION_BEGIN, CALIBRATION_END,
                             calibration_block(calibrate(args.pairs), exceptions))
    if "latency" in only:
        csv = args.times / "published_times.csv" if args.times.is_dir() else args.times
        text = replace_block(text, LATENCY_BEGIN, LATENCY_END, latency_block(calibrate_times(csv)))
    readme.write_text(text, encoding="utf-8")
    sys.stdout.write(f"wrote {readme} ({', '.join(sorted(only))})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
