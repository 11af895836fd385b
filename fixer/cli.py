"""The ``nafix`` command line. The only module that prints or exits.

Exit codes: 0 = success (fixed and verified, or nothing to fix), 1 = findings remain under
``--fail-on`` or verification failed, 2 = bad input or usage.
"""

from __future__ import annotations

import io
import logging
import math
import os
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.text import Text

from . import __version__, escape
from .errors import NafixError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="nafix: find and fix what makes ONNX models fall back to SW on the STM32N6 Neural-ART NPU.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

def _stdout_to_devnull() -> None:
    """The reader of stdout has gone (``nafix audit DIR | head``): send the rest of the output to
    /dev/null so the command still finishes and exits with its own result, with no traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (tests): nothing to redirect
        pass


def _drain_stdout() -> None:
    """At exit, before the interpreter flushes stdout itself: output a full disk cannot take goes to
    /dev/null instead of an "Exception ignored" traceback (every way out, errors included)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):
        _stdout_to_devnull()


#: the width of the console when stdout is not a terminal (see _Console.size)
NOT_A_TTY_WIDTH = 4096


class _Console(Console):
    """Rich's console ends the process with exit code 1 on a broken pipe; nafix keeps the command's
    own exit code (0, or 1 for findings per --fail-on), as if the output had been read in full."""

    def on_broken_pipe(self) -> None:
        _stdout_to_devnull()
        self.quiet = True

    @property
    def size(self):
        """The console size; when stdout is not a terminal (a CI log, pre-commit, a pipe) and
        $COLUMNS is not set, as wide as :data:`NOT_A_TTY_WIDTH`: tables are as wide as their cells
        need (never wider: they do not expand), so a model's path stays on one line. Rich would
        otherwise take 80 columns, or the width of a terminal on stdin or stderr."""
        dims = super().size
        if self._width is None and not os.environ.get("COLUMNS") and not self.is_terminal:
            from rich.console import ConsoleDimensions

            return ConsoleDimensions(NOT_A_TTY_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size) -> None:
        Console.size.fset(self, new_size)

    def _check_buffer(self) -> None:
        try:
            super()._check_buffer()
        except BrokenPipeError:  # pragma: no cover - Rich calls on_broken_pipe itself
            self.on_broken_pipe()
        except OSError as exc:  # a full disk or an I/O error on stdout: one error line, not a traceback
            del self._buffer[:]
            self.quiet = True
            raise _stdout_failed(exc) from None


def _stdout_failed(exc: OSError) -> "NafixError":
    """Standard output cannot take what nafix writes (``> /dev/full``: no space left, an I/O error):
    the rest goes to /dev/null (so the interpreter's last flush cannot fail again) and the error is
    one sentence (exit 2)."""
    from .errors import OutputError

    _stdout_to_devnull()
    return OutputError(f"cannot write to standard output ({exc.strerror or exc}); the output is incomplete.")


class _StdoutError(OSError):
    """A write to standard output failed (not a closed pipe): see :class:`_GuardedStdout`."""


class _GuardedStdout:
    """``sys.stdout`` while a command runs: a failed write or flush (a full disk, an I/O error)
    becomes :class:`_StdoutError`, so the top level tells it from a nafix bug whoever wrote
    (nafix, Rich, typer's help page). Everything else is the real stream's."""

    def __init__(self, stream):
        self._stream = stream
        self.nafix_wrapped = stream  # the real stream (fixer.deadline forks only where it is the real one)

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _StdoutError(exc.errno, exc.strerror) from None

    def flush(self):
        try:
            return self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _StdoutError(exc.errno, exc.strerror) from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _stdout(text: str) -> None:
    """Write ``text`` to stdout; a closed pipe is the reader's choice, not an error; a full disk is."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
    except OSError as exc:
        raise _stdout_failed(exc) from None


# soft_wrap: a line is never broken at the console width (a terminal wraps it for the eye), so a
# piece of a name never starts a line of its own in a CI log, and an error is one line on stderr
# whatever the terminal width (scripts grep for "error:"). Tables keep their columns.
out = _Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

_state = {"debug": False}


class Format(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    sarif = "sarif"
    github = "github"
    html = "html"
    concise = "concise"
    model_explorer = "model-explorer"


class FailOn(str, Enum):
    sw = "sw"
    error = "error"
    never = "never"


def _line(text: str, style: str = "") -> Text:
    """A line nafix prints: never Rich markup (names may hold '['), and the names and messages in it
    escaped for a terminal or CI log (one line, no control character, no workflow command; see
    :func:`fixer.escape.terminal`)."""
    return Text(escape.terminal(text), style=style)


def _error(message: str) -> None:
    """Print ``error: <message>`` as one line; the message is text, never Rich markup (paths may hold '[')."""
    err.print(Text.assemble(("error:", "bold red"), " ", escape.terminal(message)), highlight=False)


class _LogFormatter(logging.Formatter):
    """Log lines (``--debug``, warnings of the libraries) escaped like every other line nafix prints;
    a traceback of ``--debug`` keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape.terminal(super().formatMessage(record))


def _fail(exc: NafixError) -> None:
    _error(exc.message)
    if exc.exit_code == 1:
        from .errors import VerificationError

        _exit1("verification failed (the error above)" if isinstance(exc, VerificationError)
               else "a check failed (the error above)")
    raise typer.Exit(exc.exit_code)


def _exit1(reason: str) -> None:
    """Exit 1 with the reason as the last line nafix prints: ``nafix: exit 1 — REASON``."""
    err.print(_line(f"nafix: exit 1 — {reason}", style="bold red"), highlight=False)
    raise typer.Exit(1)


def _version(value: bool):
    if value:
        out.print(f"nafix {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
):
    _state["debug"] = debug
    handler = logging.StreamHandler()
    handler.setFormatter(_LogFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[handler])


def _analysis_options(target_profile, stedgeai_option, input_shape, mpool, profile, core=None):
    from .options import AnalysisOptions, parse_input_shapes  # light: a cache hit imports no analysis stack

    if stedgeai_option:
        from .npu.profile import normalize_options

        options = normalize_options(stedgeai_option)
    else:
        options = frozenset()
    return AnalysisOptions(
        target_profile=target_profile,
        stedgeai_options=options,
        input_shapes=parse_input_shapes(input_shape),
        mpool=mpool,
        neural_art_profile=profile,
        core=core,
    )


def _stedgeai_args(stedgeai_option) -> tuple[str, ...]:
    """The --stedgeai-option values as stedgeai arguments, so estimate and measurement describe one build."""
    from .npu.profile import normalize_options, option_args

    return tuple(option_args(normalize_options(stedgeai_option or ())))


def _limit_seconds(value: Optional[float]) -> Optional[float]:
    """A per-model / per-stage time limit in seconds: 0 or infinity is none (None); NaN or a negative
    number is refused."""
    import math

    if value is not None and (math.isnan(value) or value < 0):
        raise typer.BadParameter(f"{value:g} is not a time limit: give a number of seconds, 0 or inf for no limit.")
    return None if value is None or value == 0 or math.isinf(value) else value


def _positive_seconds(value: Optional[float]) -> Optional[float]:
    """A stedgeai timeout: a finite number of seconds above 0."""
    import math

    if value is not None and (not math.isfinite(value) or value <= 0):
        raise typer.BadParameter(f"{value:g} is not a timeout: give a finite number of seconds above 0.")
    return value


def _positive_ms(value: Optional[float]) -> Optional[float]:
    """A time budget (--max-ms): a finite number of milliseconds above 0."""
    import math

    if value is not None and (not math.isfinite(value) or value <= 0):
        raise typer.BadParameter(f"{value:g} is not a time budget: give a finite number of milliseconds above 0.")
    return value


MAX_MS_HELP = ("Exit 1 when the estimated time per inference (nafix's cost model, ms) of {what} exceeds this "
               "budget, whatever --fail-on says.")


