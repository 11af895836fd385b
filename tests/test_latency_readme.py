"""The README's estimated-vs-published time table is what `python scripts/calibration_readme.py
--only latency` (``nafix calibrate --times ../shared/reference/latency``) writes today (skipped when
../shared is absent), and the script rewrites that block and nothing else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fixer.calibrate import replace_block
from fixer.latency_calibration import LATENCY_BEGIN, LATENCY_END, calibrate_times, latency_block
from tests.helpers import save
from tests.test_latency import conv_chain

ROOT = Path(__file__).resolve().parents[1]
TIMES = ROOT.parent / "shared" / "reference" / "latency" / "published_times.csv"
needs_times = pytest.mark.skipif(not TIMES.is_file(), reason=f"{TIMES} (published times) is not available")


@needs_times
def test_readme_latency_table_is_current():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(LATENCY_BEGIN) == 1 and text.count(LATENCY_END) == 1
    rows = calibrate_times(TIMES)
    want = replace_block(text, LATENCY_BEGIN, LATENCY_END, latency_block(rows))
    assert text == want, "README's latency table is stale: run python scripts/calibration_readme.py --only latency"
    block = text.split(LATENCY_BEGIN, 1)[1].split(LATENCY_END, 1)[0]
    table_rows = [ln for ln in block.splitlines() if ln.startswith("| ") and not ln.startswith("| model |")]
    assert len(table_rows) == sum(1 for r in rows if r.path is not None) >= 18
    assert "models within ±25 % of the published time" in block


def test_the_script_rewrites_only_the_latency_block(tmp_path):
    save(conv_chain(16), tmp_path / "small.onnx")
    csv = tmp_path / "times.csv"
    csv.write_text("model_name,model_file,inference_ms,core_version\nsmall,small.onnx,0.5,4.0.1\n"
                   "gone,,5.0,3.0.0\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    before, after = "# title\n\nprose before\n", "\nprose after\n"
    readme.write_text(f"{before}{LATENCY_BEGIN}\nold table\n{LATENCY_END}{after}", encoding="utf-8")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "calibration_readme.py"), "--only", "latency",
                           "--times", str(csv), "--readme", str(readme)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = readme.read_text(encoding="utf-8")
    assert text == f"{before}{LATENCY_BEGIN}\n{latency_block(calibrate_times(csv))}\n{LATENCY_END}{after}"
    assert "| small |" in text and "old table" not in text and "1 rows without a model file" in text
