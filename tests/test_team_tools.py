"""Issue 37, the parts a team meets: accepting findings (--select-finding/--ignore-finding, per path in
the config), tables that do not wrap in CI logs, the facts document the reasons link to, SARIF rules
with their fact and fixing NAF rule."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli as run

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "sample_models" / "classifier_softmax.onnx"  # one SW node: its final Softmax
RESIZE = ROOT / "sample_models" / "movenet_like.onnx"  # three SW bilinear Resize


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NAFIX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


# --- findings selection ---------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--ignore-finding", "--ignore"])
@pytest.mark.parametrize("item", ["Softmax", "sw_op:Softmax"])
def test_ignored_softmax_is_accepted_and_counted(flag, item, capsys):
    code, out, err = run(["audit", SOFTMAX, "-f", "json", "--fail-on", "sw", flag, item], capsys)
    assert code == 0, err  # the only SW epoch is accepted
    report = json.loads(out)
    (row,) = report["models"]
    assert row["sw_nodes"] == [] and [n["op_type"] for n in row["ignored_sw_nodes"]] == ["Softmax"]
    assert row["estimate"]["sw_epochs"] == 1  # the estimate does not hide it
    assert row["selection"]["ignored_sw_nodes"] == 1 and row["selection"]["sw_epochs_counted"] == 0
    assert report["selection"] == {"ignored_sw_nodes": 1, "ignored_findings": 0, "models": 1, "by": {"Softmax": 1}}
    code, out, _ = run(["audit", SOFTMAX, "--fail-on", "sw"], capsys)
    assert code == 1  # without it, the same model fails


def test_ignoring_another_op_changes_nothing(capsys):
    code, out, _ = run(["audit", SOFTMAX, "-f", "json", "--fail-on", "sw", "--ignore-finding", "Resize"], capsys)
    assert code == 1
    (row,) = json.loads(out)["models"]
    assert [n["op_type"] for n in row["sw_nodes"]] == ["Softmax"] and not row.get("ignored_sw_nodes")


def test_select_keeps_only_what_it_names(capsys):
    code, out, _ = run(["audit", SOFTMAX, RESIZE, "-f", "json", "--fail-on", "sw",
                        "--select-finding", "resize_nearest_asymmetric"], capsys)
    assert code == 1  # the Resize nodes still count
    rows = {Path(r["path"]).name: r for r in json.loads(out)["models"]}
    assert rows["classifier_softmax.onnx"]["sw_nodes"] == []
    assert rows["classifier_softmax.onnx"]["selection"]["sw_epochs_counted"] == 0
    assert {n["op_type"] for n in rows["movenet_like.onnx"]["sw_nodes"]} == {"Resize"}


@pytest.mark.parametrize("fmt, marker", [("table", "ignored (accepted"), ("concise", "ignored (accepted"),
                                         ("github", "title=nafix%3A ignored findings"),
                                         ("markdown", "ignored (accepted")])
def test_every_format_reports_the_ignored_count(fmt, marker, capsys):
    code, out, _ = run(["audit", SOFTMAX, "-f", fmt, "--ignore", "Softmax"], capsys)
    assert code == 0 and marker in out and "Softmax x1" in out


def test_sarif_keeps_ignored_findings_as_suppressed_results(capsys):
    from tests.test_report_formats import sarif_schema

    jsonschema = pytest.importorskip("jsonschema")
    code, out, _ = run(["audit", SOFTMAX, "-f", "sarif", "--ignore", "Softmax"], capsys)
    sarif = json.loads(out)
    jsonschema.Draft4Validator(sarif_schema()).validate(sarif)
    (res,) = sarif["runs"][0]["results"]
    assert res["ruleId"] == "sw_op:Softmax" and res["suppressions"][0]["kind"] == "external"


@pytest.mark.parametrize("args, message", [
    (["--ignore", "NAF012"], "NAF012 is a rewrite rule"),
    (["--select-finding", "resize_nearest_asymetric"], "did you mean 'resize_nearest_asymmetric'"),
    (["--ignore-finding", " "], "an empty item"),
])
def test_bad_selection_is_one_error_line(args, message, capsys):
    code, out, err = run(["audit", SOFTMAX, *args], capsys)
    assert code == 2 and err.startswith("error: ") and message in err and len(err.splitlines()) == 1


def test_per_path_ignore_in_the_config(tmp_path, monkeypatch, capsys):
    (tmp_path / "models" / "cls").mkdir(parents=True)
    (tmp_path / "models" / "other").mkdir(parents=True)
    shutil.copy(SOFTMAX, tmp_path / "models" / "cls" / "a.onnx")
    shutil.copy(SOFTMAX, tmp_path / "models" / "other" / "b.onnx")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.nafix]\nfail-on = "sw"\n\n[tool.nafix.per-path."models/cls/*.onnx"]\nignore-finding = ["Softmax"]\n')
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(["audit", "models", "-f", "json"], capsys)
    rows = {Path(r["path"]).parent.name: r for r in json.loads(out)["models"]}
    assert rows["cls"]["sw_nodes"] == [] and rows["cls"]["selection"]["ignored_sw_nodes"] == 1
    assert [n["op_type"] for n in rows["other"]["sw_nodes"]] == ["Softmax"]
    assert code == 1  # models/other still has its Softmax
    code, _, _ = run(["audit", "models/cls/a.onnx"], capsys)
    assert code == 0
    # the command line wins over the file
    code, out, _ = run(["audit", "models/cls/a.onnx", "-f", "json", "--ignore-finding", "Resize"], capsys)
    assert code == 1 and json.loads(out)["models"][0]["sw_nodes"]
    # `fix`'s ignore (NAF rules) is another key: the finding key does not reach it
    code, out, _ = run(["config", "--command", "fix"], capsys)
    assert "ignore = " in out and "Softmax" not in out


def test_a_bad_item_in_the_config_names_its_key(tmp_path, monkeypatch, capsys):
    shutil.copy(SOFTMAX, tmp_path / "a.onnx")
    (tmp_path / "nafix.toml").write_text('ignore-finding = ["sw_op:Softmax", "batchnorm_foldd"]\n')
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["audit", "a.onnx"], capsys)
    assert code == 2 and "nafix.toml:ignore-finding" in err and "batchnorm_folded" in err


# --- no wrapping when stdout is not a terminal ---------------------------------------------------------

def test_table_rows_are_not_wrapped_in_a_pipe(tmp_path):
    deep = tmp_path / ("a_rather_long_folder_name_for_the_team_models_" * 2) / "more_nesting_here"
    deep.mkdir(parents=True)
    name = "denoiser_with_a_long_file_name_after_the_simplifier.nafix.onnx"
    shutil.copy(ROOT / "sample_models" / "denoiser_257.onnx", deep / name)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update(NAFIX_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "fixer.cli", "audit", str(deep / name), "-v"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("│")]
    assert rows and any(name in ln for ln in rows), p.stdout  # the whole name on one line of the table
    assert all(ln.count("│") == rows[0].count("│") for ln in rows)  # one line per model: no continuation lines
    assert max(len(ln) for ln in p.stdout.splitlines()) > 80  # not cut at Rich's default 80 columns
    env["COLUMNS"] = "60"  # an explicit width is still honoured
    p = subprocess.run([sys.executable, "-m", "fixer.cli", "audit", str(deep / name)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert max(len(ln) for ln in p.stdout.splitlines() if ln.startswith(("│", "┃"))) <= 60


# --- the facts document and the links to it ------------------------------------------------------------

FACTS = ROOT / "docs" / "NPU_FACTS.md"
LINK = re.compile(r"NPU_FACTS\.md#([A-Za-z0-9_-]+)")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    ids = set(re.findall(r'<a id="([^"]+)"></a>', text))
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):  # GitHub's heading slugs
        ids.add(re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-"))
    return ids


def test_every_link_to_the_facts_doc_names_an_anchor_it_has():
    anchors = _anchors(FACTS)
    files = [p for p in (ROOT / "fixer").rglob("*") if p.suffix in (".py", ".yaml")]
    files += list((ROOT / "rules").glob("*.yaml")) + list((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    links = {(p.relative_to(ROOT).as_posix(), a) for p in files for a in LINK.findall(p.read_text(encoding="utf-8"))}
    assert len(links) > 30
    missing = sorted(link for link in links if link[1] not in anchors)
    assert not missing, missing
    # an anchor is not a section heading by accident: the doc has the ones the reasons use
    assert {"softmax", "resize", "prime-channels", "geometry", "hangs", "graph-edge-qdq"} <= anchors


def test_every_constraint_and_rule_link_resolves():
    from fixer.facts import CONSTRAINT_ANCHORS, OP_ANCHORS, anchor
    from fixer.npu.constraints import REGISTRY
    from fixer.rules import PLACEMENT_REASONS

    anchors = _anchors(FACTS)
    assert set(REGISTRY) | set(PLACEMENT_REASONS) <= set(CONSTRAINT_ANCHORS)  # every constraint has its fact
    for cid in list(CONSTRAINT_ANCHORS) + [f"sw_op:{op}" for op in OP_ANCHORS] + ["sw_op:Nope", "lowering:X"]:
        assert anchor(cid) in anchors, cid
    rules_md = (ROOT / "docs" / "RULES.md").read_text(encoding="utf-8")
    from fixer.rule_index import builtin_rule_refs

    for r in builtin_rule_refs():
        assert f"## {r.id} {r.name}\n" in rules_md  # rule_url's anchor: the heading's GitHub slug


def test_no_reason_cites_a_file_outside_the_project():
    files = [p for p in (ROOT / "fixer").rglob("*") if p.suffix in (".py", ".yaml")]
    files += list((ROOT / "rules").glob("*.yaml")) + [ROOT / "docs" / "RULES.md", ROOT / "README.md"]
    assert not [p.name for p in files if "NEURAL_ART" in p.read_text(encoding="utf-8")]


# --- SARIF: helpUri and the fixing rule -------------------------------------------------------------------

def test_sarif_rules_link_their_fact_and_name_the_fixing_rule(capsys, monkeypatch):
    from tests.test_report_formats import sarif_schema

    jsonschema = pytest.importorskip("jsonschema")
    monkeypatch.setenv("NAFIX_DOCS_URL", "https://example.org/nafix/docs/")
    code, out, _ = run(["audit", SOFTMAX, RESIZE, "-f", "sarif"], capsys)
    sarif = json.loads(out)
    jsonschema.Draft4Validator(sarif_schema()).validate(sarif)
    rules = {r["id"]: r for r in sarif["runs"][0]["tool"]["driver"]["rules"]}
    soft, resize = rules["sw_op:Softmax"], rules["resize_nearest_asymmetric"]
    assert soft["helpUri"] == "https://example.org/nafix/docs/NPU_FACTS.md#softmax"
    assert resize["helpUri"] == "https://example.org/nafix/docs/NPU_FACTS.md#resize"
    assert "NAF012 drop-trailing-softmax" in soft["help"]["text"] and "--extend-select NAF012" in soft["help"]["text"]
    assert "NAF003 bilinear-resize" in resize["help"]["text"] and resize["properties"]["nafixRules"] == ["NAF003"]
    assert "(https://example.org/nafix/docs/RULES.md#naf003-bilinear-resize)" in resize["help"]["markdown"]
    for res in sarif["runs"][0]["results"]:
        assert rules[res["ruleId"]]["helpUri"].startswith("https://example.org/")


def test_sarif_help_uri_without_docs_url_is_a_file_that_exists(capsys, monkeypatch):
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    monkeypatch.delenv("NAFIX_DOCS_URL", raising=False)
    code, out, _ = run(["audit", SOFTMAX, "-f", "sarif"], capsys)
    (rule,) = json.loads(out)["runs"][0]["tool"]["driver"]["rules"]
    url = urlparse(rule["helpUri"])
    assert url.scheme == "file" and url.fragment == "softmax" and Path(url2pathname(url.path)).is_file()


# --- help pages ----------------------------------------------------------------------------------------

@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")


@pytest.mark.parametrize("args", [["--help"], ["audit", "--help"], ["fix", "--help"], ["rules", "--help"]])
def test_flags_show_no_value_placeholder(args, wide, capsys):
    code, out, err = run(args, capsys)
    assert code == 0 and "Usage" in out
    assert "<bool>" not in out
    line = next(ln for ln in out.splitlines() if "--help" in ln and "Show this message" in ln)
    assert "<" not in line


def test_help_keeps_square_brackets(wide, capsys):
    code, out, _ = run(["audit", "--help"], capsys)
    assert "'nafix[dask]'" in out


def test_bare_nafix_prints_the_help_once(wide, capsys):
    code, out, err = run([], capsys)
    assert code == 2 and (out + err).count("Usage: nafix") == 1 and "Commands" in out + err


def test_fix_help_groups_its_options(wide, capsys):
    code, out, _ = run(["fix", "--help"], capsys)
    panels = re.findall(r"╭─ (.+?) ─", out)
    assert {"Output", "Rules", "Verification and exit code", "Target and build options",
            "Compile with stedgeai (--compile)", "Quantize (--quantize)"} <= set(panels), panels
    quantize = out[out.index("Quantize (--quantize)"):]
    assert "--calib-mean" in quantize and "--select" not in quantize


def test_rules_id_is_rendered_on_a_terminal_and_markdown_in_a_pipe(monkeypatch, capsys):
    import io

    from fixer import cli

    code, piped, _ = run(["rules", "NAF003"], capsys)  # stdout is not a terminal here
    assert code == 0 and piped.startswith("## NAF003 bilinear-resize\n") and "**Why.**" in piped
    buf = io.StringIO()
    monkeypatch.setattr(cli, "out", cli._Console(file=buf, force_terminal=True, width=100, color_system=None))
    code, _, _ = run(["rules", "NAF003"], capsys)
    shown = buf.getvalue()
    assert code == 0 and "NAF003 bilinear-resize" in shown and "Why." in shown
    assert "## " not in shown and "**" not in shown  # rendered, not raw Markdown
    assert max(len(ln) for ln in shown.splitlines()) <= 100  # wrapped to the terminal
    buf.truncate(0)
    code, out, _ = run(["rules", "NAF003", "--markdown"], capsys)  # asked for: Markdown on a terminal too
    assert code == 0 and out.startswith("## NAF003 bilinear-resize\n")


def test_merged_shards_keep_the_ignored_counts(tmp_path, capsys):
    reports = []
    for k in (1, 2):
        out = tmp_path / f"s{k}.json"
        code, _, err = run(["audit", SOFTMAX, RESIZE, "--shard", f"{k}/2", "-f", "json", "-o", out,
                            "--ignore", "Softmax", "--ignore", "Resize"], capsys)
        assert code == 0, err
        reports.append(out)
    code, out, _ = run(["audit", "merge", *reports, "-f", "json"], capsys)
    merged = json.loads(out)
    assert code == 0 and merged["selection"]["ignored_sw_nodes"] == 4
    assert merged["selection"]["by"] == {"Resize": 3, "Softmax": 1}


def test_an_accepted_memory_finding_is_not_a_baseline_regression(tmp_path, capsys):
    big = ROOT / "sample_models" / "big_activations.onnx"  # does not fit on-chip
    empty = tmp_path / "base.json"
    code, _, _ = run(["audit", SOFTMAX, "--write-baseline", empty], capsys)  # a baseline without the model
    assert code == 0
    code, _, err = run(["audit", big, "--baseline", empty, "--ignore", "GlobalAveragePool"], capsys)
    assert code == 1 and "do not fit in the on-chip memory" in err
    code, _, err = run(["audit", big, "--baseline", empty, "--ignore", "GlobalAveragePool",
                        "--ignore", "activations_on_chip"], capsys)
    assert code == 0, err