def _over_budget(max_ms: Optional[float], timed: list[tuple[str, Optional[float]]]) -> Optional[str]:
    """One sentence naming what exceeds ``--max-ms`` (estimated ms), or None. A model whose time was not
    estimated (a profile without a cost model) is named too: the budget cannot be checked."""
    from .report import ms_text

    if max_ms is None:
        return None
    over = [(name, ms) for name, ms in timed if ms is None or ms > max_ms]
    if not over:
        return None
    parts = [f"{name} (estimated {ms_text(ms)} ms)" if ms is not None else f"{name} (time not estimated)"
             for name, ms in over[:5]]
    more = f" and {len(over) - 5} more" if len(over) > 5 else ""
    return (f"{len(over)} model(s) over the --max-ms budget of {ms_text(max_ms)} ms: " + ", ".join(parts) + more
            + "; times estimated by nafix's cost model, not measured.")


TARGET_HELP = "Target profile: built-in name (stm32n6) or a YAML file with limits and the operator table."
OPTION_HELP = ("A stedgeai option that changes placement, with its value in the same argument: "
               "--stedgeai-option='--input-data-type float32' (--output-data-type, --inputs-ch-position, "
               "--no-inputs-allocation, --expand-softmax, --GELU-recognition, --SWISH-recognition); repeatable.")
CORE_HELP = "ST Edge AI Core version X.Y whose placement facts apply (default: the newest in the target profile)."
SHAPE_HELP = "Pin a dynamic input: NAME=1,3,224,224 (repeatable)."
#: File extension of a report written with -o FOLDER/, by --format value.
_EXT = {"table": "txt", "json": "json", "markdown": "md", "sarif": "sarif", "github": "txt", "html": "html", "concise": "txt",
        "model-explorer": "json"}
OUTPUT_HELP = ("Write the report to this file instead of stdout (a folder, i.e. an existing one or a path ending "
               "with '/': a default name inside it).")
FORCE_HELP = "Overwrite an existing output file that nafix did not write (never an input)."
STEDGEAI_HELP = "Path to the stedgeai executable (else $STEDGEAI_CORE_DIR/Utilities/<os>/stedgeai, else PATH)."


SELECT_FINDING_HELP = ("Count only the findings named: a constraint id (resize_nearest_asymmetric, sw_op:Softmax) or an op type "
                       "(Softmax); repeatable. The others are reported as ignored. Not NAF rule ids (those are "
                       "fix's --select).")
IGNORE_FINDING_HELP = ("Accept the findings named: a constraint id (sw_op:Softmax) or an op type (Softmax); "
                       "repeatable, per path in the config. They are reported as ignored (counted) and do not count "
                       "for --fail-on or the baseline. Not NAF rule ids (those are fix's --ignore).")


