#!/usr/bin/env python3
"""Make the README's two screenshots: docs/fix-html.png (``nafix MODEL --html``) and
docs/audit-html.png (``nafix audit ... -f html``), rendered by headless Chromium.

    python scripts/screenshots.py [MODELS_FOLDER]

MODELS_FOLDER defaults to ../shared/models (real models), else sample_models/. Everything nafix
writes goes to a temporary folder; only the two PNG files are written under docs/.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
#: (fix model, audit models) in the shared folder, and the same from sample_models/
SHARED = ("tfl2onnx-stn6__st_movenet_lightning_heatmaps_192_int8_pc.onnx",
          ("magnus__mobilenet_v2_224_int8.onnx", "magnus__yolov8n_int8.onnx", "pele__mobilefacenet__PerChannel_quant.onnx",
           "sanxia__en_PP-OCRv4_rec_qdq.onnx", "tenvad__ten-vad.onnx",
           "tfl2onnx-coral__deeplabv3_mnv2_dm05_pascal_quant.onnx",
           "tfl2onnx-stn6__st_movenet_lightning_heatmaps_192_int8_pc.onnx"))
SAMPLES = ("movenet_like.onnx", ("movenet_like.onnx", "denoiser_257.onnx", "classifier_softmax.onnx",
                                 "uint8_default_quant.onnx", "big_activations_float.onnx"))


def nafix(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "fixer.cli", *args], cwd=cwd, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)


def shoot(browser: str, page: Path, png: Path, size: str, work: Path) -> None:
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
                    "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={work / 'profile'}",
                    f"--window-size={size}", f"--screenshot={png}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    print(f"wrote {png}")


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "models"
    fix_model, audit_models = SHARED if (folder / SHARED[0]).is_file() else SAMPLES
    if not (folder / fix_model).is_file():
        folder = ROOT / "sample_models"
        fix_model, audit_models = SAMPLES
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        sys.exit("no Chromium/Chrome found")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in {fix_model, *audit_models}:  # short names in the pages
            shutil.copy(folder / name, work / name.split("__", 1)[-1])
        short = [n.split("__", 1)[-1] for n in audit_models]
        nafix(fix_model.split("__", 1)[-1], "--html", "fix.html", cwd=work)
        nafix("audit", *short, "-f", "html", "-o", "audit.html", "--no-cache", cwd=work)
        shoot(browser, work / "fix.html", ROOT / "docs" / "fix-html.png", "1200,1000", work)
        shoot(browser, work / "audit.html", ROOT / "docs" / "audit-html.png", "1600,760", work)


if __name__ == "__main__":
    main()
