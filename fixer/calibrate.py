"""``nafix calibrate PAIRS_DIR``: the placement model against real stedgeai reports.

A pairs folder holds one sub-folder per (model, reports) pair. For every report found in a pair
folder, the core version and the placement options are read from the report itself (its
``ST Edge AI Core vX.Y.Z`` line and its ``Parameters`` / command line), the model the report was
made from is found (by the report's ``model_hash``, by its model file name, or as the folder's only
model), and the model is estimated with exactly those settings. Each row compares the real and the
estimated epochs, SW epochs, hybrid epochs and the multisets of SW / hybrid op names.

Adding a pair is dropping a folder: no code or list names the pairs. No printing here (the CLI
renders the rows).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InputError, NafixError

log = logging.getLogger(__name__)

#: Target of the calibration (issue 10): equal SW op multisets (and hybrid ops for core >= 3) and
#: an estimated epoch total within this fraction of the report's.
EPOCH_TOLERANCE = 0.10
MODEL_SUFFIXES = (".onnx", ".tflite")
_SKIP_NAMES = ("source.txt", "readme.md", "license.txt")
_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \[\w+\] [\w.:]+ - ?", re.M)
_MODEL_HASH = re.compile(r"model_hash\s*:\s*0x([0-9a-fA-F]{32})")
_MODEL_OPT = re.compile(r"(?:^|\s)(?:-m|--model)\s+(\S+)")
_TICKED = re.compile(r"`([^`]+\.(?:onnx|tflite))`")
_PATH_TOKEN = re.compile(r"[\w./-]+")
_MODEL_END = re.compile(r"\.(?:onnx|tflite)")


@dataclass
class CalibrationRow:
    """One report of one pair: the real figures, the estimate made with the report's settings."""

    pair: str
    report: str  # path relative to the pairs folder
    model: str | None = None
    core: str = ""
    options: tuple[str, ...] = ()
    real_epochs: int = 0
    real_sw: int = 0
    real_hybrid: int | None = None
    real_sw_ops: Counter = field(default_factory=Counter)
    real_hybrid_ops: Counter = field(default_factory=Counter)
    est_epochs: int | None = None
    est_sw: int | None = None
    est_hybrid: int | None = None
    est_sw_ops: Counter = field(default_factory=Counter)
    est_hybrid_ops: Counter = field(default_factory=Counter)
    status: str = "ok"  # ok | off | cannot import yet | no model | error
    note: str = ""
    runs: int = 1  # identical reports (same model, core, options, figures) folded into this row

    @property
    def estimated(self) -> bool:
        return self.est_epochs is not None

    @property
    def ops_listed(self) -> bool:
        """False when the report gives the SW counter but no per-epoch op names (a summary only)."""
        return sum(self.real_sw_ops.values()) == self.real_sw

    def sw_diff(self) -> list[str]:
        return _diff(self.est_sw_ops, self.real_sw_ops)

    def hybrid_diff(self) -> list[str]:
        return _diff(self.est_hybrid_ops, self.real_hybrid_ops)

    @property
    def epoch_error(self) -> float | None:
        if self.est_epochs is None or not self.real_epochs:
            return None
        return (self.est_epochs - self.real_epochs) / self.real_epochs

    def failed(self) -> dict[str, str]:
        """What misses the target, by kind (``sw_ops``, ``sw_epochs``, ``hybrid_ops``, ``epochs``, or
        the status of a row that could not be estimated); empty: on target."""
        if not self.estimated:
            return {"not_estimated": self.status}
        out: dict[str, str] = {}
        if self.ops_listed and self.sw_diff():
            out["sw_ops"] = "SW ops differ: " + " ".join(self.sw_diff())
        if not self.ops_listed and self.est_sw != self.real_sw:
            out["sw_epochs"] = f"SW epochs {self.est_sw} vs {self.real_sw}"
        if self.real_hybrid is not None and self.hybrid_diff():
            out["hybrid_ops"] = "hybrid ops differ: " + " ".join(self.hybrid_diff())
        err = self.epoch_error
        if err is not None and abs(err) > EPOCH_TOLERANCE:
            out["epochs"] = f"epochs {self.est_epochs} vs {self.real_epochs} ({err:+.0%})"
        return out

    def failures(self) -> list[str]:
        """Why the row misses the target, as sentences (empty: on target)."""
        return list(self.failed().values())

    def as_dict(self) -> dict:
        return {
            "pair": self.pair, "report": self.report, "model": self.model, "core": self.core,
            "options": list(self.options), "runs": self.runs, "status": self.status, "note": self.note,
            "real": {"epochs": self.real_epochs, "sw_epochs": self.real_sw, "hybrid_epochs": self.real_hybrid,
                     "sw_ops": dict(sorted(self.real_sw_ops.items())),
                     "hybrid_ops": dict(sorted(self.real_hybrid_ops.items()))},
            "estimated": None if not self.estimated else {
                "epochs": self.est_epochs, "sw_epochs": self.est_sw, "hybrid_epochs": self.est_hybrid,
                "sw_ops": dict(sorted(self.est_sw_ops.items())),
                "hybrid_ops": dict(sorted(self.est_hybrid_ops.items()))},
            "sw_ops_diff": self.sw_diff() if self.estimated else [],
            "hybrid_ops_diff": self.hybrid_diff() if self.estimated else [],
            "on_target": self.estimated and not self.failures(),
            "failures": self.failures(),
        }


