"""The project configuration: ``[tool.nafix]`` in pyproject.toml, or the top level of nafix.toml.

One job: find the file (from a folder upwards, the first ``nafix.toml`` or ``pyproject.toml`` with a
``[tool.nafix]`` table; a pyproject.toml without one is skipped, as ruff and pytest do), read it,
check every key against the options of the nafix commands, and merge the per-path tables.

Keys are the commands' long option names without ``--`` (``core``, ``stedgeai-option``,
``fail-on``, ...). ``[tool.nafix.per-path."GLOB"]`` tables hold the same keys for the models whose
path, relative to the config file's folder, matches GLOB (fnmatch: ``*`` also crosses ``/``). The
tables apply in file order, a later match replacing an earlier one key by key, so write the general
tables first and the specific ones after. Path values (``baseline``, ``mpool``, ``calib``, ...) are
relative to the config file's folder. CLI flags override the file; the file overrides the defaults.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from .errors import UsageError

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as _toml  # type: ignore[no-redef]

PER_PATH = "per-path"
# option values that name a file or folder: read relative to the config file's folder
PATH_KEYS = frozenset({"baseline", "write-baseline", "mpool", "cache-dir", "calib", "inputs", "rules", "workdir",
                       "stedgeai", "output", "times"})
# options that make no sense from a file (they name this run's output or action)
NOT_IN_FILE = frozenset({"help", "version", "debug", "output", "force", "dry-run", "markdown"})


@dataclass(frozen=True)
class Option:
    """One command option as the config file sees it: its key, the parameter name, its kind."""

    key: str
    name: str
    kind: str  # "bool", "int", "float", "str", "list"
    choices: tuple[str, ...] = ()

    def expected(self) -> str:
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        return {"bool": "a boolean", "int": "an integer", "float": "a number", "str": "a string",
                "list": "a list of strings"}[self.kind]


@dataclass
class Config:
    """A config file read and checked: top-level values and per-path tables, keyed by option key."""

    file: Optional[Path] = None
    table: str = ""  # "tool.nafix" or "" (nafix.toml)
    values: dict[str, Any] = field(default_factory=dict)
    per_path: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.file.parent if self.file is not None else Path.cwd()

    def where(self, key: str, glob: Optional[str] = None) -> str:
        """``FILE:KEY``, the coordinate of a value in the file."""
        prefix = f"{self.table}." if self.table else ""
        inner = f'{PER_PATH}."{glob}".{key}' if glob is not None else key
        return f"{self.file}:{prefix}{inner}"

    def for_model(self, model: Optional[str | os.PathLike[str]]) -> dict[str, tuple[Any, str]]:
        """Key -> (value, source) for a model: the top level, then every matching per-path table in order."""
        out = {k: (v, self.where(k)) for k, v in self.values.items()}
        if model is None:
            return out
        rel = _relative(Path(model), self.root)
        if rel is None:
            return out
        for glob, table in self.per_path:
            if fnmatch.fnmatchcase(rel, glob):
                out.update({k: (v, self.where(k, glob)) for k, v in table.items()})
        return out


def _relative(model: Path, root: Path) -> Optional[str]:
    try:
        return Path(os.path.abspath(model)).relative_to(os.path.abspath(root)).as_posix()
    except ValueError:
        return None


def find(start: Optional[Path] = None) -> Optional[tuple[Path, dict[str, Any], str]]:
    """The first config from ``start`` upwards: (file, its nafix table, table name) or None."""
    try:
        here = Path(os.path.abspath(start or Path.cwd()))
    except OSError:  # the current folder was deleted: no config (the command says what is wrong)
        return None
    if here.is_file():
        here = here.parent
    for folder in (here, *here.parents):
        for name in ("nafix.toml", "pyproject.toml"):
            path = folder / name
            if not path.is_file():
                continue
            data = _read(path)
            if name == "nafix.toml":
                return path, data, ""
            tool = data.get("tool")
            if isinstance(tool, dict) and "nafix" in tool:
                if not isinstance(tool["nafix"], dict):
                    raise UsageError(f"{path}: tool.nafix must be a table.")
                return path, tool["nafix"], "tool.nafix"
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return _toml.load(fh)
    except _toml.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc}).") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror or exc}).") from None


def load(options: Mapping[str, Option], start: Optional[Path] = None) -> Config:
    """Find, read and check the config (an empty Config when there is none)."""
    found = find(start)
    if found is None:
        return Config()
    path, data, table = found
    cfg = Config(file=path, table=table)
    for key, value in data.items():
        if key == PER_PATH:
            if not isinstance(value, dict):
                raise UsageError(f"{cfg.where(key)}: expected a table of glob = {{options}} tables.")
            for glob, sub in value.items():
                if not isinstance(sub, dict):
                    raise UsageError(f"{cfg.where(glob, None)}: expected a table under {PER_PATH}.")
                cfg.per_path.append((glob, {k: _check(cfg, options, k, v, glob) for k, v in sub.items()}))
        else:
            cfg.values[key] = _check(cfg, options, key, value, None)
    return cfg


def _check(cfg: Config, options: Mapping[str, Option], key: str, value: Any, glob: Optional[str]) -> Any:
    where = cfg.where(key, glob)
    opt = options.get(key)
    if opt is None or key in NOT_IN_FILE:
        raise UsageError(f"{where}: unknown key (expected an option's long name, e.g. core, fail-on, "
                         f"stedgeai-option).")
    ok = {"bool": isinstance(value, bool),
          "int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "str": isinstance(value, str),
          "list": isinstance(value, list) and all(isinstance(v, str) for v in value)}[opt.kind]
    if opt.kind == "list" and isinstance(value, str):  # one value for a repeatable option
        value, ok = [value], True
    if opt.kind == "str" and isinstance(value, (int, float)) and not isinstance(value, bool) and not opt.choices:
        value, ok = str(value), True  # core = 2.2 reads as a number
    if ok and opt.choices and value not in opt.choices:
        ok = False
    if not ok:
        raise UsageError(f"{where}: expected {opt.expected()}, got {value!r}.")
    if key in PATH_KEYS:
        if opt.kind == "list":
            value = [str(cfg.root / v) for v in value]
        else:
            value = str(cfg.root / value)
    return value


def options_of(commands: Iterable[Any]) -> dict[str, Option]:
    """The options of click commands, keyed by long name (one kind per name across commands)."""
    out: dict[str, Option] = {}
    for cmd in commands:
        for p in getattr(cmd, "params", ()):
            longs = [o for o in getattr(p, "opts", ()) if o.startswith("--")]
            if not longs or getattr(p, "param_type_name", "") != "option":
                continue
            key = longs[0][2:]
            kind, choices = _kind(p)
            out.setdefault(key, Option(key, p.name, kind, choices))
    return out


def _kind(p: Any) -> tuple[str, tuple[str, ...]]:
    """The kind of a typer/click option: from typer's annotation, else from click's type."""
    import enum
    import typing

    if getattr(p, "multiple", False):
        return "list", ()
    if getattr(p, "is_flag", False):
        return "bool", ()
    ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if args and typing.get_origin(ann) is typing.Union:
        ann = args[0]
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return "str", tuple(str(m.value) for m in ann)
    if ann is bool:
        return "bool", ()
    if ann is int:
        return "int", ()
    if ann is float:
        return "float", ()
    name = getattr(getattr(p, "type", None), "name", "")
    if name in ("integer", "integer range"):
        return "int", ()
    if name in ("float", "float range"):
        return "float", ()
    return "str", tuple(getattr(getattr(p, "type", None), "choices", ()) or ())


def default_map(cfg: Config, command: Any, model: Optional[str] = None) -> dict[str, Any]:
    """Parameter name -> value for one click command: the file's values as the command's defaults."""
    names = {}
    for p in getattr(command, "params", ()):
        for o in getattr(p, "opts", ()):
            if o.startswith("--"):
                names[o[2:]] = p.name
                break
    return {names[k]: v for k, (v, _src) in cfg.for_model(model).items() if k in names}
