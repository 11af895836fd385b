"""nafix's estimate of the published int8 ViTs on the STM32N6570-DK, rebuilt at their published sizes.

    python scripts/tflite_vit_estimate.py [--patch 16] [--times ../shared/reference/latency/published_times.csv]

The published rows (minchoCoin/stm32n6-transformer, STEdgeAI 2.2.0) give image size, width D, depth L,
heads H and MLP width but no model file. This script builds an int8 encoder of that size with
tests/data/tflite/generate.py's ``vit_encoder`` (tokens = (image / patch)^2 + 1 class token; the
patch size is not published: 16 assumed), imports it (checked against the TFLite interpreter when one
is installed) and prints nafix's estimate beside the published time. Random weights: the estimate
depends on shapes and placement, not on values. Estimated figures are nafix's cost model, not measured.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fixer.api import AnalysisOptions, analyze_path  # noqa: E402
from fixer.importers import check_loaded  # noqa: E402
from tests.data.tflite.generate import vit_encoder  # noqa: E402

SIZE = re.compile(r"ViT-(\w) img(\d+) D(\d+) L(\d+) H(\d+) MLP(\d+)")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patch", type=int, default=16)
    ap.add_argument("--times", type=Path, default=ROOT.parent / "shared" / "reference" / "latency" / "published_times.csv")
    args = ap.parse_args(argv)
    with open(args.times, newline="", encoding="utf-8") as f:
        published = list(csv.DictReader(f))
    rows = [r for r in published if SIZE.match(r.get("model_name", ""))]
    with_bias = {r["model_name"].split()[0]: r for r in published if "w/ bias" in r.get("model_name", "")}
    sys.stdout.write("| ViT | tokens | published ms (FC / FC as 1x1 conv) | core | estimated epochs (SW) | estimated ms | import check |\n"
                     "|---|---:|---:|---|---:|---:|---|\n")
    with tempfile.TemporaryDirectory() as tmp:
        for r in rows:
            kind, img, dim, layers, heads, mlp = SIZE.match(r["model_name"]).groups()
            tokens = (int(img) // args.patch) ** 2 + 1
            path = Path(tmp) / f"vit_{kind}.tflite"
            path.write_bytes(vit_encoder(tokens, int(dim), int(layers), int(heads), int(mlp)))
            core = r.get("core_version", "").split()[0] if r.get("core_version") else None
            a = analyze_path(path, AnalysisOptions(core=".".join(core.split(".")[:2]) if core else None))
            check = check_loaded(a.loaded)
            est = a.estimate
            other = with_bias.get(f"ViT-{kind}", {}).get("inference_ms", "-")
            sys.stdout.write(f"| {r['model_name']} | {tokens} | {r['inference_ms']} / {other} | {core or '-'} | "
                             f"{est.epochs} ({est.sw_epochs}) | {est.latency_ms:.1f} | "
                             f"{'ok' if check is not None and check.ok else (check.summary() if check else '-')} |\n")
            a.view.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
