"""Running ``stedgeai generate --target stm32n6 --st-neural-art`` (:func:`run_generate`): without a
shell, streaming every log line, with a workspace and a timeout, then parsing the results.
"""

from __future__ import annotations

import io
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, ToolError, UsageError
from ..fsutil import is_regular, read_text
from .explain import KnownError, explain
from .reports import CInfo, EpochCsv, StedgeaiReport, load_c_info, load_report, parse_epoch_csv, parse_report

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileResult:
    """The outcome of one ``stedgeai generate`` run.

    ``ok`` is True when stedgeai exited with code 0. ``known_errors`` is filled on success too
    (warnings such as 'is not quantized' appear in successful logs). ``problems`` lists
    sentences about results that could not be read (a missing report, a malformed c_info).
    """

    ok: bool
    returncode: int
    command: tuple[str, ...]
    log: str
    duration_s: float
    output_dir: Path
    workspace_dir: Path
    report: StedgeaiReport | None = None
    report_path: Path | None = None
    c_info: CInfo | None = None
    c_info_path: Path | None = None
    epoch_csv: EpochCsv | None = None
    epoch_csv_path: Path | None = None
    known_errors: tuple[KnownError, ...] = ()
    problems: tuple[str, ...] = ()


def _generate_command(
    tool: Path, model: Path, output_dir: Path, workspace_dir: Path, profile: str | None,
    extra_args: Sequence[str],
) -> list[str]:
    # Option names as printed on the "Parameters" line of real reports:
    #   generate -m MODEL --target stm32n6 --st-neural-art [NAME@FILE.json] --output DIR --workspace DIR
    # stedgeai itself passes "--output-info-file c_info.json" to atonn and writes
    # network_c_info.json to the output folder, so no option is needed for it.
    command = [str(tool), "generate", "-m", str(model), "--target", "stm32n6", "--st-neural-art"]
    if profile:
        command.append(profile)
    command += ["--output", str(output_dir), "--workspace", str(workspace_dir)]
    command += [str(arg) for arg in extra_args]
    return command


#: Seconds the output pipes may stay open after stedgeai exited (its last lines are still being
#: read); past this, what keeps them open is a process stedgeai started and left behind.
_DRAIN_S = 2.0


