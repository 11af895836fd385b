"""``nafix calibrate --times FILE.csv``: nafix's estimated inference time against published measured times.

The CSV has one row per published time, with at least ``model_file`` (a path, relative to the CSV's
folder or to the folder above it as in ``shared/reference/latency/published_times.csv``) and
``inference_ms``; ``core_version`` (stedgeai core of the measurement) and ``model_name`` are read
when present. Rows without a model file are skipped (counted in the summary). Each model is estimated
with the core version of its row. No printing here: the CLI renders the rows.

:func:`fit` refits the profile's fitted latency parameters (``fitted: true``) on such rows, by a robust (Huber)
loss on the log of the time ratio (Nelder-Mead in log space, numpy only); ``scripts/fit_latency.py``
runs it and writes the values back into the profile.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import InputError, NafixError

#: a model is "within" when its estimate is within this fraction of the published time
WITHIN = 0.25


@dataclass
class TimeRow:
    name: str
    model_file: str
    published_ms: float
    core: str = ""
    path: Path | None = None
    estimated_ms: float | None = None
    epochs: int | None = None
    sw_epochs: int | None = None
    status: str = "ok"  # ok | no model | error
    note: str = ""
    # what the cost model needs to re-cost the row under other parameters (fit)
    work: list = field(default_factory=list, repr=False)
    memory: object = field(default=None, repr=False)

    @property
    def error(self) -> float | None:
        """(estimated - published) / published."""
        if self.estimated_ms is None or not self.published_ms:
            return None
        return (self.estimated_ms - self.published_ms) / self.published_ms

    def as_dict(self) -> dict:
        err = self.error
        return {"model": self.name, "model_file": self.model_file, "core": self.core,
                "published_ms": self.published_ms if math.isfinite(self.published_ms) else None,
                "estimated_ms": None if self.estimated_ms is None else round(self.estimated_ms, 3),
                "error": None if err is None else round(err, 4),
                "within": err is not None and abs(err) <= WITHIN,
                "epochs": self.epochs, "sw_epochs": self.sw_epochs, "status": self.status, "note": self.note}


def _inside(base: Path, name: str) -> Path | None:
    """``base / name`` when it is a regular file that resolves inside ``base`` (a CSV row names a file
    beside the CSV or in the folders above it, never an absolute path or one that leaves them), else None."""
    from .fsutil import is_regular

    if Path(name).is_absolute():
        return None
    p = base / name
    try:
        if not p.resolve().is_relative_to(base.resolve()):
            return None
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
        return None
    return p if is_regular(p) else None


def read_times(csv_path: str | Path) -> list[TimeRow]:
    """The rows of a published-times CSV (see the module docstring)."""
    import io

    from .fsutil import read_text

    path = Path(csv_path)
    try:
        rows = list(csv.DictReader(io.StringIO(read_text(path))))  # a regular file only: a FIFO never blocks
    except FileNotFoundError:
        raise InputError(f"{path}: the published-times CSV does not exist.") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{path}: the published-times CSV cannot be read ({exc}).") from None
    if rows and ("inference_ms" not in rows[0] or "model_file" not in rows[0]):
        raise InputError(f"{path}: the CSV needs the columns 'model_file' and 'inference_ms' "
                         f"(it has {', '.join(rows[0])}).")
    out = []
    for i, r in enumerate(rows, start=2):
        try:
            ms = float(r["inference_ms"])
        except (TypeError, ValueError):
            ms = float("nan")  # a bound ('>100') or a blank: kept, never estimated
        name = (r.get("model_name") or r.get("model_file") or f"line {i}").strip()
        row = TimeRow(name=name, model_file=(r.get("model_file") or "").strip(), published_ms=ms,
                      core=_core_xy(r.get("core_version") or ""))
        if not (math.isfinite(ms) and ms > 0):
            row.status, row.note = "no time", f"line {i}: inference_ms {r.get('inference_ms')!r} is not a positive number"
            out.append(row)
            continue
        if row.model_file:
            for base in (path.parent, path.parent.parent, path.parent.parent.parent):
                p = _inside(base, row.model_file)
                if p is not None:
                    row.path = p
                    break
        if row.path is None:
            row.status = "no model"
            row.note = "no model file" if not row.model_file else f"{row.model_file} not found"
        out.append(row)
    return out


def _core_xy(version: str) -> str:
    from .calibrate import core_of

    v = core_of(version)
    parts = v.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else ""


def calibrate_times(csv_path: str | Path, *, target_profile: str | None = None, keep_work: bool = False) -> list[TimeRow]:
    """Estimate every row's model (with its row's core version) and set ``estimated_ms``."""
    from .api import AnalysisOptions, analyze_path, resolve_profile
    from .npu.latency import epoch_work

    rows = read_times(csv_path)
    cache: dict[tuple, tuple] = {}
    for row in rows:
        if row.path is None:
            continue
        key = (str(row.path.resolve()), row.core)
        try:
            if key not in cache:
                opts = AnalysisOptions(target_profile=target_profile, core=row.core or None)
                try:
                    profile = resolve_profile(opts)
                except NafixError:
                    opts = AnalysisOptions(target_profile=target_profile)  # a core the profile does not know
                    profile = resolve_profile(opts)
                a = analyze_path(row.path, opts, profile=profile)
                work = epoch_work(a.view, a.placement, a.estimate) if keep_work else []
                cache[key] = (a.estimate, a.memory, work)
                a.view.release()
            est, mem, work = cache[key]
        except NafixError as exc:
            row.status, row.note = "error", str(exc)
            continue
        if est.latency is None:
            row.status, row.note = "error", "the target profile has no latency data"
            continue
        row.estimated_ms = est.latency.ms
        row.epochs, row.sw_epochs = est.epochs, est.sw_epochs
        row.work, row.memory = work, mem
    return rows


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None under 3 pairs."""
    if len(a) < 3:
        return None

    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):
            idx = x == v
            r[idx] = r[idx].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def times_summary(rows: list[TimeRow]) -> dict:
    """Models within ±25 %, median absolute error, Spearman rank correlation (estimated rows only)."""
    est = [r for r in rows if r.error is not None]
    errs = [abs(r.error) for r in est]
    rho = spearman([r.published_ms for r in est], [r.estimated_ms for r in est])
    return {
        "rows": len(rows),
        "estimated": len(est),
        "without_model": sum(1 for r in rows if r.status in ("no model", "no time")),
        "errors": sum(1 for r in rows if r.status == "error"),
        "within_25pct": sum(1 for e in errs if e <= WITHIN),
        "within_25pct_share": round(sum(1 for e in errs if e <= WITHIN) / len(est), 4) if est else None,
        "median_abs_error": round(float(np.median(errs)), 4) if errs else None,
        "spearman": None if rho is None else round(rho, 4),
    }


