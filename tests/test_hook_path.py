"""The short run of a pre-commit hook (one model, warm result cache) imports no analysis stack, and
what it uses instead of that stack (fixer.rule_index, the options fingerprint memo, the light
command-line coercion) agrees with the full readings. Speed itself is measured by
``scripts/bench.py --speed hook``, not here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixer.cli import main

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("onnx", "numpy", "onnxruntime", "pydantic", "fixer.api", "fixer.rules", "fixer.npu.constraints",
         "fixer.npu.placement", "multiprocessing", "yaml")

PROBE = (
    "import sys, atexit\n"
    "atexit.register(lambda: sys.stderr.write('LOADED ' + ' '.join(m for m in {heavy!r} if m in sys.modules) + '\\n'))\n"
    "from fixer.cli import main\n"
    "main({argv!r})\n"
)


def _probe(argv, cwd, env):
    code = PROBE.format(heavy=HEAVY, argv=argv)
    p = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("LOADED")]
    assert line, p.stderr
    return p, line[-1].split()[1:]


def test_warm_cache_hook_run_imports_no_analysis_stack(tmp_path):
    shutil.copy(ROOT / "sample_models" / "classifier_softmax.onnx", tmp_path / "model.onnx")
    (tmp_path / "pyproject.toml").write_text('[tool.nafix]\nfail-on = "sw"\njobs = 1\n', encoding="utf-8")
    env = dict(os.environ, NAFIX_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    cold, loaded_cold = _probe(["audit", "model.onnx", "-f", "json"], tmp_path, env)
    assert "multiprocessing" in loaded_cold  # the first run analyses (in a worker process)
    warm, loaded = _probe(["audit", "model.onnx", "-f", "json"], tmp_path, env)
    assert loaded == [], f"a cache hit imported {loaded}"
    assert warm.returncode == cold.returncode == 1  # --fail-on sw from the config: a SW Softmax
    assert json.loads(warm.stdout)["models"] == json.loads(cold.stdout)["models"]
    for fmt in ("table", "concise", "github", "sarif"):  # every CI rendering of a hit stays light
        _, loaded = _probe(["audit", "model.onnx", "-f", fmt], tmp_path, env)
        assert loaded == [], (fmt, loaded)


def test_rule_index_reads_the_rules_as_the_rule_engine_does():
    from fixer.rule_index import builtin_rule_refs, builtin_rules_dir
    from fixer.rules import load_rules

    full = [(r.id, r.name, tuple(r.fixes), r.opt_in) for r in load_rules()]
    light = [(r.id, r.name, r.fixes, r.opt_in) for r in builtin_rule_refs()]
    assert light == full and len(full) >= 17
    assert Path(str(builtin_rules_dir())).is_dir()


@pytest.mark.parametrize("text, expected", [
    ('id: NAF001\nname: a-b\nfixes: [x, "sw_op:Y"]\nopt_in: false\n', ["x", "sw_op:Y"]),
    ("id: NAF001\nname: a-b\nfixes: ['x']  # c\nopt_in: true\n", ["x"]),
    ("id: NAF001\nname: a-b\nfixes:\n  - x\nopt_in: true\n", None),  # a block list: the YAML is read
    ("id: NAF001\nname: a-b\nfixes: x\nopt_in: true\n", None),
    ("id: NAF001\nname: a-b\nfixes: [x]\n", ["x"]),  # no opt_in line: false
    ("id: NAF001\nname: a-b\nfixes: [x]\nopt_in: maybe\n", None),
    ("name: a-b\nfixes: [x]\n", None),
])
def test_rule_index_quick_reading_or_yaml(text, expected):
    from fixer.rule_index import _quick

    got = _quick(text)
    assert (got["fixes"] if got else None) == expected


def test_every_builtin_rule_is_read_without_yaml():
    from fixer.rule_index import _quick, builtin_rules_dir

    files = [f for f in builtin_rules_dir().iterdir() if f.name.endswith(".yaml")]
    assert files and all(_quick(f.read_text(encoding="utf-8")) is not None for f in files)


def test_builtin_profile_names_only_registered_constraints():
    """Every constraint the built-in profile lists is registered (load_profile checks it too)."""
    import yaml

    from fixer.npu import constraints
    from fixer.rules import PLACEMENT_REASONS

    data = yaml.safe_load((ROOT / "fixer" / "npu" / "profiles" / "stm32n6.yaml").read_text(encoding="utf-8"))
    named = {c for entry in data["operators"].values() for c in entry.get("constraints", ()) or ()}
    assert named and named <= set(constraints.REGISTRY), named - set(constraints.REGISTRY)
    assert PLACEMENT_REASONS  # (the rules' other reason ids are checked by test_rule_cases)


def test_a_user_profile_with_an_unknown_constraint_is_still_refused(tmp_path):
    from fixer.errors import ProfileError
    from fixer.npu.profile import load_profile

    text = (ROOT / "fixer" / "npu" / "profiles" / "stm32n6.yaml").read_text(encoding="utf-8")
    data = __import__("yaml").safe_load(text)
    op = next(k for k, v in data["operators"].items() if v.get("constraints"))
    data["operators"][op]["constraints"] = ["no_such_constraint"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(__import__("yaml").safe_dump(data), encoding="utf-8")
    with pytest.raises(ProfileError, match="no_such_constraint"):
        load_profile(str(bad))


def test_options_fingerprint_memo_follows_the_profile_file(tmp_path):
    from fixer.npu.profile import load_profile
    from fixer.options import AnalysisOptions
    from fixer.zoo.cache import options_fingerprint, remembered_options_fingerprint

    prof = tmp_path / "p.yaml"
    text = (ROOT / "fixer" / "npu" / "profiles" / "stm32n6.yaml").read_text(encoding="utf-8")
    prof.write_text(text, encoding="utf-8")
    opts = AnalysisOptions(target_profile=str(prof))

    def compute():
        return options_fingerprint(opts, load_profile(str(prof)), None)

    first = remembered_options_fingerprint(tmp_path / "c", opts, compute)
    assert first == compute()
    assert remembered_options_fingerprint(tmp_path / "c", opts, lambda: pytest.fail("memo not used")) == first
    prof.write_text(text.replace("name: stm32n6", "name: stm32n6-edited", 1), encoding="utf-8")
    second = remembered_options_fingerprint(tmp_path / "c", opts, compute)
    assert second != first and second == compute()
    # a memo that does not read back is computed again
    for f in (tmp_path / "c").rglob("*.fp"):
        f.write_text("{not json", encoding="utf-8")
    assert remembered_options_fingerprint(tmp_path / "c", opts, compute) == second


@pytest.mark.parametrize("args, message", [
    (["-j", "-1"], "-1 is below the minimum 0"),
    (["-j", "x"], "'x' is not an integer"),
    (["-f", "nope"], "'nope' is not one of 'table'"),
    (["--timeout", "abc"], "'abc' is not a number"),
])
def test_light_coercion_refuses_bad_values_in_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["audit", str(ROOT / "sample_models" / "classifier_softmax.onnx"), *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and message in err and len(err.splitlines()) == 1


def test_light_coercion_gives_typed_values(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NAFIX_CACHE_DIR", str(tmp_path))
    seen = {}
    import fixer.zoo.runner as runner

    real = runner.audit_rows

    def spy(paths, analysis, zoo, **kw):
        seen.update(paths=paths, analysis=analysis, zoo=zoo)
        return real(paths, analysis, zoo, **kw)

    monkeypatch.setattr(runner, "audit_rows", spy)
    with pytest.raises(SystemExit) as exc:
        main(["audit", str(ROOT / "sample_models" / "classifier_softmax.onnx"), "-j", " 1", "--timeout", "inf",
              "--input-shape", "image=1,3,64,64", "-f", "json", "--fail-on", "never"])
    assert exc.value.code == 0
    assert seen["zoo"].jobs == 1 and isinstance(seen["zoo"].jobs, int) and seen["zoo"].timeout is None
    assert dict(seen["analysis"].input_shapes) == {"image": (1, 3, 64, 64)}
    assert json.loads(capsys.readouterr().out)["models"][0]["estimate"]["sw_epochs"] >= 1