def _diff(est: Counter, real: Counter) -> list[str]:
    extra = est - real
    missing = real - est
    return ([f"+{op}" + (f"x{n}" if n > 1 else "") for op, n in sorted(extra.items())]
            + [f"-{op}" + (f"x{n}" if n > 1 else "") for op, n in sorted(missing.items())])


def clean_report_text(text: str) -> str:
    """A console log as a report: log-line prefixes removed, blank lines inside tables dropped."""
    text = _LOG_PREFIX.sub("", text)
    return "\n".join(line for line in text.splitlines() if line.strip())


#: X-CUBE-AI pack major version -> the ST Edge AI Core major version it ships: X-CUBE-AI 10.Y.Z
#: carries core 2.Y.Z (the pairs: X-CUBE-AI 10.1.0 with core 2.1.0, 10.2.0 with core 2.2.0, in their
#: paths), and a build that ST shipped before 2.0.0 printed the pack's number as its own
#: ("ST Edge AI Core v10.0.0-20047", one build below 2.0.0-20049): it is read as core 2.0.0.
PACK_TO_CORE_MAJOR = {10: 2}


def core_of(version: str | None) -> str:
    """``"4.0.1-20581"`` -> ``"4.0.1"`` (the placement facts are selected by X.Y); a version in the
    X-CUBE-AI pack's numbering is read as the core it ships (``"10.0.0-20047"`` -> ``"2.0.0"``)."""
    if not version:
        return ""
    core = version.strip().lstrip("vV").split("-")[0]
    major, dot, rest = core.partition(".")
    if major.isdigit() and int(major) in PACK_TO_CORE_MAJOR:
        return f"{PACK_TO_CORE_MAJOR[int(major)]}{dot}{rest}"
    return core


def placement_options(command: str | None) -> tuple[str, ...]:
    """The stedgeai options of a report's command line that change placement, one entry each with
    its value (``'--input-data-type float32'``)."""
    from .npu.profile import KNOWN_OPTIONS, VALUE_OPTIONS

    if not command:
        return ()
    tokens = command.split()
    out: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        key, eq, val = tok.partition("=")
        if key in VALUE_OPTIONS:
            value = val if eq else (tokens[i + 1] if i + 1 < len(tokens) else "")
            if value.lower() in VALUE_OPTIONS[key]:
                out.append(f"{key} {value.lower()}")
            i += 1 if eq else 2
            continue
        if tok in KNOWN_OPTIONS:
            out.append(tok)
        i += 1
    return tuple(sorted(set(out)))


def _command(text: str, parsed_command: str | None) -> str | None:
    """The report's command line: what the parser read, else a ``[> ]...stedgeai generate ...`` line."""
    from .stedgeai.reports import _command_line

    if parsed_command:
        return parsed_command
    for line in text.splitlines():  # str methods, one pass: no regex backtracking over long blank runs
        s = line.strip().lstrip(">").strip()
        if "stedgeai" in s.lower() and _command_line(s):
            return line.strip()
    return None


