"""The rule engine, the equivalence gate, rule-file validation and the fix command's file handling,
exercised with test-only rules and rewriters (one correct, one deliberately broken)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fixer.api import FixOptions, fix
from fixer.cli import main
from fixer.errors import RuleError, UsageError
from fixer.rewriters import RewriteResult, rewriter
from fixer.rules import load_rules, parse_rule


@rewriter("test_relu_as_clip")
def _relu_as_clip(match, ed):
    """Test only: replace Relu by an equivalent Clip(min=0)."""
    node = match.node
    zero = ed.const(np.array(0.0, dtype=np.float32))
    clip = ed.node("Clip", [node.inputs[0], zero], dtype=np.float32, shape=node.outputs[0].shape)
    ed.replace_uses(node.outputs[0], clip.outputs[0])
    ed.remove(node)
    return RewriteResult(detail=f"replaced '{node.name}' by a Clip")


@rewriter("test_broken_identity")
def _broken(match, ed):
    """Test only: a WRONG rewrite (Relu -> Identity) that the equivalence gate must catch."""
    node = match.node
    ident = ed.node("Identity", [node.inputs[0]], dtype=np.float32, shape=node.outputs[0].shape)
    ed.replace_uses(node.outputs[0], ident.outputs[0])
    ed.remove(node)
    return RewriteResult(detail=f"replaced '{node.name}' by an Identity")


def _rule_yaml(rid: str, name: str, rewriter_name: str, contract: str = "exact", **extra) -> str:
    data = {
        "id": rid, "name": name, "summary": "test rule", "why": "test rule for the engine tests",
        "references": ["tests"], "fixes": ["quantized_activations"],
        "match": {"op": "Relu", "when": [{"predicate": "fails_constraint", "constraint": "quantized_activations"}]},
        "rewrite": {"rewriter": rewriter_name}, "verify": {"contract": contract},
    }
    data.update(extra)
    import yaml

    return yaml.safe_dump(data)


@pytest.fixture()
def rules_dir(tmp_path: Path) -> Path:
    d = tmp_path / "myrules"
    d.mkdir()
    (d / "TST901-relu-as-clip.yaml").write_text(_rule_yaml("TST901", "relu-as-clip", "test_relu_as_clip"))
    (d / "TST902-broken.yaml").write_text(_rule_yaml("TST902", "broken", "test_broken_identity"))
    return d


def _relu_model(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_fix_writes_verified_model_report_and_provenance(tmp_path, rules_dir):
    src = _relu_model(tmp_path / "m.onnx")
    digest = _sha(src)
    res = fix(src, FixOptions(rules_dirs=(str(rules_dir),), select=("TST901",)))
    assert res.verified and res.written
    assert _sha(src) == digest, "the input must never change"
    out = tmp_path / "m.nafix.onnx"
    assert res.output == out and out.exists()
    m = onnx.load(str(out))
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["nafix.rules"] == "TST901" and meta["nafix.verified"] == "yes" and "nafix.version" in meta
    clip = [n for n in m.graph.node if n.op_type == "Clip"]
    assert clip and clip[0].name.startswith("relu__nafix_") and clip[0].doc_string == "nafix.rule=TST901"
    assert [o.name for o in m.graph.output] == ["y"], "graph output names are kept"
    report = json.loads((tmp_path / "m.nafix.json").read_text())
    for key in ("input", "output", "estimate", "changes", "verification", "io"):
        assert key in report
    assert report["changes"][0]["rule"] == "TST901"
    assert report["verification"]["ok"] is True
    assert report["verification"]["outputs"][0]["max_abs_error"] == 0.0
    assert set(report["estimate"]["before"]) >= {"epochs", "sw_epochs", "hw_ratio"}


def test_broken_rewriter_is_caught_by_the_gate_and_nothing_is_written(tmp_path, rules_dir, capsys):
    src = _relu_model(tmp_path / "m.onnx")
    res = fix(src, FixOptions(rules_dirs=(str(rules_dir),), select=("TST902",)))
    assert not res.verified and not res.written
    assert res.verification.rules == ["TST902"]
    assert not (tmp_path / "m.nafix.onnx").exists() and not (tmp_path / "m.nafix.json").exists()
    with pytest.raises(SystemExit) as exc:
        main(["fix", str(src), "--rules", str(rules_dir), "--select", "TST902"])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "verification failed" in err and "TST902" in err
    assert not (tmp_path / "m.nafix.onnx").exists()
    # --keep-failed writes it anyway, marked as unverified
    res = fix(src, FixOptions(rules_dirs=(str(rules_dir),), select=("TST902",), keep_failed=True))
    assert res.written
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "m.nafix.onnx")).metadata_props}
    assert meta["nafix.verified"].startswith("NO")


def test_bare_model_argument_is_fix_and_dry_run_writes_nothing(tmp_path, rules_dir, capsys):
    src = _relu_model(tmp_path / "m.onnx")
    with pytest.raises(SystemExit) as exc:
        main([str(src), "--rules", str(rules_dir), "--select", "TST901", "--dry-run"])
    assert exc.value.code == 0
    assert "TST901" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "myrules"]


def test_output_handling_never_overwrites_foreign_files(tmp_path, rules_dir):
    src = _relu_model(tmp_path / "m.onnx")
    opts = dict(rules_dirs=(str(rules_dir),), select=("TST901",))
    with pytest.raises(UsageError, match="refusing to write over the input"):
        fix(src, FixOptions(output=str(src), **opts))
    foreign = tmp_path / "other.onnx"
    foreign.write_bytes(b"user data")
    with pytest.raises(UsageError, match="not written by nafix"):
        fix(src, FixOptions(output=str(foreign), **opts))
    assert foreign.read_bytes() == b"user data"
    assert fix(src, FixOptions(output=str(foreign), force=True, **opts)).written
    # a previous nafix output is replaced without --force
    assert fix(src, FixOptions(**opts)).written
    assert fix(src, FixOptions(**opts)).written
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_nothing_to_fix_exits_zero_and_fail_on_sw(tmp_path, rules_dir):
    src = _relu_model(tmp_path / "m.onnx")
    with pytest.raises(SystemExit) as exc:
        main(["fix", str(src), "--rules", str(rules_dir), "--ignore", "TST901", "--ignore", "TST902", "--dry-run"])
    assert exc.value.code == 0
    with pytest.raises(SystemExit) as exc:
        main(["fix", str(src), "--rules", str(rules_dir), "--ignore", "TST901", "--ignore", "TST902",
              "--dry-run", "--fail-on", "sw"])
    assert exc.value.code == 1


def test_unknown_rule_selection_is_a_usage_error(tmp_path, rules_dir, capsys):
    src = _relu_model(tmp_path / "m.onnx")
    with pytest.raises(SystemExit) as exc:
        main(["fix", str(src), "--rules", str(rules_dir), "--select", "TST91"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown rule 'TST91'" in err and "did you mean" in err


@pytest.mark.parametrize(
    "mutate,where,message",
    [
        (lambda d: d["match"]["when"][0].update(predicate="fails_constrant"), "match.when[0].predicate",
         "did you mean 'fails_constraint'"),
        (lambda d: d.update(whyy="x"), "whyy", "did you mean 'why'"),
        (lambda d: d.pop("why"), "why", "is required"),
        (lambda d: d["verify"].update(contract="exakt"), "verify.contract", "did you mean 'exact'"),
        (lambda d: d["rewrite"].update(rewriter="test_relu_as_clp"), "rewrite.rewriter",
         "did you mean 'test_relu_as_clip'"),
        (lambda d: d["rewrite"].update(params={"chunk": 3}), "rewrite.params.chunk", "has no parameter"),
        (lambda d: d["match"]["when"][0].update(constraint="awkward_output_channel"), "match.when[0].constraint",
         "did you mean 'awkward_output_channels'"),
        (lambda d: d.update(fixes=["bogus"]), "fixes[0]", "unknown constraint"),
    ],
)
def test_rule_validation_names_file_path_and_suggestion(mutate, where, message):
    import yaml

    data = yaml.safe_load(_rule_yaml("TST903", "case", "test_relu_as_clip"))
    mutate(data)
    with pytest.raises(RuleError) as exc:
        parse_rule(data, "myrules/TST903-case.yaml")
    text = str(exc.value)
    assert text.startswith("myrules/TST903-case.yaml: " + where), text
    assert message in text


def test_rule_file_name_must_match_id_and_ids_are_unique(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "TST904-wrong-name.yaml").write_text(_rule_yaml("TST904", "relu-as-clip", "test_relu_as_clip"))
    with pytest.raises(RuleError, match="must be named TST904-relu-as-clip.yaml"):
        load_rules([d])
    (d / "TST904-wrong-name.yaml").unlink()
    (d / "TST905-a.yaml").write_text(_rule_yaml("TST905", "a", "test_relu_as_clip"))
    (d / "TST905-b.yaml").write_text(_rule_yaml("TST905", "b", "test_relu_as_clip"))
    with pytest.raises(RuleError, match="already used"):
        load_rules([d])


def test_every_registered_predicate_and_rewriter_has_a_docstring():
    from fixer.predicates import PREDICATES
    from fixer.rewriters import REWRITERS, load_all

    load_all()
    assert PREDICATES and REWRITERS
    for p in PREDICATES.values():
        assert len(p.doc) > 20, p.name
    for r in REWRITERS.values():
        assert len(r.doc) > 20, r.name


def test_rules_markdown_is_up_to_date():
    from fixer.report import rule_markdown

    committed = Path(__file__).resolve().parents[1] / "docs" / "RULES.md"
    assert committed.exists(), "run: nafix rules --markdown -o docs/RULES.md"
    assert committed.read_text() == rule_markdown(load_rules()), "docs/RULES.md is stale: nafix rules --markdown -o docs/RULES.md"
