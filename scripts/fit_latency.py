"""Refit the latency parameters marked ``fitted: true`` in the target profile on published times.

    python scripts/fit_latency.py [--times ../shared/reference/latency/published_times.csv] [--write]
        [--holdout K] [--loo]

Prints the fitted values, the calibrate summary with them, and the held-out figures: every K-th distinct
model (K = 4 by default) is left out, the parameters are fitted on the rest and the left-out rows are
estimated with them; ``--write`` stores the values fitted on all rows into fixer/npu/profiles/stm32n6.yaml
(only the ``value:`` lines of the fitted parameters change). ``--loo`` adds a leave-one-model-out check.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fixer.latency_calibration import (calibrate_times, fit, recost, spearman,  # noqa: E402
                                       summary_line, times_summary)
from fixer.npu.latency import latency_model  # noqa: E402
from fixer.npu.profile import load_profile  # noqa: E402

PROFILE = ROOT / "fixer" / "npu" / "profiles" / "stm32n6.yaml"


def _yaml_float(v: float) -> str:
    """A float YAML 1.1 reads back as a float ('1e-07' would be a string there: '1.0e-07')."""
    s = f"{v:.4g}"
    mant, e, exp = s.partition("e")
    return f"{mant if '.' in mant else mant + '.0'}{e}{exp}"


def _summary(rows, model):
    for r in rows:
        r.estimated_ms = recost(r, model)
    return times_summary(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--times", default=str(ROOT.parent.parent / "shared/reference/latency/published_times.csv"))
    ap.add_argument("--write", action="store_true", help="write the fitted values into the built-in profile")
    ap.add_argument("--holdout", type=int, default=4, help="leave out every K-th distinct model (0: none)")
    ap.add_argument("--loo", action="store_true", help="also leave-one-model-out: refit without each model, estimate it")
    args = ap.parse_args()
    if not Path(args.times).is_file():
        alt = ROOT.parent / "shared/reference/latency/published_times.csv"
        args.times = str(alt) if alt.is_file() else args.times
    model = latency_model(load_profile())
    names = [n for n, p in model.params.items() if p.fitted]
    rows = [r for r in calibrate_times(args.times, keep_work=True) if r.work]
    print(f"{len(rows)} rows with a model file; fitting {', '.join(names)}")
    values, loss = fit(rows, model, names)
    fitted = model.with_values(values)
    for n in names:
        print(f"  {n} = {values[n]:.4g}  (was {model.v(n):.4g})")
    print(f"loss (Huber on log ratios) {loss:.4f}")
    print("all rows, fitted on all:", summary_line(_summary(rows, fitted)))
    if args.holdout:
        files = sorted({str(r.path.resolve()) for r in rows})
        out_files = set(files[args.holdout - 1::args.holdout])
        train = [r for r in rows if str(r.path.resolve()) not in out_files]
        test = [r for r in rows if str(r.path.resolve()) in out_files]
        v2, _ = fit(train, model, names)
        m2 = model.with_values(v2)
        print("held-out fit:", ", ".join(f"{n} = {v2[n]:.4g}" for n in names))
        print("  training rows:", summary_line(_summary(train, m2)))
        print("  held-out rows:", summary_line(_summary(test, m2)))
        for r in test:
            print(f"    {r.name[:60]}: published {r.published_ms:g} ms, estimated {r.estimated_ms:.2f} ms "
                  f"({r.error:+.0%})")
    if args.loo:
        files = sorted({str(r.path.resolve()) for r in rows})
        for f in files:
            train = [r for r in rows if str(r.path.resolve()) != f]
            test = [r for r in rows if str(r.path.resolve()) == f]
            v3, _ = fit(train, model, names, starts=2)
            m3 = model.with_values(v3)
            for r in test:
                r.estimated_ms = recost(r, m3)
        print("leave-one-model-out:", summary_line(times_summary(rows)))
        for r in rows:
            print(f"    {r.name[:60]}: published {r.published_ms:g} ms, estimated without it {r.estimated_ms:.2f} ms "
                  f"({r.error:+.0%})")
    if args.write:
        text = PROFILE.read_text(encoding="utf-8")
        for n in names:
            pat = re.compile(rf"(\n  {re.escape(n)}:\n    value: )([^\n]+)")
            if not pat.search(text):
                print(f"error: {PROFILE} has no 'latency.{n}.value' line to write", file=sys.stderr)
                return 1
            text = pat.sub(lambda m: m.group(1) + _yaml_float(values[n]), text, count=1)
        PROFILE.write_text(text, encoding="utf-8")
        print(f"wrote {len(names)} values into {PROFILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