def _relative_paths(text: str) -> set[str]:
    """``../x/y.onnx`` paths in a README: each run of path characters is scanned once (linear time)."""
    out: set[str] = set()
    for m in _PATH_TOKEN.finditer(text):
        tok = m.group()
        at = tok.find("../")
        if at < 0:
            continue
        tok = tok[at:]
        ends = [e.end() for e in _MODEL_END.finditer(tok)]
        if ends:
            out.add(tok[: ends[-1]])
    return out


def _model_file_names(text: str) -> list[str]:
    """The values of the report's ``model file : NAME`` lines."""
    names = []
    for line in text.splitlines():
        s = line.strip()
        if s[:10].lower() == "model file":
            rest = s[10:].lstrip()
            if rest.startswith(":") and rest[1:].strip():
                names.append(rest[1:].strip())
    return names


def _md5(path: Path) -> str:
    from .fsutil import open_regular

    h = hashlib.md5()
    try:
        with open_regular(path) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:  # gone or replaced by a FIFO since it was listed: it matches no hash
        return ""
    return h.hexdigest()


def _resolve_inside(path: Path, roots: tuple[Path, ...]) -> Path | None:
    """``path`` resolved, when it is a regular file inside one of ``roots``; None when it is not there.
    Raises OSError/RuntimeError for a path that cannot be resolved (a symlink loop)."""
    from .fsutil import is_regular

    p = path.resolve()
    if not any(p == r or p.is_relative_to(r) for r in roots):
        if p.exists():  # a name that leads nowhere is just not a candidate
            raise ValueError(str(p))
        return None
    return p if is_regular(p) else None


def _read_doc(f: Path) -> str | None:
    from .fsutil import read_text

    try:
        return read_text(f, errors="replace")  # a FIFO named README.md is refused, never read
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"{f}: cannot be read ({exc.strerror or exc}).") from None


def _candidate_models(folder: Path, pairs_dir: Path, refused: list[str] | None = None) -> list[Path]:
    """Model files in the pair folder, and the ones its README/source.txt name by a relative path.

    Only files inside the pairs folder, or inside the ``../../models`` folder beside it that the pairs
    README documents, are taken: an absolute path, a ``..`` escape out of those folders (also through a
    symlink) and a symlink loop are refused, each with a sentence appended to ``refused``."""
    refused = [] if refused is None else refused
    root = pairs_dir.resolve()
    roots = (root, (pairs_dir / ".." / ".." / "models").resolve())

    def take(paths: list[Path], what: str) -> Path | None:
        """The first of ``paths`` (one name tried against several folders) that is a model inside the
        roots; when none is, why each one that exists was refused."""
        why: list[str] = []
        for path in paths:
            try:
                p = _resolve_inside(path, roots)
            except ValueError:
                why.append(f"{what} '{path}' is outside the pairs folder {pairs_dir} and its ../../models "
                           "folder; refused")
                continue
            except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long ...
                reason = getattr(exc, "strerror", None) or "a symlink loop"
                why.append(f"{what} '{path}' cannot be resolved ({reason}); refused")
                continue
            if p is not None:
                return p
        refused.extend(why)
        return None

    # resolved, so that a model found both in the folder and by a relative reference counts once
    found: list[Path] = []
    for p in sorted(folder.rglob("*")):
        if p.suffix.lower() in MODEL_SUFFIXES and (p.is_file() or p.is_symlink()):
            q = take([p], "the model file")
            if q is not None and q not in found:
                found.append(q)
    for doc in ("README.md", "source.txt"):
        text = _read_doc(folder / doc)
        if text is None:
            continue
        for ref in sorted(set(_TICKED.findall(text)) | _relative_paths(text)):
            if Path(ref).is_absolute() or ref.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:[\\/]", ref):
                refused.append(f"{folder / doc} names the absolute model path '{ref}'; only paths relative to the "
                               "pairs folder are read, refused")
                continue
            p = take([base / ref for base in (folder, pairs_dir, pairs_dir.parent)], f"the model {folder / doc} names")
            if p is not None and p not in found:
                found.append(p)
    top_text = _read_doc(pairs_dir / "README.md")  # the pairs table names models in ../../models
    if top_text is not None:
        for line in top_text.splitlines():
            if line.startswith(f"| {folder.name} "):
                for ref in _TICKED.findall(line):
                    name = Path(ref).name if "/" in ref or "\\" in ref else ref
                    p = take([base / name for base in (folder, pairs_dir.parent.parent / "models")],
                             f"the model {pairs_dir / 'README.md'} names")
                    if p is not None and p not in found:
                        found.append(p)
    return found