def _kill_process_tree(process: subprocess.Popen[str]) -> None:
    """Stop the process and everything it started (atonn runs as a child of stedgeai), also when
    stedgeai itself has exited and only what it started is left: they share its process group
    (its own session), whose id stays reserved while any member lives."""
    try:
        if os.name == "posix":
            os.killpg(process.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows
            subprocess.run(
                ["taskkill", "/F", "/T", "/PID", str(process.pid)], capture_output=True, check=False
            )
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.kill()
    except OSError:
        pass


def _pump(stream: io.TextIOBase, lines: queue.Queue[str | None]) -> None:
    try:
        for line in stream:
            lines.put(line.rstrip("\r\n"))
    except (OSError, ValueError):
        pass
    finally:
        lines.put(None)


def _find_first(folders: Sequence[Path], patterns: Sequence[str]) -> Path | None:
    for pattern in patterns:
        for folder in folders:
            if not folder.is_dir():
                continue
            # regular files only: a FIFO named *.csv in the workspace would block the read for ever
            hits = sorted((p for p in folder.rglob(pattern) if is_regular(p)), key=lambda p: (len(p.parts), str(p)))
            if hits:
                return hits[0]
    return None


def run_generate(
    *,
    tool: Path,
    model: Path,
    workdir: Path,
    profile: str | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = 900,
    on_line: Callable[[str], None] | None = None,
    env: Mapping[str, str] | None = None,
    temporary_workdir: bool = False,
) -> CompileResult:
    """Compile ``model`` with ``stedgeai generate --target stm32n6 --st-neural-art [profile]``.

    Outputs go to ``workdir/output`` and ``workdir/workspace``; the process runs with ``workdir``
    as its current folder, so nothing is written next to the model. Every stdout/stderr line is
    passed to ``on_line`` as it arrives. ``profile`` is ``NAME@FILE.json`` or None for ST's
    default; ``extra_args`` are appended verbatim; ``env`` replaces the environment.
    ``temporary_workdir``: the caller removes ``workdir`` afterwards, so a timeout message does not
    point the user at it.

    Returns a CompileResult; ``ok=False`` with the log and the recognised known errors when
    stedgeai fails. Raises ToolError when stedgeai cannot be started or does not finish within
    ``timeout_s`` seconds (the whole process group is killed first), InputError when the model
    does not exist, and UsageError when ``workdir`` is the model's own folder.
    """
    tool = Path(tool)
    if tool.exists():
        tool = tool.absolute()  # the process runs in workdir, so a relative path would break
    model = Path(model)
    workdir = Path(workdir)
    if not model.is_file():
        raise InputError(f"The model {model} does not exist or is not a file.")
    if workdir.exists() and not workdir.is_dir():
        raise UsageError(f"The work folder {workdir} exists and is not a folder.")
    if workdir.resolve() == model.resolve().parent:
        raise UsageError(
            f"The work folder {workdir} is the model's own folder; give a separate folder so "
            "stedgeai writes nothing next to the model."
        )
    if timeout_s <= 0:
        raise UsageError(f"The stedgeai timeout must be positive, got {timeout_s:g} s.")
    output_dir = workdir / "output"
    workspace_dir = workdir / "workspace"
    output_dir.mkdir(parents=True, exist_ok=True)
    workspace_dir.mkdir(parents=True, exist_ok=True)
    command = _generate_command(
        tool, model.resolve(), output_dir.resolve(), workspace_dir.resolve(), profile, extra_args
    )
    log.info("running: %s", subprocess.list2cmdline(command))

    popen_kwargs: dict[str, Any] = {}
    if os.name == "posix":
        popen_kwargs["start_new_session"] = True
    else:  # pragma: no cover - Windows
        popen_kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            command,
            cwd=str(workdir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            env=dict(env) if env is not None else None,
            **popen_kwargs,
        )
    except OSError as exc:
        raise ToolError(f"stedgeai could not be started from '{tool}': {exc.strerror or exc}.") from exc

    lines: queue.Queue[str | None] = queue.Queue()
    readers = [
        threading.Thread(target=_pump, args=(stream, lines), daemon=True)
        for stream in (process.stdout, process.stderr)
    ]
    for reader in readers:
        reader.start()
    collected: list[str] = []
    open_streams = len(readers)
    deadline = started + timeout_s
    exited_at: float | None = None  # when stedgeai exited while its output was still open
    stop_reading_at: float | None = None
    leftovers = False
    try:
        while open_streams:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                raise TimeoutError
            if stop_reading_at is not None and now >= stop_reading_at:
                break  # killed, and still no end of file: stop reading (the pumps are daemon threads)
            if exited_at is None and process.poll() is not None:
                exited_at = now
            if exited_at is not None and stop_reading_at is None and now - exited_at > _DRAIN_S:
                # stedgeai has exited but a process it started (atonn, a helper) still holds its
                # stdout/stderr: stop the whole group, read what is left for a moment, go on
                leftovers = True
                _kill_process_tree(process)
                stop_reading_at = now + _DRAIN_S
            try:
                line = lines.get(timeout=max(0.01, min(remaining, 0.2)))
            except queue.Empty:
                continue
            if line is None:
                open_streams -= 1
                continue
            collected.append(line)
            if on_line is not None:
                on_line(line)
        returncode = process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except (TimeoutError, subprocess.TimeoutExpired):
        _kill_process_tree(process)
        process.wait()
        last = next((line for line in reversed(collected) if line.strip()), "")
        where = ("its temporary workspace is removed (pass --workdir DIR to keep stedgeai's partial output)"
                 if temporary_workdir else f"its partial output is in {workdir}")
        raise ToolError(
            f"stedgeai did not finish within {timeout_s:g} s and was stopped; {where} "
            f"(last line: '{last[:200]}')."
        ) from None
    except BaseException:
        _kill_process_tree(process)
        process.wait()
        raise
    finally:
        for reader, stream in zip(readers, (process.stdout, process.stderr)):
            reader.join(timeout=2)
            # closing a stream a pump still reads would wait for that read (for ever, when something
            # outside the killed group holds the pipe): leave it to the daemon thread then
            if stream is not None and not reader.is_alive():
                stream.close()
    duration = time.monotonic() - started
    text = "\n".join(collected)
    known = explain(text)
    left_behind = (
        "stedgeai exited but a process it started kept its output open; that process group was stopped."
        if leftovers else None
    )

    if returncode != 0:
        log.info("stedgeai exited with code %d after %.1f s", returncode, duration)
        return CompileResult(
            ok=False, returncode=returncode, command=tuple(command), log=text, duration_s=duration,
            output_dir=output_dir, workspace_dir=workspace_dir, known_errors=known,
        )

    problems: list[str] = [left_behind] if left_behind else []
    folders = [output_dir, workspace_dir]
    report: StedgeaiReport | None = None
    report_path = _find_first(folders, ["network_generate_report.txt", "*_generate_report.txt"])
    try:
        if report_path is not None:
            report = load_report(report_path)
        elif "Total number of epochs" in text:
            report = parse_report(text, source="the stedgeai log")
            problems.append(
                f"No *_generate_report.txt was found under {output_dir} or {workspace_dir}; the "
                "epochs were read from the console log."
            )
        else:
            problems.append(f"No *_generate_report.txt was found under {output_dir} or {workspace_dir}.")
    except InputError as exc:
        problems.append(exc.message)
    except Exception as exc:  # noqa: BLE001 - a report the parser does not follow is a problem, not a crash
        report = None
        problems.append(f"The stedgeai report could not be parsed ({type(exc).__name__}: {exc}).")

    c_info: CInfo | None = None
    c_info_path = _find_first(folders, ["network_c_info.json", "*_c_info.json", "c_info.json"])
    if c_info_path is not None:
        try:
            c_info = load_c_info(c_info_path)
        except InputError as exc:
            problems.append(exc.message)
        except Exception as exc:  # noqa: BLE001 - as for the report
            problems.append(f"{c_info_path} could not be parsed ({type(exc).__name__}: {exc}).")
    else:
        problems.append(f"No *_c_info.json was found under {output_dir} or {workspace_dir}.")

    epoch_csv: EpochCsv | None = None
    csv_path = _find_first(folders, ["*.csv"])
    if csv_path is not None:
        try:
            epoch_csv = parse_epoch_csv(read_text(csv_path, errors="replace"), source=str(csv_path))
        except Exception as exc:  # noqa: BLE001 - InputError, OSError, or a CSV the parser does not follow
            problems.append(getattr(exc, "message", None) or f"{csv_path} cannot be read: {exc}.")

    if report is not None and c_info is not None and report.epochs != c_info.epoch_count:
        problems.append(
            f"The report counts {report.epochs} epochs but {c_info_path} has {c_info.epoch_count} "
            "counted epochs."
        )
    for problem in problems:
        log.warning("%s", problem)
    return CompileResult(
        ok=True, returncode=returncode, command=tuple(command), log=text, duration_s=duration,
        output_dir=output_dir, workspace_dir=workspace_dir, report=report, report_path=report_path,
        c_info=c_info, c_info_path=c_info_path, epoch_csv=epoch_csv, epoch_csv_path=csv_path,
        known_errors=known, problems=tuple(problems),
    )
