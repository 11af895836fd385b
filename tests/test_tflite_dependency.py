"""The TFLite interpreter after a plain install (issue 36): ``ai-edge-litert`` is a dependency where
LiteRT publishes wheels (a platform marker in pyproject.toml), the ``tflite`` extra still names it, and
where it is missing nafix says in one line how to get it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from fixer.api import AnalysisOptions, analyze_path
from fixer.importers import tflite_check
from fixer.importers._tflite_worker import interpreter_class
from tests.helpers import run_cli as run

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "tflite"


def _pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _litert(reqs: list[str]) -> list[Requirement]:
    return [r for r in map(Requirement, reqs) if r.name == "ai-edge-litert"]


def _env(system: str, machine: str, python: str) -> dict:
    sys_platform = {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}[system]
    return {"sys_platform": sys_platform, "platform_system": system, "platform_machine": machine,
            "python_version": python, "python_full_version": python + ".0", "os_name": "nt" if system == "Windows"
            else "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}


# Where ai-edge-litert 2.3.0 has wheels (cp310..cp314: manylinux_2_27 x86_64 and aarch64, macosx_12_0
# arm64, win_amd64; checked with `pip install --dry-run --platform ... --python-version ...`), and where
# it has none (macOS x86_64 stops at 1.0.1 for cp310/cp311, below the required 1.2; no Windows or Linux
# ARM 32-bit wheels; no cp315 wheel yet).
WITH_WHEELS = [(s, m, p) for s, m in [("Linux", "x86_64"), ("Linux", "aarch64"), ("Darwin", "arm64"),
                                      ("Windows", "AMD64")]
               for p in ("3.10", "3.11", "3.12", "3.13", "3.14")]
WITHOUT_WHEELS = [("Darwin", "x86_64", "3.11"), ("Darwin", "x86_64", "3.12"), ("Linux", "armv7l", "3.12"),
                  ("Linux", "ppc64le", "3.12"), ("Windows", "ARM64", "3.12"), ("Linux", "x86_64", "3.15"),
                  ("Darwin", "arm64", "3.15")]


def test_plain_install_depends_on_litert_exactly_where_it_has_wheels():
    deps = _litert(_pyproject()["project"]["dependencies"])
    assert len(deps) == 1 and deps[0].marker is not None, deps
    marker = deps[0].marker
    for env in WITH_WHEELS:
        assert marker.evaluate(_env(*env)), env
    for env in WITHOUT_WHEELS:
        assert not marker.evaluate(_env(*env)), env


def test_the_tflite_extra_still_installs_the_interpreter():
    project = _pyproject()["project"]
    for extra in ("tflite", "test"):
        reqs = _litert(project["optional-dependencies"][extra])
        assert len(reqs) == 1 and reqs[0].marker is None and reqs[0].specifier == deps_specifier(project), extra


def deps_specifier(project: dict):
    return _litert(project["dependencies"])[0].specifier


def test_without_an_interpreter_nafix_says_how_to_get_one(tmp_path, capsys, monkeypatch):
    """No LiteRT (a platform outside the marker): the runtimes are not importable, so the check is not
    run, audit says so in its warning and `nafix MODEL.tflite` stops with one line naming the extra."""
    for mod in ("ai_edge_litert", "ai_edge_litert.interpreter", "tflite_runtime", "tflite_runtime.interpreter",
                "tensorflow"):
        monkeypatch.setitem(sys.modules, mod, None)  # `import mod` raises ImportError
    assert interpreter_class() is None
    model = tmp_path / "m.tflite"
    shutil.copy(DATA / "movenet_like.tflite", model)
    code, out, err = run([model], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "pip install 'nafix[tflite]'" in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tflite"]
    # audit (in this process: an audit's worker processes may predate the missing interpreter)
    a = analyze_path(model, AnalysisOptions())
    assert any("not checked against the TFLite interpreter" in w and "pip install 'nafix[tflite]'" in w
               for w in a.loaded.warnings), a.loaded.warnings
    check = tflite_check.check_import(None, b"")  # checked first: nothing else is touched
    assert not check.checked and "nafix[tflite]" in check.reason