def _stem_key(name: str) -> str:
    stem = Path(name.replace("\\", "/")).stem.lower()
    return re.sub(r"^[a-z0-9]+__", "", stem)


def match_model(text: str, command: str | None, models: list[Path], hashes: dict[Path, str]) -> Path | None:
    """The model a report was made from: by ``model_hash``, by file name, or the only candidate."""
    if not models:
        return None
    h = _MODEL_HASH.search(text)
    if h:
        want = h.group(1).lower()
        for p in models:
            if hashes.setdefault(p, _md5(p)) == want:
                return p
    names = _model_file_names(text)
    if command:
        names += _MODEL_OPT.findall(command)
    for name in names:
        key = _stem_key(name)
        hits = [p for p in models if _stem_key(p.name) == key or key in _stem_key(p.name)]
        if len(hits) == 1:
            return hits[0]
    if len(models) == 1:
        return models[0]
    named = [p for p in models if p.name in text]  # a path with spaces defeats splitting the command line
    return named[0] if len(named) == 1 else None


def find_reports(folder: Path) -> list[Path]:
    # regular files only: a FIFO named *.txt would block the read forever
    from .fsutil import is_regular

    return sorted(p for p in folder.rglob("*.txt") if p.name.lower() not in _SKIP_NAMES and is_regular(p))


def calibrate(pairs_dir: str | Path, *, target_profile: str | None = None) -> list[CalibrationRow]:
    """One row per distinct report of every pair folder under ``pairs_dir``."""
    from .fsutil import read_text
    from .stedgeai import MalformedReport, parse_report

    root = Path(pairs_dir)
    if not root.is_dir():
        raise InputError(f"{root} is not a folder of (model, report) pairs.")
    rows: list[CalibrationRow] = []
    hashes: dict[Path, str] = {}
    cache: dict[tuple, object] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        refused: list[str] = []
        models = _candidate_models(folder, root, refused)
        seen: dict[tuple, CalibrationRow] = {}
        for rp in find_reports(folder):
            try:
                raw = read_text(rp, errors="replace")
            except OSError as exc:
                raise InputError(f"{rp}: the report cannot be read ({exc.strerror or exc}).") from None
            text = clean_report_text(raw)
            try:
                rep = parse_report(text, source=str(rp))
            except MalformedReport as exc:  # a report that claims more than it can hold: its row says so
                rows.append(CalibrationRow(pair=folder.name, report=str(rp.relative_to(root)), status="error",
                                           note=exc.message))
                continue
            except NafixError:
                continue  # not a Neural-ART report (a log, a licence, ...)
            command = _command(text, rep.command)
            row = CalibrationRow(
                pair=folder.name, report=str(rp.relative_to(root)), core=core_of(rep.version),
                options=placement_options(command), real_epochs=rep.epochs, real_sw=rep.sw_epochs,
                real_hybrid=rep.hybrid_epochs, real_sw_ops=Counter(rep.sw_ops), real_hybrid_ops=Counter(rep.hybrid_ops))
            model = match_model(text, command, models, hashes)
            row.model = _display(model, root) if model is not None else None
            key = (row.model, row.core, row.options, row.real_epochs, row.real_sw, row.real_hybrid,
                   tuple(sorted(row.real_sw_ops.items())), tuple(sorted(row.real_hybrid_ops.items())))
            if key in seen:
                seen[key].runs += 1
                continue
            seen[key] = row
            rows.append(row)
            if model is None and refused:
                row.status, row.note = "error", "; ".join(dict.fromkeys(refused)) + "."
                continue
            if model is None:
                row.status, row.note = "no model", "no model file in the folder matches the report"
                continue
            _estimate_row(row, model, target_profile, cache)
    return rows