def summary_line(s: dict) -> str:
    if not s["estimated"]:
        return f"0 of {s['rows']} rows estimated (no model file found)."
    rho = "n/a" if s["spearman"] is None else f"{s['spearman']:.2f}"
    return (f"{s['within_25pct']}/{s['estimated']} models within ±25 % of the published time "
            f"({s['within_25pct_share']:.0%}), median absolute error {s['median_abs_error']:.1%}, "
            f"Spearman {rho} (estimated by nafix; {s['without_model']} rows without a model file skipped)")


def times_table(rows: list[TimeRow]) -> str:
    """A Markdown table of the rows with a model file, then the summary line."""
    from .escape import markdown

    lines = ["| model | core | epochs (SW) | published ms | estimated ms | error |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if r.path is None:
            continue
        name, core = markdown(r.name), markdown(r.core or "-")  # both come from the CSV
        if r.estimated_ms is None:
            lines.append(f"| {name} | {core} | - | {r.published_ms:g} | {r.status}: {markdown(r.note[:60])} | - |")
            continue
        lines.append(f"| {name} | {core} | {r.epochs} ({r.sw_epochs}) | {r.published_ms:g} | "
                     f"{r.estimated_ms:.2f} | {r.error:+.0%} |")
    lines += ["", summary_line(times_summary(rows))]
    return "\n".join(lines) + "\n"


LATENCY_BEGIN = "<!-- latency:begin (generated by `python scripts/calibration_readme.py`; do not edit) -->"
LATENCY_END = "<!-- latency:end -->"


def latency_block(rows: list[TimeRow]) -> str:
    """The README's estimated-vs-published table (``times_table``) with the command that makes it."""
    intro = ("Estimated with `nafix calibrate --times ../shared/reference/latency` (published: measured on the "
             "STM32N6570-DK, from the sources its README names; estimated: nafix's cost model with the stedgeai "
             "core version of each row, not a measurement):")
    return intro + "\n\n" + times_table(rows).rstrip("\n")


# ------------------------------------------------------------------------------------------------
# fitting
# ------------------------------------------------------------------------------------------------


def recost(row: TimeRow, model, pools=None) -> float:
    """The row's estimated ms under ``model`` (a :class:`~fixer.npu.latency.LatencyModel`)."""
    from .npu.latency import cost, memory_placement
    from .npu.mpool import default_stm32n6_pools

    where = memory_placement(row.memory, pools if pools is not None else default_stm32n6_pools(), model)
    return cost(row.work, where, model).ms


#: Huber threshold on the log ratio: errors beyond about ±20 % count linearly, so that one model the cost
#: model cannot explain (a lowering it does not know) does not drag every parameter towards it
HUBER = 0.2


def _loss(rows: list[TimeRow], model) -> float:
    total = 0.0
    for r in rows:
        e = abs(math.log(recost(r, model) / r.published_ms))
        total += e * e if e <= HUBER else 2 * HUBER * e - HUBER * HUBER
    return float(total)


def fit(rows: list[TimeRow], model, names: list[str], *, starts: int = 6, iters: int = 400) -> tuple[dict, float]:
    """Values of the parameters ``names`` that minimise the squared log error over ``rows`` (rows that have
    their work, see :func:`calibrate_times` with ``keep_work``); deterministic (fixed starting points)."""
    rows = [r for r in rows if r.work and r.published_ms > 0]
    if not rows:
        raise InputError("no row with an estimated model to fit the latency parameters on.")
    x0 = np.log([max(model.v(n), 1e-6) for n in names])

    def f(x):
        return _loss(rows, model.with_values(dict(zip(names, np.exp(x)))))

    best_x, best = x0, f(x0)
    rng = np.random.default_rng(0)
    for s in range(starts):
        start = x0 if s == 0 else x0 + rng.normal(0.0, 1.0, len(x0))
        x, val = _nelder_mead(f, start, iters=iters)
        if val < best:
            best_x, best = x, val
    return {n: float(v) for n, v in zip(names, np.exp(best_x))}, best


def _nelder_mead(f, x0, *, iters: int = 400, step: float = 0.5):
    n = len(x0)
    pts = [np.array(x0, dtype=float)] + [np.array(x0, dtype=float) + step * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < 1e-10:
            break
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2 * (c - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    i = int(np.argmin(vals))
    return pts[i], vals[i]
