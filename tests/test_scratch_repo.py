"""Issue 37's "done when": a scratch repository whose pyproject.toml holds the team's nafix settings
(core, a stedgeai option, a per-path input shape, an accepted finding) gets the same results from a
developer's `nafix audit`, the real pre-commit hook and the CI run (`-f github`), with no flag
repeated on any of them. pre-commit runs offline, as in tests/test_precommit.py."""

from __future__ import annotations

import json
import shutil

from tests.test_precommit import NAFIX, ROOT, Repo, repo  # noqa: F401  (fixture)

PYPROJECT = """\
[project]
name = "scratch-models"

[tool.nafix]
core = "2.2"
stedgeai-option = ["--input-data-type float32"]
fail-on = "sw"
ignore-finding = ["Softmax"]  # the team accepts SW Softmax heads

[tool.nafix.per-path."models/dyn/*.onnx"]
input-shape = ["image=1,3,64,64"]
"""


def _dynamic_classifier(path):
    """sample_models/classifier_softmax.onnx with its input's height and width made symbolic."""
    import onnx

    m = onnx.load(str(ROOT / "sample_models" / "classifier_softmax.onnx"))
    dims = m.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "h", "w"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))


def _cli(repo, *args):
    return repo.run(NAFIX, "audit", *args, check=False)


def test_config_gives_the_same_results_from_cli_hook_and_ci(repo, tmp_path):  # noqa: F811
    repo.env.update(NAFIX_CACHE_DIR=str(tmp_path / "cache"), GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"))
    repo.env.pop("COLUMNS", None)
    (repo.path / "pyproject.toml").write_text(PYPROJECT)
    _dynamic_classifier(repo.path / "models" / "dyn" / "net.onnx")
    repo.configure(None)  # the shipped hook as shipped: no args of the team's
    repo.run("git", "add", "pyproject.toml", "models/dyn/net.onnx")

    # 1. the developer's shell: every value from the file
    dev = _cli(repo, "models/dyn/net.onnx", "-f", "json")
    assert dev.returncode == 1, dev.stderr  # fail-on = "sw" from the file
    (row,) = json.loads(dev.stdout)["models"]
    assert row["error"] is None and row["estimate"]["core"] == "2.2"  # core from the file
    assert any("pinned to 64" in d for d in row["dynamic_dims"])  # the per-path input shape
    # the stedgeai option from the file makes the float input's QuantizeLinear an SW epoch ...
    assert [(n["name"], n["constraints"][0]) for n in row["sw_nodes"]] == [("image_QuantizeLinear", "graph_edge_quantize")]
    # ... and the accepted Softmax is set aside, counted, not lost
    assert [n["op_type"] for n in row["ignored_sw_nodes"]] == ["Softmax"] and row["estimate"]["sw_epochs"] == 2
    table = _cli(repo, "models/dyn/net.onnx")
    assert table.returncode == 1

    # 2. the real pre-commit hook refuses the commit for the same reason
    code, hook = repo.commit("add the classifier")
    assert code != 0 and "Failed" in hook, hook
    assert "'image_QuantizeLinear' quantizes the float graph input" in hook
    assert "Softmax x1); they do not count" in hook  # the accepted finding, counted
    assert "core 2.2" in hook

    # 3. CI mode: the same finding as an annotation, the accepted one counted, the same exit code
    ci = _cli(repo, "models", "-f", "github")
    assert ci.returncode == 1
    warnings = [ln for ln in ci.stdout.splitlines() if ln.startswith("::warning")]
    assert len(warnings) == 1 and "graph_edge_quantize" in warnings[0] and "models/dyn/net.onnx" in warnings[0]
    assert any(ln.startswith("::notice title=nafix%3A ignored findings") and "Softmax x1" in ln
               for ln in ci.stdout.splitlines())
    assert "ignored (accepted" in (tmp_path / "summary.md").read_text()

    # the team accepts the float input for these models in the file: all three pass, still no flags
    (repo.path / "pyproject.toml").write_text(PYPROJECT + 'ignore-finding = ["Softmax", "graph_edge_quantize"]\n')
    repo.run("git", "add", "pyproject.toml")
    dev = _cli(repo, "models/dyn/net.onnx", "-f", "json")
    assert dev.returncode == 0, dev.stdout + dev.stderr
    (row,) = json.loads(dev.stdout)["models"]
    assert row["sw_nodes"] == [] and row["selection"]["ignored_sw_nodes"] == 2
    code, hook = repo.commit("add the classifier, float input accepted")
    assert code == 0 and "Passed" in hook, hook
    ci = _cli(repo, "models", "-f", "github")
    assert ci.returncode == 0 and not [ln for ln in ci.stdout.splitlines() if ln.startswith("::warning")]

    # a model outside the per-path table gets the top-level values only: its Softmax is accepted, its
    # float input is not (and the per-path input shape does not apply to it)
    (repo.path / "models" / "cls").mkdir()
    shutil.copy(ROOT / "sample_models" / "classifier_softmax.onnx", repo.path / "models" / "cls" / "c.onnx")
    repo.run("git", "add", "models/cls/c.onnx")
    code, hook = repo.commit("add a second classifier")
    assert code != 0 and "'image_QuantizeLinear' quantizes" in hook, hook
    assert _cli(repo, "models/cls/c.onnx").returncode == 1
    ci = _cli(repo, "models", "-f", "github")
    assert ci.returncode == 1 and "models/cls/c.onnx" in ci.stdout and "graph_edge_quantize" in ci.stdout
