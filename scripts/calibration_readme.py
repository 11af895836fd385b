"""Regenerate the README's per-core table and calibration section.

    python scripts/calibration_readme.py [PAIRS_DIR]

PAIRS_DIR defaults to ../shared/reference/pairs (beside the repository). tests/test_calibrate.py
fails when the README is not what this script writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fixer.calibrate import (CALIBRATION_BEGIN, CALIBRATION_END, CORES_BEGIN, CORES_END,  # noqa: E402
                             calibrate, calibration_block, cores_block, replace_block)
from fixer.npu.profile import load_profile  # noqa: E402


def main(argv: list[str]) -> int:
    pairs = Path(argv[0]) if argv else ROOT.parent / "shared" / "reference" / "pairs"
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    text = replace_block(text, CORES_BEGIN, CORES_END, cores_block(load_profile()))
    exceptions = yaml.safe_load((ROOT / "docs" / "calibration_exceptions.yaml").read_text(encoding="utf-8"))
    text = replace_block(text, CALIBRATION_BEGIN, CALIBRATION_END, calibration_block(calibrate(pairs), exceptions))
    readme.write_text(text, encoding="utf-8")
    sys.stdout.write(f"wrote {readme}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
