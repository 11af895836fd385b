"""Measuring with the real compiler (stedgeai / atonn): where it is, the options of a run and their time
budget, one model compiled in its own workspace, a fix's input and output compiled and compared with
nafix's estimate."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import UsageError
from ..npu.placement import SW
from ..results import CompileComparison, CompiledModel, FixResult, ModelAnalysis


@dataclass(frozen=True)
class CompileOptions:
    """How to run stedgeai: where it is, which Neural-ART profile, how long to wait, where to work."""

    stedgeai: str | None = None  # --stedgeai PATH; else $STEDGEAI_CORE_DIR/Utilities/<os>/stedgeai, else PATH
    profile: str | None = None  # NAME@FILE.json (--st-neural-art)
    timeout_s: float = 900.0
    workdir: str | None = None  # keep workspaces here; default: a temporary folder, removed afterwards
    extra_args: tuple[str, ...] = ()


def compile_before_after(result: FixResult, copts: CompileOptions,
                          on_line: Callable[[str, str], None] | None) -> CompileComparison:
    import tempfile

    from ..outputs import save_model

    import time
    from dataclasses import replace

    deadline = time.monotonic() + copts.timeout_s  # every stedgeai run of this command shares the budget

    def remaining() -> CompileOptions:
        left = deadline - time.monotonic()
        if left <= 0:
            from ..errors import ToolError

            raise ToolError(f"stedgeai did not finish within --compile-timeout {copts.timeout_s:g} s "
                            "(all its runs together).")
        return replace(copts, timeout_s=max(round(left, 1), 0.1))

    tool, version = locate_stedgeai(copts, required=True)

    def lines(label):
        return (lambda line: on_line(label, line)) if on_line else None

    mem = result.before.memory
    if not mem.fits_on_chip:
        note = (f"estimated peak activations {mem.peak_activation_bytes / 1024:,.0f} KiB exceed the on-chip pools "
                f"({mem.onchip_bytes / 1024:,.0f} KiB): expect external RAM use or 'left unallocated' errors")
        result.warnings.append(note)
        if on_line:
            on_line("before", "nafix warning: " + note)
    before = compile_model(result.input, "before", remaining(), tool, analysis=result.before, on_line=lines("before"))
    after = None
    ok_to_compile = result.changed and (result.verified or result.written)
    if ok_to_compile:
        if result.written and result.output is not None:
            after = compile_model(result.output, "after", remaining(), tool, analysis=result.after,
                                  on_line=lines("after"))
        else:
            with tempfile.TemporaryDirectory(prefix="nafix-fixed-") as tmp:
                fixed = save_model(result.engine.model, Path(tmp) / (result.input.stem + ".nafix.onnx"))
                after = compile_model(fixed, "after", remaining(), tool, analysis=result.after, on_line=lines("after"))
    return CompileComparison(tool, version, before, after)


def locate_stedgeai(opts: CompileOptions, *, required: bool):
    """(path, version) of stedgeai, or (None, None) when absent and not ``required``."""
    from ..errors import ToolError
    from . import find_stedgeai, stedgeai_version

    tool = check_compile_options(opts) if required else find_stedgeai(opts.stedgeai)
    if tool is None:
        return None, None
    return tool, stedgeai_version(tool, timeout=min(60.0, opts.timeout_s))


def spend_timeout(opts: CompileOptions, seconds: float) -> CompileOptions:
    """``opts`` with ``seconds`` of its stedgeai time budget used (every run of a command shares it)."""
    from dataclasses import replace

    from ..errors import ToolError

    left = opts.timeout_s - seconds
    if left <= 0:
        raise ToolError(f"stedgeai did not finish within the timeout of {opts.timeout_s:g} s (all its runs together).")
    return replace(opts, timeout_s=max(round(left, 1), 0.1))


def check_compile_options(opts: CompileOptions) -> Path:
    """The stedgeai executable for ``opts``, or one error sentence for options that cannot work (a
    missing or non-executable stedgeai, a timeout that is not a positive number): called before any
    work so that a bad --compile option never comes after minutes of fixing."""
    import math

    from ..errors import ToolError
    from . import find_stedgeai

    if not isinstance(opts.timeout_s, (int, float)) or not math.isfinite(opts.timeout_s) or opts.timeout_s <= 0:
        raise UsageError(f"the stedgeai timeout (--compile-timeout; --timeout of nafix compile) must be a finite, "
                         f"positive number of seconds, not {opts.timeout_s!r}.")
    if opts.workdir and Path(opts.workdir).exists() and not Path(opts.workdir).is_dir():
        raise UsageError(f"--workdir {opts.workdir}: exists and is not a folder.")
    tool = find_stedgeai(opts.stedgeai)
    if tool is None:
        raise ToolError(
            "stedgeai was not found: pass --stedgeai PATH, set STEDGEAI_CORE_DIR to the ST Edge AI Core "
            "installation (its Utilities/<os>/stedgeai is used), or put stedgeai on PATH.")
    if not os.access(tool, os.X_OK) or not Path(tool).is_file():
        raise ToolError(f"'{tool}' is not an executable file; pass --stedgeai PATH to the stedgeai executable.")
    return Path(tool)


def estimate_vs_real(analysis: ModelAnalysis | None, result) -> list[dict]:
    """Where nafix's placement model disagreed with the compiler: per op type (SW epoch counts),
    per node where the compiler kept the ONNX node names, and the total epoch count."""
    from collections import Counter

    if analysis is None or result.report is None:
        return []
    rep = result.report
    rows: list[dict] = []
    if analysis.estimate.epochs != rep.epochs:
        rows.append({"what": "epochs", "predicted": analysis.estimate.epochs, "actual": rep.epochs})
    by_name = analysis.placement.by_name
    # SW (and, where the report counts them, hybrid) epochs by the name the report prints
    pred = analysis.estimate.sw_ops
    act = Counter(rep.sw_ops)
    for op in sorted(set(pred) | set(act)):
        if pred[op] != act[op]:
            rows.append({"what": "sw_ops", "op": op, "predicted": pred[op], "actual": act[op]})
    if rep.hybrid_epochs is not None:
        pred_h, act_h = analysis.estimate.hybrid_ops, Counter(rep.hybrid_ops)
        for op in sorted(set(pred_h) | set(act_h)):
            if pred_h[op] != act_h[op]:
                rows.append({"what": "hybrid_ops", "op": op, "predicted": pred_h[op], "actual": act_h[op]})
    if result.c_info is not None:
        for ep in result.c_info.counted_epochs:
            actual = "SW" if ep.kind == "SW" else ("HYBRID" if ep.kind == "HYBRID" else "HW")
            for name in ep.node_names:
                p = by_name.get(name)
                if p is None or p.unit == "folded":
                    continue
                if (p.unit == SW) != (actual == "SW"):
                    rows.append({"what": "node", "node": name, "op": p.op_type, "predicted": p.unit,
                                 "actual": actual, "reasons": [r.text() for r in p.reasons]})
    return rows


def compile_model(model: Path, label: str, opts: CompileOptions, tool: Path, *,
                  analysis: ModelAnalysis | None = None,
                  on_line: Callable[[str], None] | None = None) -> CompiledModel:
    """Run stedgeai on ``model`` in its own workspace (never the model's folder)."""
    import shutil
    import tempfile

    from . import run_generate

    if opts.workdir:
        work = Path(opts.workdir) / label
        try:
            work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--workdir {opts.workdir}: the stedgeai workspace {work} cannot be created "
                             f"({exc.strerror or exc}).") from None
        cleanup = False
    else:
        work = Path(tempfile.mkdtemp(prefix=f"nafix-{label}-"))
        cleanup = True
    try:
        res = run_generate(tool=tool, model=model, workdir=work, profile=opts.profile,
                           extra_args=opts.extra_args, timeout_s=opts.timeout_s, on_line=on_line,
                           temporary_workdir=cleanup)
    finally:
        if cleanup:
            shutil.rmtree(work, ignore_errors=True)
    return CompiledModel(label, model, res, estimate_vs_real(analysis, res))