@app.command("audit")
def audit_cmd(
    ctx: typer.Context,
    paths: List[str] = typer.Argument(..., help="Model files or folders (searched recursively). `nafix audit merge REPORT.json...` joins reports."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    fail_on: FailOn = typer.Option(FailOn.never, "--fail-on", help="Exit 1 when any SW epoch is predicted (sw), or when a model has a finding that makes stedgeai fail (error)."),
    max_ms: Optional[float] = typer.Option(None, "--max-ms", callback=_positive_ms, help=MAX_MS_HELP.format(what="any model audited")),
    output: Optional[str] = typer.Option(None, "--output", "-o", help=OUTPUT_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    input_shape: Optional[List[str]] = typer.Option(None, "--input-shape", help=SHAPE_HELP),
    target_profile: Optional[str] = typer.Option(None, "--target-profile", help=TARGET_HELP),
    stedgeai_option: Optional[List[str]] = typer.Option(None, "--stedgeai-option", help=OPTION_HELP),
    mpool: Optional[str] = typer.Option(None, "--mpool", help="A stedgeai .mpool file for the memory estimate."),
    profile: Optional[str] = typer.Option(None, "--profile", help="A Neural-ART profile NAME@FILE.json (its memory pools)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also list performance notes (decomposed kernels, ...)."),
    core: Optional[str] = typer.Option(None, "--core", help=CORE_HELP),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="Worker processes (default 0: one per CPU)."),
    timeout: float = typer.Option(120.0, "--timeout", callback=_limit_seconds, help="Seconds per model before it becomes an error row (0 or inf: no limit)."),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help="Result cache folder (default: $NAFIX_CACHE_DIR, else the user cache folder)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the result cache."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Exit 1 only on what is new or worse than this baseline file."),
    write_baseline: Optional[str] = typer.Option(None, "--write-baseline", help="Record today's findings per model in this baseline file."),
    shard: Optional[str] = typer.Option(None, "--shard", help="Audit only shard K of N (K/N, by path hash), e.g. 1/3."),
    executor: Optional[str] = typer.Option(None, "--executor", help="Run the models on a Dask cluster: dask://HOST:PORT (pip install 'nafix[dask]')."),
    select_finding: Optional[List[str]] = typer.Option(None, "--select-finding", "--select", help=SELECT_FINDING_HELP),
    ignore_finding: Optional[List[str]] = typer.Option(None, "--ignore-finding", "--ignore", help=IGNORE_FINDING_HELP),
):
    """Predict, node by node, what runs on the NPU (HW) and what falls back to the CPU (SW), and why."""
    from .zoo.runner import Shard, ZooOptions, audit_rows, build_report

    _state["audit_ctx"] = ctx

    paths = [Path(p) for p in paths]  # plain str options: click's Path would refuse an unreadable file for all
    try:
        from .selection import check_items

        select_finding = check_items(select_finding, "--select-finding")
        ignore_finding = check_items(ignore_finding, "--ignore-finding")
        # the baseline read is an input of the report (-o), not of --write-baseline (which may refresh it)
        target = _output_target(output, f"nafix-audit.{_EXT[fmt.value]}", force=force,
                                protected=paths + ([Path(baseline)] if baseline is not None else []))
        baseline_target = _output_target(write_baseline, "nafix-baseline.json", force=force, protected=paths)
        _distinct_outputs(("-o/--output", target), ("--write-baseline", baseline_target))
        analysis = dict(target_profile=target_profile, stedgeai_option=stedgeai_option, input_shape=input_shape,
                        mpool=mpool, profile=profile, core=core)
        groups = _per_path_groups(paths, analysis)
        opts = _analysis_options(**groups[0][1])
        zoo = ZooOptions(jobs=jobs, timeout=timeout, cache_dir=Path(cache_dir) if cache_dir else None,
                         use_cache=not no_cache, shard=Shard.parse(shard) if shard else None, executor=executor,
                         own_process=True)
        base = None
        if baseline is not None:
            from .zoo.baseline import load_baseline

            base = load_baseline(baseline)
        with _Progress(err.is_terminal, "auditing", failures=True) as cb:
            rows = []
            for group_paths, group_options in groups:  # one group unless per-path config values differ
                rows += audit_rows(group_paths, _analysis_options(**group_options), zoo, progress=cb)[0]
            rows.sort(key=lambda r: r["path"])
        rows = _select_findings(ctx, rows, select_finding, ignore_finding)
    except NafixError as exc:
        _fail(exc)
    profile_name = opts.target_profile or "stm32n6"
    report = build_report(rows, profile=profile_name, shard=zoo.shard)
    errors = [r for r in rows if r.get("error")]
    if len(rows) == 1 and errors and zoo.shard is None:  # one unreadable model: just its error line
        _error(errors[0]["error"])
        raise typer.Exit(2)
    comparison = None
    if base is not None:
        from .zoo.baseline import compare

        comparison = compare(report, base)
        report["baseline"] = {"file": str(baseline), **comparison.as_dict()}
    protected = list(paths) + [Path(r["path"]) for r in rows]
    _render_audit(report, fmt, target, verbose, force=force, protected=protected)
    if baseline_target is not None:
        from .zoo.baseline import baseline_text

        _emit(baseline_text(report), baseline_target, force=force, protected=protected)
    if comparison is not None:
        for c in comparison.improvements:
            err.print(_line(f"improved: {c.message}"), highlight=False)
        for c in comparison.regressions:
            err.print(_line(f"new: {c.message}", style="bold red"), highlight=False)
    if errors:  # one line whatever the count: each model has its error row in the report
        first = errors[0]["error"]
        _error(first if len(errors) == 1 else
               f"{len(errors)} of {len(rows)} models could not be analysed (see their rows); the first: {first}")
        raise typer.Exit(2)
    budget = _over_budget(max_ms, [(Path(r["path"]).name, (r.get("estimate") or {}).get("latency_ms"))
                                   for r in rows if r.get("estimate")])
    if budget is not None:
        _error(budget)
        _exit1(budget.split(":")[0] + " (--max-ms)")
    if comparison is not None:
        if comparison.regressions:
            err.print(_line(f"{len(comparison.regressions)} finding(s) new or worse than the baseline {baseline}.",
                           style="bold red"), highlight=False)
            _exit1(f"{len(comparison.regressions)} finding(s) new or worse than the baseline {baseline} (--baseline)")
        return
    from .selection import counted

    if fail_on == FailOn.sw:
        sw = [r for r in rows if r.get("estimate") and counted(r) > 0]
        if sw:
            _exit1(f"{len(sw)} model(s) with estimated SW epochs (--fail-on sw)")
    if fail_on == FailOn.error:
        bad = [r for r in rows if any(f.get("severity") == "compile_error" for f in r.get("findings") or ())]
        if bad:
            _exit1(f"{len(bad)} model(s) with a predicted compile error (--fail-on error)")


class OutFormat(str, Enum):
    table = "table"
    json = "json"


@app.command("audit-merge", hidden=True)
def audit_merge_cmd(
    reports: List[str] = typer.Argument(..., help="JSON reports of nafix audit (e.g. one per --shard)."),
    fmt: Format = typer.Option(Format.json, "--format", "-f", help="Output format of the merged report."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help=OUTPUT_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also list performance notes (table format)."),
):
    """Join the JSON reports of `nafix audit --shard K/N ... --format json` into one report (`nafix audit merge`)."""
    from .zoo.merge import merge_reports

    inputs = [Path(r) for r in reports]
    try:
        target = _output_target(output, f"nafix-audit.{_EXT[fmt.value]}", force=force, protected=inputs)
        report, warnings = merge_reports(inputs)
    except NafixError as exc:
        _fail(exc)
    for w in warnings:
        err.print(_line(f"warning: {w}", style="yellow"), highlight=False)
    _render_audit(report, fmt, target, verbose, force=force, protected=inputs)
    errors = [r for r in report["models"] if r.get("error")]
    if errors:  # one line whatever the count, as `nafix audit` says it
        first = errors[0]["error"]
        _error(first if len(errors) == 1 else
               f"{len(errors)} of {len(report['models'])} models could not be analysed (see their rows); the first: {first}")
        raise typer.Exit(2)


def _render_audit(report: dict, fmt: "Format", output: Optional[Path], verbose: bool, *, force: bool,
                  protected) -> None:
    """The audit report (the JSON report's dict) in ``fmt``, on stdout or written to ``output``."""
    from .report import audit_markdown, audit_renderables
    from .selection import summary_line

    ignored = summary_line(report.get("selection"))
    if fmt == Format.json:
        _emit(escape.json_text(report, indent=2) + "\n", output, force=force, protected=protected)
    elif fmt == Format.markdown:
        _emit(audit_markdown(report) + (f"\n{escape.markdown(ignored)}\n" if ignored else ""), output, force=force,
              protected=protected)
    elif fmt == Format.model_explorer:  # Model Explorer's node-data overlay of the one model audited
        from .model_explorer import audit_overlay

        try:
            overlay = audit_overlay(report)
        except NafixError as exc:
            _fail(exc)
        _emit(escape.json_text(overlay, indent=1) + "\n", output, force=force, protected=protected)
    elif fmt in (Format.sarif, Format.github, Format.html, Format.concise):
        from .report_ci import concise_text, github_annotations, html_report, sarif_text

        render = {Format.sarif: sarif_text, Format.github: github_annotations, Format.html: html_report,
                  Format.concise: concise_text}[fmt]
        _emit(render(report), output, force=force, protected=protected)
        if fmt == Format.github and os.environ.get("GITHUB_STEP_SUMMARY"):
            _append_step_summary(report, os.environ["GITHUB_STEP_SUMMARY"])
    elif output is not None:
        extra = [_line(ignored)] if ignored else []
        _emit(_as_text(list(audit_renderables(report, verbose=verbose)) + extra), output, force=force,
              protected=protected)
    else:
        for r in audit_renderables(report, verbose=verbose):
            out.print(r)
        if ignored:
            out.print(_line(ignored, style="dim"), highlight=False)


def _select_findings(ctx, rows: list, select: tuple, ignore: tuple) -> list:
    """The rows with the findings --select-finding/--ignore-finding set aside (see fixer.selection).

    A value given on the command line applies to every model; else each model gets the config's
    value for its path (the top level, then the per-path tables)."""
    from .selection import apply_to_row, check_items

    cfg = _state.get("config")
    given = {n for n in ("select_finding", "ignore_finding")
             if getattr(ctx.get_parameter_source(n), "name", "") in ("COMMANDLINE", "ENVIRONMENT")}
    out = []
    for row in rows:
        sel, ign = select, ignore
        if cfg is not None and cfg.per_path:
            mine = cfg.for_model(row["path"])
            if "select_finding" not in given and "select-finding" in mine:
                sel = check_items(mine["select-finding"][0], mine["select-finding"][1])
            if "ignore_finding" not in given and "ignore-finding" in mine:
                ign = check_items(mine["ignore-finding"][0], mine["ignore-finding"][1])
        out.append(apply_to_row(row, sel, ign))
    from .selection import check_known

    for items, option, name in ((select, "--select-finding", "select_finding"),
                                (ignore, "--ignore-finding", "ignore_finding")):
        if name in given or cfg is None:
            check_known(items, out, option)
    if cfg is not None:  # the config's values too, each at its coordinate
        for key in ("select-finding", "ignore-finding"):
            for glob, table in [(None, cfg.values)] + list(cfg.per_path):
                if key in table:
                    check_known(table[key], out, cfg.where(key, glob))
    return out


def _append_step_summary(report: dict, path: str) -> None:
    """Append the zoo summary to the file GitHub names in $GITHUB_STEP_SUMMARY (GitHub expects appends)."""
    from .report_ci import step_summary_markdown

    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(step_summary_markdown(report))
    except OSError as exc:
        raise NafixError(f"$GITHUB_STEP_SUMMARY {path}: cannot be written ({exc.strerror or exc}).") from None


class _Progress:
    """A progress bar on stderr, only on a terminal: ``label``, done / total and, with ``failures``,
    the failures so far and the ETA. Redrawn on each update, with no refresh thread (audit workers
    may fork)."""

    def __init__(self, show: bool, label: str, *, failures: bool = False):
        self.show, self.label, self.failures = show, label, failures
        self.prog = None

    def __enter__(self):
        if not self.show:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        cols = [TextColumn(self.label), BarColumn(), MofNCompleteColumn()]
        if self.failures:
            cols += [TextColumn("{task.fields[failures]} failed"), TextColumn("ETA"), TimeRemainingColumn()]
        self.prog = Progress(*cols, console=err, transient=True, auto_refresh=False)
        self.prog.start()
        task = self.prog.add_task(self.label, total=None, failures=0)

        def update(done, total, failures=0):
            self.prog.update(task, completed=done, total=total, failures=failures)
            self.prog.refresh()

        return update

    def __exit__(self, *exc):
        if self.prog is not None:
            self.prog.stop()
        return False


@app.command("fix")
def fix_cmd(
    model: str = typer.Argument(..., help="The ONNX or TFLite model to fix (never modified)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Output model path (default: MODEL.nafix.onnx beside the input)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would change; write nothing."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Run only these rules (ids or names; repeatable). Opt-in rules run only when selected."),
    extend_select: Optional[List[str]] = typer.Option(None, "--extend-select", help="Add these rules to the default set (ids or names; repeatable), e.g. an opt-in rule."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Do not run these rules (repeatable)."),
    rules: Optional[List[str]] = typer.Option(None, "--rules", help="A folder of extra rule YAML files (repeatable)."),
    input_type: str = typer.Option("int8", "--input-type", help="Type of a graph input made integer by NAF005: int8 or uint8 (camera frames)."),
    inputs: Optional[str] = typer.Option(None, "--inputs", help="An .npz of inputs (arrays keyed by input name) for the equivalence gate."),
    keep_failed: bool = typer.Option(False, "--keep-failed", help="Write the model even when verification fails."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file that nafix did not write."),
    fail_on: FailOn = typer.Option(FailOn.error, "--fail-on", help="Exit 1 when the model left still has a finding that makes stedgeai fail (error, the default), also when SW epochs remain (sw), or never."),
    max_ms: Optional[float] = typer.Option(None, "--max-ms", callback=_positive_ms, help=MAX_MS_HELP.format(what="the model nafix leaves (the fixed one, else the input)")),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", "-f", help="Console output: table or the JSON report."),
    input_shape: Optional[List[str]] = typer.Option(None, "--input-shape", help=SHAPE_HELP),
    target_profile: Optional[str] = typer.Option(None, "--target-profile", help=TARGET_HELP),
    stedgeai_option: Optional[List[str]] = typer.Option(None, "--stedgeai-option", help=OPTION_HELP),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed (0 or more) of the random inputs used by the equivalence gate."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="List every remaining SW node."),
    compile_: bool = typer.Option(False, "--compile", help="Also compile the original and the fixed model with stedgeai and compare real epochs."),
    stedgeai: Optional[str] = typer.Option(None, "--stedgeai", help=STEDGEAI_HELP),
    profile: Optional[str] = typer.Option(None, "--profile", help="Neural-ART profile NAME@FILE.json for stedgeai (--st-neural-art) and the memory estimate."),
    compile_timeout: float = typer.Option(900.0, "--compile-timeout", callback=_positive_seconds, help="Seconds all stedgeai runs of this command may take together (--version, before, after)."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Keep stedgeai workspaces in this folder (default: temporary)."),
    quantize: bool = typer.Option(False, "--quantize", help="Re-quantize with onnxruntime for the NPU: float models, uint8 activations, float islands."),
    calib: Optional[str] = typer.Option(None, "--calib", help="Calibration data: a folder of .npz (one sample each), one .npz with a sample axis, or a folder of images."),
    calib_size: Optional[str] = typer.Option(None, "--calib-size", help="Images: resize to HxW (default: the model input's)."),
    calib_layout: str = typer.Option("auto", "--calib-layout", help="Images: nchw, nhwc or auto (from the input shape)."),
    calib_scale: float = typer.Option(1 / 255, "--calib-scale", help="Images: pixel scale before mean/std."),
    calib_mean: Optional[str] = typer.Option(None, "--calib-mean", help="Images: mean, one value or one per channel (e.g. 0.485,0.456,0.406)."),
    calib_std: Optional[str] = typer.Option(None, "--calib-std", help="Images: std, one value or one per channel."),
    calib_order: str = typer.Option("rgb", "--calib-channel-order", help="Images: rgb or bgr."),
    calib_samples: int = typer.Option(200, "--calib-samples", help="At most this many calibration samples."),
    calib_method: str = typer.Option("minmax", "--calib-method", help="onnxruntime calibration: minmax, entropy or percentile."),
    min_cosine: Optional[float] = typer.Option(None, "--min-cosine", min=0.0, max=1.0, help="With --quantize: fail (exit 1, nothing written unless --keep-failed) when an output's cosine against the original model is below this (default 0.9; 0 turns it off)."),
    core: Optional[str] = typer.Option(None, "--core", help=CORE_HELP),
    timeout: float = typer.Option(120.0, "--timeout", callback=_limit_seconds, help="Seconds each stage that runs onnxruntime or the TFLite interpreter (loading and shape inference, rewriting, each calibration sample, verification) may take before the fix is stopped, as audit's per-model limit (0 or inf: no limit; stedgeai has --compile-timeout)."),
    html: Optional[str] = typer.Option(None, "--html", help="Also write a self-contained HTML report: the estimated epochs before and after as colour strips, the changes and the verification (written with --dry-run too).", rich_help_panel="Reports"),
    annotate: bool = typer.Option(True, "--annotate/--no-annotate", help="Put each node's estimated placement and its reason into the written model's node metadata (nafix.placement, nafix.reason: Netron shows them).", rich_help_panel="Reports"),
):
    """Rewrite NPU-unfriendly patterns, prove the result computes the same, write MODEL.nafix.onnx."""
    from .deadline import run_bounded

    def work() -> int:
        try:
            _fix_work(model, output, dry_run, select, extend_select, ignore, rules, input_type, inputs, keep_failed,
                      force, fail_on, fmt, input_shape, target_profile, stedgeai_option, seed, verbose, compile_,
                      stedgeai, profile, compile_timeout, workdir, quantize, calib, calib_size, calib_layout,
                      calib_scale, calib_mean, calib_std, calib_order, calib_samples, calib_method, core, max_ms,
                      min_cosine, html=html, annotate=annotate)
        except typer.Exit as exc:  # the exit code goes back as a value (click's Exit does not pickle it)
            return exc.exit_code
        return 0

    try:  # the stages that run foreign code are bounded as audit bounds each model: in a child process
        code = run_bounded(work, limit=timeout, what=model, first_stage="loading and analysing the model")
    except NafixError as exc:
        _fail(exc)
    if code:
        raise typer.Exit(code)


def _fix_work(model, output, dry_run, select, extend_select, ignore, rules, input_type, inputs, keep_failed, force,
              fail_on, fmt, input_shape, target_profile, stedgeai_option, seed, verbose, compile_, stedgeai, profile,
              compile_timeout, workdir, quantize, calib, calib_size, calib_layout, calib_scale, calib_mean, calib_std,
              calib_order, calib_samples, calib_method, core, max_ms=None, min_cosine=None, html=None,
              annotate=True) -> None:
    """``nafix fix``'s work and output (exits with typer.Exit like a command)."""
    model = Path(model)
    from .api import FixOptions, fix
    from .stedgeai.compare import CompileOptions
    from .report import fix_renderables
    from .report_data import fix_dict

    try:
        copts = CompileOptions(stedgeai=stedgeai, profile=profile, timeout_s=compile_timeout,
                               workdir=str(workdir) if workdir else None,
                               extra_args=_stedgeai_args(stedgeai_option)) if compile_ else None
        opts = FixOptions(
            analysis=_analysis_options(target_profile, stedgeai_option, input_shape, None, profile, core),
            output=output, dry_run=dry_run, select=tuple(select or ()), ignore=tuple(ignore or ()),
            extend_select=tuple(extend_select or ()),
            rules_dirs=tuple(str(r) for r in rules or ()), input_type=input_type,
            inputs_npz=str(inputs) if inputs else None, keep_failed=keep_failed, force=force, seed=seed,
            compile=copts, quantize=quantize,
            calib=_calib_options(calib, calib_size, calib_layout, calib_scale, calib_mean, calib_std, calib_order,
                                 calib_samples, calib_method, seed) if quantize else None,
            annotate=annotate,
            min_cosine=min_cosine,
        )
        html_target = _fix_html_target(html, model, output, force, [inputs, calib])
        if calib and not quantize:
            from .errors import UsageError

            raise UsageError("--calib needs --quantize.")
        with _Progress(quantize and err.is_terminal, "calibrating") as on_calibration:
            result = fix(model, opts, on_compile_line=_stream_line if fmt == OutFormat.table else None,
                         on_calibration=on_calibration)
    except NafixError as exc:
        _fail(exc)
    except Exception as exc:  # noqa: BLE001 - a corrupt model is bad input; anything else is nafix's bug
        _invalid_model_or_raise(model, exc)
    if fmt == OutFormat.json:
        _stdout(escape.json_text(fix_dict(result), indent=2) + "\n")
    else:
        for r in fix_renderables(result, verbose=verbose):
            out.print(r)
    if html_target is not None:
        from .report_html import fix_page

        _emit(fix_page(result), html_target, force=force, protected=[model, *(Path(p) for p in (inputs, calib) if p)])
    if result.compiled is None and fmt == OutFormat.table:
        _mention_stedgeai(stedgeai)
    if not result.verified:
        _error(f"verification failed for rule(s) {', '.join(result.verification.rules)} "
               f"({result.verification.failure()}); "
               "nothing written" + (" (kept with --keep-failed)" if result.written else ""))
        _exit1(f"verification failed for rule(s) {', '.join(result.verification.rules)}")
    if result.accuracy_failure is not None:
        _error(result.accuracy_failure + ("; written anyway with --keep-failed and marked nafix.accuracy=NO"
                                          if result.written else "; nothing written" if result.dry_run
                                          else "; nothing written (--keep-failed writes it anyway)"))
        _exit1("an output of the quantized model is below --min-cosine")
    if result.regression is not None:  # the never-worse promise over the whole run (fixer.api._worse_than_input)
        _error(result.regression)
        _exit1("the fixed model is estimated worse than the input (nafix never makes a model worse)")
    if result.compiled is not None and not result.compiled.improved:
        err.print("[bold red]error:[/] the real HW-epoch ratio measured by stedgeai did not increase.", highlight=False)
        _exit1("the real HW-epoch ratio measured by stedgeai did not increase (--compile)")
    errors = result.compile_errors if fail_on != FailOn.never else []
    if errors:
        which = "the written model" if result.written else "the model"
        _error(f"{which} still has {len(errors)} finding(s) that make stedgeai fail: "
               + "; ".join(f"{r.constraint} ({r.detail})" for r in errors) + " (--fail-on never exits 0 anyway)")
        _exit1(f"{which} still has {len(errors)} predicted compile error(s) (--fail-on {fail_on.value})")
    if fail_on == FailOn.sw and result.final.estimate.sw_epochs > 0:
        _exit1(f"{result.final.estimate.sw_epochs} estimated SW epoch(s) remain (--fail-on sw)")
    budget = _over_budget(max_ms, [(Path(model).name, result.final.estimate.latency_ms)])
    if budget is not None:
        _error(budget)
        _exit1(budget.split(":")[0] + " (--max-ms)")



def _fix_html_target(html: Optional[str], model: Path, output: Optional[str], force: bool, inputs) -> Optional[Path]:
    """Where --html writes (a folder gets MODEL.nafix.html), checked before any work: never an
    input, nor the model, JSON report or header the fix writes."""
    if html is None:
        return None
    from .api import default_outputs

    protected = [model, *(Path(p) for p in inputs if p)]
    target = _output_target(html, model.stem + ".nafix.html", force=force, protected=protected)
    names = ("the fixed model (-o)", "the JSON report", "the C header")
    _distinct_outputs(*zip(names, default_outputs(model, output)), ("--html", target))
    return target


def _invalid_model_or_raise(model: Path, exc: Exception) -> None:
    """An unexpected failure on a model the onnx checker rejects is that model's fault: one error line,
    exit 2. On a valid model it stays an internal error (re-raised)."""
    from .model_io import invalid_model_error

    if _state["debug"]:
        raise exc
    invalid = invalid_model_error(model, exc)
    if invalid is None:
        raise exc
    _fail(invalid)


def _floats(text: Optional[str], what: str):
    from .errors import UsageError

    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise UsageError(f"{what} '{text}' must be numbers separated by commas.") from None


def _calib_options(path, size, layout, scale, mean, std, order, samples, method, seed):
    from .errors import UsageError
    from .quantize import CalibrationOptions

    hw = None
    if size:
        try:
            hw = tuple(int(v) for v in size.lower().replace(",", "x").split("x"))
        except ValueError:
            raise UsageError(f"--calib-size '{size}' must be HxW, e.g. 224x224.") from None
    return CalibrationOptions(path=path, image_size=hw, layout=layout, scale=scale, mean=_floats(mean, "--calib-mean"),
                              std=_floats(std, "--calib-std"), channel_order=order, max_samples=samples,
                              method=method, seed=seed)


def _stream_line(label: str, line: str) -> None:
    """One line of stedgeai's output, printed as plain text (it may hold '[...]', never Rich markup)."""
    err.print(Text.assemble((escape.terminal(f"stedgeai ({label}):"), "dim"), " ", escape.terminal(line)), highlight=False)


def _mention_stedgeai(explicit: Optional[str]) -> None:
    """A clear note, not a failure, about the real compiler when --compile was not asked for."""
    from .stedgeai import find_stedgeai

    try:
        tool = find_stedgeai(explicit)
    except NafixError as exc:
        err.print(_line(f"note: {exc.message}"), highlight=False)
        return
    if tool is None:
        err.print("note: stedgeai not found (--stedgeai, STEDGEAI_CORE_DIR or PATH): figures above are nafix "
                  "estimates only.", style="dim", highlight=False)
    else:
        err.print(_line(f"note: stedgeai found at {tool}; add --compile to measure real epochs before and after.",
                        style="dim"), highlight=False)


@app.command("compile")
def compile_cmd(
    model: str = typer.Argument(..., help="The ONNX or TFLite model to compile (stedgeai reads .tflite natively)."),
    stedgeai: Optional[str] = typer.Option(None, "--stedgeai", help=STEDGEAI_HELP),
    profile: Optional[str] = typer.Option(None, "--profile", help="Neural-ART profile NAME@FILE.json (--st-neural-art)."),
    timeout: float = typer.Option(900.0, "--timeout", callback=_positive_seconds, help="Seconds stedgeai may take (--version and generate together)."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Keep the stedgeai workspace in this folder (default: temporary)."),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", "-f", help="Console output: table or JSON."),
    input_shape: Optional[List[str]] = typer.Option(None, "--input-shape", help=SHAPE_HELP),
    output: Optional[str] = typer.Option(None, "--output", "-o", help=OUTPUT_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    stedgeai_option: Optional[List[str]] = typer.Option(None, "--stedgeai-option", help=OPTION_HELP),
    core: Optional[str] = typer.Option(None, "--core", help=CORE_HELP + " Default: the installed stedgeai's version."),
):
    """Compile MODEL with the real stedgeai and compare its epochs with nafix's estimate."""
    model = Path(model)
    from .api import AnalysisOptions, analyze_path, resolve_pools
    from .stedgeai.compare import CompileOptions, compile_model, locate_stedgeai, spend_timeout
    from .model_io import parse_input_shapes
    from .report import compile_renderables

    try:
        target = _output_target(output, f"{model.stem}.compile.{_EXT[fmt.value]}", force=force, protected=[model])
        copts = CompileOptions(stedgeai=stedgeai, profile=profile, timeout_s=timeout,
                               workdir=str(workdir) if workdir else None, extra_args=_stedgeai_args(stedgeai_option))
        import time

        started = time.monotonic()
        tool, version = locate_stedgeai(copts, required=True)
        copts = spend_timeout(copts, time.monotonic() - started)  # --version and generate share --timeout
        from .calibrate import core_of
        from .npu.profile import normalize_options

        aopts = AnalysisOptions(input_shapes=parse_input_shapes(input_shape), neural_art_profile=profile,
                                stedgeai_options=normalize_options(stedgeai_option or ()),
                                core=core or core_of(version) or None)
        analysis = analyze_path(model, aopts, pools=resolve_pools(aopts))
        if not analysis.memory.fits_on_chip:
            err.print(f"warning: estimated peak activations {analysis.memory.peak_activation_bytes / 1024:,.0f} KiB "
                      f"exceed the on-chip pools ({analysis.memory.onchip_bytes / 1024:,.0f} KiB); expect external "
                      "RAM use or 'left unallocated' errors.", style="yellow", highlight=False)
        compiled = compile_model(model, model.stem, copts, tool, analysis=analysis,
                                 on_line=(lambda line: _stream_line(model.stem, line)) if fmt == OutFormat.table else None)
    except NafixError as exc:
        _fail(exc)
    except Exception as exc:  # noqa: BLE001 - a corrupt model is bad input; anything else is nafix's bug
        _invalid_model_or_raise(model, exc)
    if fmt == OutFormat.json:
        _emit(escape.json_text({"nafix_version": __version__,
                          "stedgeai": {"tool": str(tool), "version": version, "model": str(model), **compiled.summary()},
                          "estimate": analysis.estimate.as_dict(), "estimated": True}, indent=2) + "\n",
              target, force=force, protected=[model])
    elif target is not None:
        _emit(_as_text(compile_renderables(compiled, version, analysis)), target, force=force, protected=[model])
    else:
        for r in compile_renderables(compiled, version, analysis):
            out.print(r)
    if not compiled.result.ok:
        _exit1(f"stedgeai failed to compile {model.name}")
    if compiled.result.report is None:  # exit 0 only with a measurement
        why = next((p for p in compiled.result.problems if "report" in p.lower()), "no report was read")
        _error(f"stedgeai exited with code 0 but nafix has no report to measure {model} with: {why.rstrip('.')}.")
        _exit1(f"no stedgeai report to measure {model.name} with")


@app.command("calibrate")
def calibrate_cmd(
    pairs_dir: Optional[Path] = typer.Argument(None, help="A folder of pair folders, each with a model and its stedgeai report(s)."),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", "-f", help="Console output: table or JSON."),
    target_profile: Optional[str] = typer.Option(None, "--target-profile", help=TARGET_HELP),
    times: Optional[Path] = typer.Option(
        None, "--times", help="A CSV of published measured times (columns model_file, inference_ms, core_version), or "
        "a folder holding published_times.csv: compare nafix's estimated time with them instead of the epochs."),
):
    """Compare nafix's estimate with real stedgeai reports: per report, the core version and options it
    states, real vs estimated epochs, SW and hybrid epochs, and the SW/hybrid op names that differ.
    With --times: estimated vs published inference time per model, and a summary line."""
    from .calibrate import calibrate, calibration_table, summary
    from .errors import UsageError

    if times is not None:
        from .latency_calibration import calibrate_times, times_summary, times_table

        if pairs_dir is not None:
            _fail(UsageError("give either a pairs folder or --times FILE.csv, not both."))
        try:
            trows = calibrate_times(times / "published_times.csv" if times.is_dir() else times,
                                    target_profile=target_profile)
        except NafixError as exc:
            _fail(exc)
        _calibration_out(fmt, times_summary(trows), trows, times_table)
        return
    if pairs_dir is None:
        _fail(UsageError("give a folder of (model, report) pairs, or --times FILE.csv."))
    try:
        rows = calibrate(pairs_dir, target_profile=target_profile)
    except NafixError as exc:
        _fail(exc)
    _calibration_out(fmt, summary(rows), rows, calibration_table)


def _calibration_out(fmt: "OutFormat", summary: dict, rows: list, table) -> None:
    """A calibration's rows on stdout: JSON (its summary and rows, estimated), or ``table(rows)``."""
    if fmt == OutFormat.json:
        _stdout(escape.json_text({"estimated": True, "summary": summary, "rows": [r.as_dict() for r in rows]},
                                 indent=2) + "\n")
    else:
        _stdout(table(rows))


@app.command("explain")
def explain_cmd(
    path: str = typer.Argument(..., help="A stedgeai/atonn log or report file ('-' reads standard input)."),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", "-f", help="Console output: table or JSON."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help=OUTPUT_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
):
    """Explain the known compiler errors and warnings in a stedgeai log or report, with the fix."""
    path = Path(path)
    from .stedgeai import explain, parse_report

    stdin = str(path) == "-"
    try:
        protected = [] if stdin else [path]
        name = "stdin" if stdin else path.name
        target = _output_target(output, f"{name}.explain.{_EXT[fmt.value]}", force=force, protected=protected)
        text = sys.stdin.read() if stdin else _read_text_input(path, "stedgeai log or report")
    except NafixError as exc:
        _fail(exc)
    from .stedgeai import MalformedReport

    found = explain(text)
    unreadable = None
    try:
        report = parse_report(text, source=str(path))
    except MalformedReport as exc:  # a report claiming what it cannot hold: say so, explain the log lines
        report, unreadable = None, exc.message
    except Exception:  # noqa: BLE001 - not a report nafix can read: explain the log lines only
        report = None
    if fmt == OutFormat.json:
        data = {"nafix_version": __version__,
                "known_errors": [{"code": k.code, "cause": k.cause, "fix": _fix_text(k), "evidence": k.evidence_line,
                                  "details": dict(k.details), "tag": k.tag} for k in found]}
        if unreadable is not None:
            data["report_error"] = unreadable
        if report is not None:
            data["report"] = {"version": report.version, "epochs": report.epochs, "sw_epochs": report.sw_epochs,
                              "hybrid_epochs": report.hybrid_epochs, "hw_ratio": round(report.hw_ratio, 4),
                              "sw_ops": list(report.sw_ops)}
        _emit(escape.json_text(data, indent=2, default=str) + "\n", target, force=force, protected=protected)
        return
    lines: list[Text] = []
    if unreadable is not None:
        lines.append(Text(f"report not read: {unreadable}"))
    if report is not None:
        lines.append(_line(f"stedgeai {report.version or '?'} report: {report.epochs} epochs, {report.sw_epochs} SW, "
                          f"{report.hybrid_epochs if report.hybrid_epochs is not None else 'n/a'} hybrid, "
                          f"HW ratio {report.hw_ratio:.1%} (measured)"))
        if report.sw_ops:
            from collections import Counter

            lines.append(_line("SW epochs: " + ", ".join(f"{op} x{n}" for op, n in Counter(report.sw_ops).most_common())))
    if not found:
        lines.append(Text("no known error or warning recognised."))
    for k in found:
        lines.append(Text.assemble((escape.terminal(k.code), "bold"), escape.terminal(f": {k.cause} [{k.tag}]")))
        lines.append(_line(f"  evidence: {k.evidence_line.strip()}"))
        lines.append(_line(f"  fix: {_fix_text(k)}"))
    if target is not None:
        _emit(_as_text(lines), target, force=force, protected=protected)
        return
    for line in lines:
        out.print(line, highlight=False)


@app.command("config")
def config_cmd(
    path: Optional[str] = typer.Argument(None, help="A model (its per-path values apply) or a folder to search the config from (default: the current folder)."),
    command: str = typer.Option("audit", "--command", help="Show the options of this command (audit, fix, compile, ...)."),
):
    """Print the effective configuration and where each value comes from (file:key or default)."""
    from . import config

    commands = getattr(_command(), "commands", {})
    sub = commands.get(command)
    if sub is None or command == "config":
        _error(f"--command {command}: not a nafix command (one of {', '.join(n for n in commands if n != 'config')}).")
        raise typer.Exit(2)
    try:
        start = Path(path) if path is not None else None
        if start is not None and not start.exists():
            raise NafixError(f"{path}: no such file or folder.")
        cfg = config.load(config.options_of(commands.values()), start)
    except NafixError as exc:
        _fail(exc)
    values = cfg.for_model(path if path is not None and Path(path).is_file() else None)
    lines = [f"# config: {cfg.file if cfg.file is not None else 'none found (defaults only)'}",
             f"# command: {command}; CLI flags override every value below"]
    for p in sub.params:
        longs = [o for o in getattr(p, "opts", ()) if o.startswith("--")]
        if not longs or p.param_type_name != "option" or longs[0][2:] in config.NOT_IN_FILE:
            continue
        key = longs[0][2:]
        if key in values:
            value, source = values[key]
        else:
            value, source = p.default, "default"
            value = getattr(value, "value", value)
        lines.append(f"{key} = {value!r}  # {source}")
    _stdout("\n".join(lines) + "\n")


def _read_text_input(path: Path, what: str) -> str:
    """Read a text input file, or raise one InputError sentence (missing, a folder, a FIFO, unreadable)."""
    from .errors import InputError
    from .fsutil import decode_text
    from .model_io import open_input

    with open_input(path, f"{what} file") as fh:
        try:
            return decode_text(fh.read(), errors="replace")
        except OSError as exc:
            raise InputError(f"{path}: cannot be read ({exc.strerror or exc}).") from None


def _fix_text(k) -> str:
    """A known error's fix, naming the nafix rule and option that address it."""
    extra = []
    if k.details.get("rule"):
        extra.append(f"nafix rule {k.details['rule']}")
    if k.details.get("option"):
        extra.append(f"nafix {k.details['option']}")
    if k.details.get("alternative_rule"):
        extra.append(f"or rule {k.details['alternative_rule']}")
    return k.fix + (f" ({', '.join(extra)})" if extra else "")


@app.command("rules")
def rules_cmd(
    rule_id: Optional[str] = typer.Argument(None, help="Explain one rule (id or name)."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown: the rules reference (docs/RULES.md), or with a rule ID its section (a terminal otherwise gets it rendered; a pipe gets Markdown anyway)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="With --markdown: write to this file (a folder: RULES.md inside)."),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    rules: Optional[List[str]] = typer.Option(None, "--rules", help="A folder of extra rule YAML files (repeatable)."),
):
    """List the rewrite rules, explain one, or write the rules reference."""
    from .report import rule_markdown
    from .rules import load_rules

    try:
        if output is not None and not markdown:
            from .errors import UsageError

            raise UsageError("-o/--output writes the rules reference: it needs --markdown.")
        target = _output_target(output, "RULES.md", force=force, protected=rules or ())
        loaded = load_rules(tuple(rules or ()))
        if markdown and not rule_id:
            _emit(rule_markdown(loaded), target, force=force, protected=rules or ())
            return
        if rule_id:
            match = [r for r in loaded if r.id == rule_id.upper() or r.name == rule_id]
            if not match:
                from .errors import UsageError
                from .rules import _suggest

                raise UsageError(f"unknown rule '{rule_id}'{_suggest(rule_id, [r.id for r in loaded] + [r.name for r in loaded])}.")
            full = rule_markdown(match)
            head = f"## {match[0].id} "
            text = full[full.index(head):] if head in full else full.split("\n", 10)[-1]  # the rule's section
            if markdown or not out.is_terminal:  # Markdown for a pipe, a file or --markdown
                _emit(text, target, force=force, protected=rules or ())
            else:  # rendered for a terminal (headings, bold, lists), never re-read as Rich markup
                from rich.markdown import Markdown

                out.print(Markdown(text, hyperlinks=False), highlight=False, soft_wrap=False)
            return
    except NafixError as exc:
        _fail(exc)
    from rich.table import Table

    from .engine import GUARANTEE
    from .report import SELECTION_TEXT

    t = Table(title="nafix rules", expand=False, caption=Text(f"{SELECTION_TEXT} {GUARANTEE}".replace("`", "")))
    t.add_column("id")
    t.add_column("name")
    t.add_column("summary", overflow="fold")
    t.add_column("verify")
    for r in loaded:
        t.add_row(_line(r.id), _line(r.name + (" (opt-in)" if r.opt_in else "")), _line(r.summary),
                  _line(r.verify.describe()))
    out.print(t)


def _output_target(output: Optional[str], default_name: str, *, force: bool, protected=()) -> Optional[Path]:
    """Where -o writes (a folder gets ``default_name``), checked before any work is done."""
    if output is None:
        return None
    from .outputs import REPORT, check_output, resolve_output

    _check_cwd(output)
    target = resolve_output(output, default_name)
    check_output(target, kind=REPORT, force=force, protected=protected, what="report")
    return target


def _check_cwd(path: str) -> None:
    """A relative output path needs a current folder: one that was deleted (or cannot be read) is one
    clear error, not a ``FileNotFoundError`` from ``os.getcwd``."""
    from .errors import OutputError

    if os.path.isabs(path):
        return
    try:
        os.getcwd()
    except OSError as exc:
        raise OutputError(f"{path}: the current folder no longer exists ({exc.strerror or exc}), so this relative "
                          "output path has no place; change to an existing folder or give an absolute path.") from None


def _file_identity(p: Path) -> tuple:
    """What makes two output paths the same file: the inode of an existing file (hard links too),
    else the absolute path with symbolic links resolved."""
    try:
        st = os.stat(p)
        return ("inode", st.st_dev, st.st_ino)
    except (OSError, ValueError):
        pass
    try:
        return ("path", os.path.normcase(str(p.resolve())))
    except (OSError, RuntimeError, ValueError):
        return ("path", os.path.normcase(os.path.abspath(p)))


def _distinct_outputs(*named: tuple[str, Optional[Path]]) -> None:
    """Refuse two outputs of one command that name the same file (one would silently replace the
    other): one UsageError naming both options."""
    from .errors import UsageError

    seen: dict[tuple, tuple[str, Path]] = {}
    for option, p in named:
        if p is None:
            continue
        key = _file_identity(p)
        if key in seen:
            other, q = seen[key]
            same = f"{q}" if str(q) == str(p) else f"{q} and {p}"
            raise UsageError(f"{other} and {option} both name {same}; the second would replace the first: "
                             "give each output its own file.")
        seen[key] = (option, p)


def _as_text(renderables) -> str:
    """Rich renderables as plain text for a file, marked as nafix's (so a rerun may replace it)."""
    from .outputs import text_mark

    rec = Console(record=True, width=160, file=io.StringIO(), soft_wrap=True)
    for r in renderables:
        rec.print(r)
    return text_mark() + "\n" + rec.export_text()


def _emit(text: str, output: Optional[Path], *, force: bool = False, protected=()) -> None:
    """``text`` on stdout, or written to ``output`` through :mod:`fixer.outputs`."""
    if output is None:
        _stdout(text)
        return
    from .outputs import REPORT, write_output

    try:
        write_output(output, text, kind=REPORT, force=force, protected=protected, what="report")
    except NafixError as exc:
        _fail(exc)
    err.print(_line(f"wrote {output}"), highlight=False)


def _click_exceptions():
    """click's exception classes (typer vendors click in recent releases)."""
    try:
        from typer._click import exceptions as ce  # typer >= 0.2x vendors click
    except ImportError:  # pragma: no cover - older typer depends on click
        from click import exceptions as ce
    return ce


def _usage_line(exc) -> str:
    """click's usage error as one sentence plus where the help is (not its multi-line usage block)."""
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None and getattr(ctx, "command_path", None) else "nafix"
    message = " ".join(exc.format_message().split())
    return f"{message.rstrip('.')}; see '{where} --help'."


def main(argv: Optional[list[str]] = None) -> None:
    """Console entry point: ``nafix model.onnx`` is ``nafix fix model.onnx``.

    Every way out is one of: 0/1 (the command's result), 2 with one ``error:`` line (bad input or
    usage, including click's usage errors), 130 on Ctrl-C, 143 on SIGTERM, 3 for a nafix bug.
    """
    from .outputs import install_sigterm_cleanup

    args = list(sys.argv[1:] if argv is None else argv)
    pos = [i for i, a in enumerate(args) if not a.startswith("-")]
    if len(pos) >= 2 and args[pos[0]] == "audit" and args[pos[1]] == "merge":  # `nafix audit merge ...`
        args[pos[0]:pos[1] + 1] = ["audit-merge"]
    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    first = next((a for a in args if not a.startswith("-")), None)
    if first is not None and first not in commands and "fix" in commands:
        idx = args.index(first)
        args.insert(idx, "fix")
    install_sigterm_cleanup()
    if not _state.get("drain"):
        import atexit

        atexit.register(_drain_stdout)
        _state["drain"] = True
    for stream in (sys.stdout, sys.stderr):  # a non-UTF-8 terminal or pipe must not turn a file name into a crash
        try:
            stream.reconfigure(errors="backslashreplace")
        except Exception:  # noqa: BLE001 - not a TextIOWrapper (tests, embedding): leave it
            pass
    real_stdout = sys.stdout
    sys.stdout = _GuardedStdout(real_stdout)
    try:
        _main(args)
    finally:
        sys.stdout = real_stdout


def _command():
    """The click group of ``app``, built once per process, its values coerced without Pydantic
    (see :mod:`fixer.cli_coerce`)."""
    group = _state.get("command")
    if group is None:
        from .cli_coerce import install

        group = _state["command"] = typer.main.get_command(app)
        install(group)
        _tidy_help(group)
    return group


#: option groups of the help pages (typer's rich_help_panel), by command and parameter name; an option
#: not listed stays under "Options"
HELP_PANELS = {
    "fix": {
        "Output": ("output", "dry_run", "force", "keep_failed", "fmt", "verbose"),
        "Rules": ("select", "extend_select", "ignore", "rules", "input_type"),
        "Verification and exit code": ("inputs", "seed", "timeout", "fail_on", "max_ms"),
        "Target and build options": ("input_shape", "target_profile", "stedgeai_option", "core", "profile"),
        "Compile with stedgeai (--compile)": ("compile_", "stedgeai", "compile_timeout", "workdir"),
        "Quantize (--quantize)": ("quantize", "calib", "calib_size", "calib_layout", "calib_scale", "calib_mean",
                                  "calib_std", "calib_order", "calib_samples", "calib_method"),
    },
    "audit": {
        "Output": ("fmt", "output", "force", "verbose"),
        "Findings and exit code": ("fail_on", "max_ms", "select_finding", "ignore_finding", "baseline",
                                   "write_baseline"),
        "Target and build options": ("input_shape", "target_profile", "stedgeai_option", "core", "mpool", "profile"),
        "Many models": ("jobs", "timeout", "cache_dir", "no_cache", "shard", "executor"),
    },
}


def _tidy_help(group) -> None:
    """The help pages as nafix means them: a flag shows no value placeholder (typer prints
    ``<bool>``), and help texts are text, not Rich markup (``'nafix[dask]'`` keeps its ``[dask]``)."""
    from rich.markup import escape as rich_escape

    rich = getattr(app, "rich_markup_mode", None) == "rich"
    stack = [group]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        if rich and getattr(cmd, "help", None):
            cmd.help = rich_escape(cmd.help)
        if rich and getattr(cmd, "short_help", None):
            cmd.short_help = rich_escape(cmd.short_help)
        params = list(getattr(cmd, "params", ()))
        panels = {n: panel for panel, names in HELP_PANELS.get(getattr(cmd, "name", ""), {}).items() for n in names}
        for p in params:
            if p.name in panels and getattr(p, "rich_help_panel", None) is None:
                p.rich_help_panel = panels[p.name]
        helper = getattr(cmd, "_help_option", None)  # built by fixer.cli_coerce.install
        if helper is not None:
            params.append(helper)
        for p in params:
            if getattr(p, "is_flag", False) and getattr(p, "metavar", None) is None:
                p.metavar = ""
            if rich and getattr(p, "help", None):
                p.help = rich_escape(p.help)


def _config_defaults(args: list[str]) -> dict:
    """The project config (pyproject.toml [tool.nafix] or nafix.toml) as click's default_map.

    Per-path tables apply to the model of the command line: the one model of fix/compile/explain,
    or audit's models when they all get the same values (else audit groups them, see audit_cmd)."""
    from . import config

    group = _command()
    commands = getattr(group, "commands", {})
    _state.pop("config", None)  # this run's config only (main() may run again in one process)
    cfg = config.load(config.options_of(commands.values()))
    if cfg.file is None:
        return {}
    _state["config"] = cfg
    name = next((a for a in args if a in commands), None)
    model = None
    if name is not None and name != "config":
        sub = commands[name]
        rest = args[args.index(name) + 1:]
        try:
            ctx = sub.make_context(name, list(rest), resilient_parsing=True)
            given = ctx.params.get("model") or ctx.params.get("paths")
        except Exception:  # noqa: BLE001 - the real parse reports usage errors
            given = None
        if isinstance(given, (list, tuple)):
            files = _audit_files(given)
            distinct = {repr(sorted(cfg.for_model(f).items())) for f in files}
            model = files[0] if files and len(distinct) == 1 else None
        elif given:
            model = given
    return {n: config.default_map(cfg, c, model) for n, c in commands.items()}


def _per_path_groups(paths: list, values: dict) -> list:
    """audit's models grouped by their per-path config values: [(paths, values)], one group when they agree.

    A value given on the command line wins over every per-path table (it is not regrouped)."""
    from . import config

    cfg = _state.get("config")
    if cfg is None or not cfg.per_path or len(paths) < 2:
        return [(paths, values)]
    ctx = _state.get("audit_ctx")
    given = {n for n in values if ctx is not None and getattr(ctx.get_parameter_source(n), "name", "") in
             ("COMMANDLINE", "ENVIRONMENT")}
    names = {o.name: o.key for o in config.options_of([ctx.command]).values()} if ctx is not None else {}
    groups: dict[str, tuple[list, dict]] = {}
    for f in _audit_files(paths):
        mine = dict(values)
        for name in values:
            if name not in given and names.get(name) in cfg.for_model(f):
                mine[name] = cfg.for_model(f)[names[name]][0]
        groups.setdefault(repr(sorted(mine.items())), ([], mine))[0].append(str(f))
    if len(groups) < 2:
        return [(paths, values)]
    return list(groups.values())


def _audit_files(paths) -> list:
    from .options import collect_models  # light: a run answered from the cache imports no analysis

    try:
        return collect_models([p for p in paths if Path(p).exists()])
    except OSError:
        return []


def _main(args: list[str]) -> None:
    ce = _click_exceptions()
    no_args = getattr(ce, "NoArgsIsHelpError", None)
    try:
        try:
            defaults = _config_defaults(args)
        except NafixError as exc:
            _error(exc.message)
            sys.exit(exc.exit_code)
        code = _command()(args=args, prog_name="nafix", standalone_mode=False, default_map=defaults)
    except NafixError as exc:  # pragma: no cover - commands catch their own
        _error(exc.message)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        err.print("interrupted", highlight=False)
        sys.exit(130)
    except ce.ClickException as exc:
        if no_args is not None and isinstance(exc, no_args):
            # the error built the help page already: typer's rich help printed it (the message is
            # then ''), a plain one is the message; never ask for it again (that printed it twice)
            text = exc.format_message()
            if text:
                err.print(text, markup=False, highlight=False)
            sys.exit(2)
        if isinstance(exc, ce.UsageError):
            _error(_usage_line(exc))
            sys.exit(2)
        _error(" ".join(exc.format_message().split()))
        sys.exit(getattr(exc, "exit_code", 2) or 2)
    except SystemExit:
        raise
    except BrokenPipeError:  # a write to stdout nafix did not route through _stdout/_Console
        _stdout_to_devnull()
        sys.exit(1)
    except MemoryError:
        if _state["debug"]:
            raise
        _error("nafix ran out of memory (a very large model or input, or a size option far too big); "
               "check the sizes given, or run on a machine with more memory.")
        sys.exit(2)
    except _StdoutError as exc:  # e.g. --help on a full disk: not a nafix bug
        _error(_stdout_failed(exc).message)
        sys.exit(2)
    except Exception:
        if _state["debug"]:
            raise
        err.print("[bold red]error:[/] internal error in nafix; rerun with --debug for the traceback.")
        sys.exit(3)
    if code == 130:  # typer turns a Ctrl-C inside a command into exit code 130, silently
        err.print("interrupted", highlight=False)
    code = code if isinstance(code, int) else 0
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
    except OSError as exc:  # buffered output that a full disk cannot take (`nafix audit ... > /dev/full`)
        failed = _stdout_failed(exc)
        if code in (0, 1):  # else the command has already printed its error line
            _error(failed.message)
            code = failed.exit_code
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
