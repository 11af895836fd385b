"""The pre-commit hook, run by the real ``pre-commit`` tool in a temporary git repository.

Offline and fast: the test's config is a ``repo: local`` hook with ``language: system`` whose entry,
args and file filter are those of the shipped ``.pre-commit-hooks.yaml``, with ``nafix`` pointing at
this interpreter's console script (pre-commit would otherwise clone the repository and build a venv).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_zoo import softmax_chain
from tests.helpers import save

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / ".pre-commit-hooks.yaml"
NAFIX = Path(sys.executable).parent / "nafix"

pytest.importorskip("pre_commit")
if shutil.which("git") is None:  # pragma: no cover
    pytest.skip("git is not installed", allow_module_level=True)


def shipped_hook() -> dict:
    (hook,) = [h for h in yaml.safe_load(MANIFEST.read_text()) if h["id"] == "nafix-audit"]
    return hook


def test_shipped_manifest_is_valid_for_pre_commit():
    proc = subprocess.run([sys.executable, "-m", "pre_commit", "validate-manifest", str(MANIFEST)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hook = shipped_hook()
    assert hook["files"] == r"\.(onnx|tflite)$" and hook["entry"].split()[:2] == ["nafix", "audit"]
    assert hook.get("pass_filenames", True) is True


class Repo:
    def __init__(self, path: Path, env: dict):
        self.path, self.env = path, env

    def run(self, *args, check=True) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(map(str, args)), cwd=self.path, env=self.env, capture_output=True, text=True)
        if check:
            assert proc.returncode == 0, f"{args}: {proc.stdout}{proc.stderr}"
        return proc

    def configure(self, args: list[str] | None) -> None:
        """The shipped hook as a local hook; ``args`` None keeps the shipped default args."""
        hook = shipped_hook()
        entry = hook["entry"].split()
        assert entry[0] == "nafix"
        local = {k: v for k, v in hook.items() if k in ("id", "name", "files", "types", "require_serial", "args")}
        local.update({"entry": " ".join([str(NAFIX)] + entry[1:]), "language": "system"})
        if args is not None:
            local["args"] = args
        (self.path / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [{"repo": "local", "hooks": [local]}]}))
        self.run("git", "add", ".pre-commit-config.yaml")

    def commit(self, message: str) -> tuple[int, str]:
        """(exit code, everything git and the hook printed: pre-commit writes to git's stderr)."""
        proc = self.run("git", "commit", "-m", message, check=False)
        return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def repo(tmp_path) -> Repo:
    path = tmp_path / "ml-repo"
    path.mkdir()
    env = dict(os.environ, PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"), GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com",
               HOME=str(tmp_path))
    r = Repo(path, env)
    r.run("git", "init", "-q")
    r.run("git", "config", "commit.gpgsign", "false")
    r.run(sys.executable, "-m", "pre_commit", "install")
    return r


def test_hook_refuses_a_new_sw_node_and_baseline_lets_known_ones_pass(repo):
    models = repo.path / "models"
    models.mkdir()
    save(softmax_chain(1), models / "net.onnx")  # one Softmax: estimated SW

    # shipped default (--fail-on sw): the SW node is refused
    repo.configure(None)
    repo.run("git", "add", "models/net.onnx")
    code, text = repo.commit("add net")
    assert code != 0, text
    assert "nafix audit" in text and "Failed" in text and "softmax0" in text
    assert repo.run("git", "rev-parse", "--verify", "HEAD", check=False).returncode != 0  # nothing committed

    # baseline written first: the same commit passes
    repo.run(NAFIX, "audit", "models", "--write-baseline", "nafix-baseline.json")
    base = json.loads((repo.path / "nafix-baseline.json").read_text())
    assert list(base["models"]) == ["models/net.onnx"] and list(base["models"]["models/net.onnx"]["sw_nodes"]) == ["softmax0"]
    repo.configure(readme_baseline_args())
    repo.run("git", "add", "nafix-baseline.json", "models/net.onnx")
    code, text = repo.commit("add net with its baseline")
    assert code == 0, text
    assert "nafix audit" in text and "Passed" in text

    # made worse (a second Softmax): refused, naming the new node
    save(softmax_chain(2), models / "net.onnx")
    repo.run("git", "add", "models/net.onnx")
    code, text = repo.commit("worse net")
    assert code != 0, text
    assert "new: models/net.onnx: new SW node 'softmax1'" in text
    assert "new SW node 'softmax0'" not in text  # the known node is not reported again

    # fixed (no Softmax left): an improvement never fails
    save(softmax_chain(0), models / "net.onnx")
    repo.run("git", "add", "models/net.onnx")
    code, text = repo.commit("fixed net")
    assert code == 0, text


def readme_baseline_args() -> list[str]:
    """The baseline variant's ``args:`` exactly as the README writes it: it keeps the hook's --fail-on."""
    text = (ROOT / "README.md").read_text().split("**pre-commit.**", 1)[1]
    args = yaml.safe_load(text.split("`args: ", 1)[1].split("`", 1)[0])
    assert args[:2] == ["--fail-on", "sw"] and "--baseline" in args
    return args


def test_hook_checks_tflite_models(repo):
    models = repo.path / "models"
    models.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "tflite" / "int8_cnn.tflite", models / "det.tflite")  # a SW Softmax
    repo.configure(None)
    repo.run("git", "add", "models/det.tflite")
    code, text = repo.commit("add a tflite")
    assert code != 0 and "Failed" in text, text


def test_readme_rev_exists_in_this_repository():
    text = (ROOT / "README.md").read_text()
    block = text.split("**pre-commit.**", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    (entry,) = yaml.safe_load(block)
    probe = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--git-dir"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{entry['rev']}^{{commit}}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"README rev {entry['rev']!r} is not a commit of this repository"


def test_hook_ignores_commits_without_onnx_files(repo):
    repo.configure(None)
    (repo.path / "README.md").write_text("hello\n")
    repo.run("git", "add", "README.md")
    code, text = repo.commit("docs")
    assert code == 0 and "(no files to check)" in text, text


def test_readme_documents_four_config_lines_for_the_shipped_hook():
    text = (ROOT / "README.md").read_text()
    block = text.split("**pre-commit.**", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert len(lines) == 4
    (entry,) = yaml.safe_load(block)
    assert set(entry) == {"repo", "rev", "hooks"} and entry["hooks"] == [{"id": shipped_hook()["id"]}]


def test_hook_reads_the_repository_config(repo):
    """[tool.nafix] in the ML repository's pyproject.toml reaches the hook with no args repeated."""
    models = repo.path / "models"
    models.mkdir()
    save(softmax_chain(1), models / "net.onnx")  # one Softmax: SW unless stedgeai expands it
    repo.configure(None)
    repo.run("git", "add", "models/net.onnx")
    code, text = repo.commit("add net")
    assert code != 0 and "softmax0" in text, text
    (repo.path / "pyproject.toml").write_text('[tool.nafix]\nstedgeai-option = ["--expand-softmax"]\n')
    repo.run("git", "add", "pyproject.toml", "models/net.onnx")
    code, text = repo.commit("add net, built with --expand-softmax")
    assert code == 0 and "Passed" in text, text