def _display(p: Path, root: Path) -> str:
    try:
        return str(p.resolve().relative_to(root.resolve()))
    except ValueError:
        return p.name


def _estimate_row(row: CalibrationRow, model: Path, target_profile: str | None, cache: dict) -> None:
    from .api import AnalysisOptions, analyze_path

    key = (str(model), row.core, row.options)
    if row.core and not _known_core(row.core, target_profile):
        row.status = "unknown core"
        row.note = (f"the report's ST Edge AI Core version {row.core} is not one the target profile has placement "
                    f"facts for (it knows {', '.join(_profile_cores(target_profile))}); not estimated")
        return
    try:
        if key not in cache:
            opts = AnalysisOptions(target_profile=target_profile, stedgeai_options=frozenset(row.options),
                                   core=row.core or None)
            cache[key] = analyze_path(model, opts).estimate
        est = cache[key]
    except NafixError as exc:
        msg = str(exc)
        tflite = _is_tflite_file(model)
        row.status = "cannot import yet" if tflite and "tflite" in msg.lower() else "error"
        row.note = msg
        return
    row.est_epochs, row.est_sw, row.est_hybrid = est.epochs, est.sw_epochs, est.hybrid_epochs
    row.est_sw_ops, row.est_hybrid_ops = est.sw_ops, est.hybrid_ops
    row.status = "ok" if not row.failures() else "off"


def _profile_cores(target_profile: str | None) -> list[str]:
    from .npu.profile import load_profile

    return [c.version for c in load_profile(target_profile).cores]


def _known_core(core: str, target_profile: str | None) -> bool:
    """Whether the target profile selects facts for stedgeai core ``core`` (a listed X.Y of the same
    major version not newer than it)."""
    from .npu.profile import load_profile, select_core

    profile = load_profile(target_profile)
    try:
        select_core(profile, core)
    except NafixError:
        return False
    return True


def _is_tflite_file(path: Path) -> bool:
    """Whether ``path`` is a TFLite model by content (the 'TFL3' identifier at bytes 4..8), whatever it
    is called; a path that is not a regular file (never opened: a FIFO would block) by its suffix."""
    from .importers import is_tflite

    if not path.is_file():
        return path.suffix.lower() == ".tflite"
    try:
        with open(path, "rb") as fh:
            return is_tflite(fh.read(8))
    except OSError:
        return path.suffix.lower() == ".tflite"


def summary(rows: list[CalibrationRow]) -> dict:
    """Counts for the README: rows on target, rows estimated, rows that could not be estimated."""
    est = [r for r in rows if r.estimated]
    return {
        "rows": len(rows),
        "estimated": len(est),
        "on_target": sum(1 for r in est if not r.failures()),
        "sw_ops_equal": sum(1 for r in est if r.ops_listed and not r.sw_diff()),
        "epochs_within": sum(1 for r in est if r.epoch_error is not None and abs(r.epoch_error) <= EPOCH_TOLERANCE),
        "not_estimated": {r.report: r.status for r in rows if not r.estimated},
    }


# ------------------------------------------------------------------------------------------------
# README blocks (scripts/calibration_readme.py writes them; tests/test_calibrate.py checks they are current)
# ------------------------------------------------------------------------------------------------

CORES_BEGIN = "<!-- cores:begin (generated by `python scripts/calibration_readme.py`; do not edit) -->"
CORES_END = "<!-- cores:end -->"
CALIBRATION_BEGIN = "<!-- calibration:begin (generated by `python scripts/calibration_readme.py`; do not edit) -->"
CALIBRATION_END = "<!-- calibration:end -->"


def cores_block(profile) -> str:
    """What the estimate covers per stedgeai core version, from the profile data."""
    base = profile.base_limits if profile.base_limits is not None else profile.limits
    lines = ["| core | hybrid epochs (SW ops run as hybrid) | float kernels named | core-specific facts | tag |",
             "|---|---|---|---|---|"]
    for c in profile.cores:
        facts = [f"{op} runs as {' + '.join(ops)}" for op, ops in sorted(c.sw_lowered.items())]
        facts += [f"{k} = {v} (default {base[k].value})" for k, v in sorted(c.limits.items()) if k in base]
        facts += [f"no {cid}" for cid in sorted(c.constraints_off)]
        facts += [f"{op} joins the epoch before it" for op in sorted(c.fuse_ops)]
        default = " (default)" if profile.core is not None and c.version == profile.core.version else ""
        lines.append(f"| {c.version}{default} | {', '.join(sorted(c.hybrid_ops)) or 'none: pure SW'} "
                     f"| {'`Op(float)`' if c.float_suffix else '`Op`'} | {'; '.join(facts) or '-'} | {c.tag} |")
    lines += ["", "Lowerings (ops stedgeai inserts, each a SW epoch, hybrid where the core runs the op as hybrid):", ""]
    for low in profile.lowerings.values():
        lines.append(f"- `{low.name}`: inserts {' + '.join(low.inserts)} [{low.tag}]")
    return "\n".join(lines)


def calibration_table(rows) -> str:
    """``nafix calibrate`` as a Markdown table (real figures from the reports, the rest estimated)."""
    from .escape import markdown as _md

    def ops(d: dict) -> str:
        return " ".join(d) if d else "="

    out = ["| pair | report | core | options | epochs real / est | SW real / est | hybrid real / est "
           "| SW ops (+extra -missing) | hybrid ops | on target |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rep = r.report.split("/", 1)[-1] + (f" (x{r.runs})" if r.runs > 1 else "")
        opts = " ".join(o.replace("--", "") for o in r.options) or "-"
        if not r.estimated:
            out.append(f"| {_md(r.pair)} | {_md(rep)} | {_md(r.core)} | {_md(opts)} | {r.real_epochs} / - | {r.real_sw} / - "
                       f"| {r.real_hybrid if r.real_hybrid is not None else '-'} / - | - | - | {_md(r.status)} |")
            continue
        hy = f"{r.real_hybrid} / {r.est_hybrid}" if r.real_hybrid is not None else f"- / {r.est_hybrid}"
        sw_ops = ops(r.sw_diff()) if r.ops_listed else "(not listed)"
        hy_ops = ops(r.hybrid_diff()) if r.real_hybrid is not None else "-"
        err = r.epoch_error
        out.append(f"| {_md(r.pair)} | {_md(rep)} | {_md(r.core)} | {_md(opts)} | {r.real_epochs} / {r.est_epochs}"
                   f"{f' ({err:+.0%})' if err else ''} | {r.real_sw} / {r.est_sw} | {hy} | {_md(sw_ops)} | {_md(hy_ops)} "
                   f"| {'yes' if not r.failures() else 'no'} |")
    s = summary(rows)
    out.append("")
    out.append(f"{s['on_target']} of {s['estimated']} estimated reports on target (SW op multiset equal, hybrid ops "
               f"equal where the report counts them, estimated epochs within {EPOCH_TOLERANCE:.0%}); "
               f"{s['sw_ops_equal']} with equal SW ops, {s['epochs_within']} with epochs within {EPOCH_TOLERANCE:.0%}; "
               f"{len(s['not_estimated'])} not estimated.")
    return "\n".join(out) + "\n"


def calibration_block(rows: list[CalibrationRow], exceptions: dict) -> str:
    """The calibrate table, its summary and the documented exceptions with their evidence."""
    out = ["Measured with `nafix calibrate ../shared/reference/pairs` (real figures from the reports; "
           "estimated ones from nafix's placement model with the core version and options each report states):",
           "", calibration_table(rows).rstrip("\n"), "",
           "Reports not on target, and why (`docs/calibration_exceptions.yaml`, enforced by "
           "`tests/test_calibrate.py`):", ""]
    for key, entry in exceptions.items():
        why = " ".join(str(entry["why"]).split())
        out.append(f"- `{key}` ({', '.join(entry['fails'])}): {why}")
    return "\n".join(out)


def replace_block(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with the part between the ``begin`` and ``end`` marker lines replaced by ``body``."""
    if begin not in text or end not in text:
        raise InputError(f"README has no '{begin}' ... '{end}' block.")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"
