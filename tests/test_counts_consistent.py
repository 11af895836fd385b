"""The audit's header totals, its per-node SW rows and its grouped reasons are one account of the
estimated epochs (issue 34, "counts that add up"): every SW/hybrid epoch belongs to exactly one
SW-node row, the groups partition the rows, and every renderer (JSON, console, Markdown) shows the
same totals. Checked on the committed sample models and on every model of ../shared/models."""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest
from rich.console import Console

from fixer.api import AnalysisOptions, AuditOptions, audit
from fixer.report import audit_markdown, audit_renderables, grouped_row_reasons, status_badge
from fixer.zoo.runner import audit_dict

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
SHARED = ROOT.parent / "shared" / "models"
FLOAT_IO = frozenset({"--input-data-type float32", "--output-data-type float32"})


@lru_cache(maxsize=None)
def report(folder: Path, options: frozenset[str] = frozenset()) -> dict:
    """One in-process audit of a folder (shared by the tests of this module)."""
    res = audit([str(folder)], AuditOptions(analysis=AnalysisOptions(stedgeai_options=options)))
    return audit_dict(res, profile="stm32n6")


def rows(folder: Path, options: frozenset[str] = frozenset()) -> list[dict]:
    return [m for m in report(folder, options)["models"] if not m.get("error")]


def check_row(m: dict) -> None:
    name = Path(m["path"]).name
    e = m["estimate"]
    units = Counter(ep["unit"] for ep in m["epochs"])
    assert len(m["epochs"]) == e["epochs"], name
    assert units["SW"] == e["sw_epochs"] and units["hybrid"] == e["hybrid_epochs"], name
    assert sum(e["sw_ops"].values()) == e["sw_epochs"] and sum(e["hybrid_ops"].values()) == e["hybrid_epochs"], name
    # the SW-node rows partition the SW and hybrid epochs: each one in exactly one row, of its unit
    unit_of = {ep["index"]: ep["unit"] for ep in m["epochs"]}
    owner: dict[int, str] = {}
    for n in m["sw_nodes"]:
        assert n["sw_epochs"] + n["hybrid_epochs"] == len(n["epochs"]), (name, n["name"])
        assert Counter(unit_of[i] for i in n["epochs"]) == Counter(
            {"SW": n["sw_epochs"], "hybrid": n["hybrid_epochs"]}) - Counter(), (name, n["name"])
        for i in n["epochs"]:
            assert i not in owner, (name, i, owner.get(i), n["name"])
            owner[i] = n["name"]
        if not n["epochs"]:  # runs inside another row's epoch: that epoch exists and is counted there
            assert n["in_epoch"] in owner or n["in_epoch"] in {i for r in m["sw_nodes"] for i in r["epochs"]}, (name, n)
    assert sorted(owner) == sorted(i for i, u in unit_of.items() if u != "HW"), name
    # the reported op names of the rows are the estimate's SW/hybrid op counts
    named = Counter()
    for n in m["sw_nodes"]:
        named.update(f"{op}|{unit_of[i]}" for op, i in zip(n["reported_as"], n["epochs"]))
    assert named == Counter({f"{op}|SW": k for op, k in e["sw_ops"].items()}) + Counter(
        {f"{op}|hybrid": k for op, k in e["hybrid_ops"].items()}), name
    # the groups partition the rows' epochs
    groups = grouped_row_reasons(m)
    for unit, key in (("SW", "sw_epochs"), ("hybrid", "hybrid_epochs")):
        assert sum(g.epochs for g in groups if g.unit == unit) == e[key], (name, unit)
        assert sum(n[key] for n in m["sw_nodes"]) == e[key], (name, unit)
    assert sum(len(g.items) for g in groups) >= len([n for n in m["sw_nodes"] if n["why"]]), name


def check_renderers(rep: dict) -> None:
    """The console's "SW xN"/"hybrid xN" lines and the Markdown per-node epochs add up to the header."""
    console = Console(width=400, record=True, color_system=None)
    for r in audit_renderables(rep):
        console.print(r)
    text = console.export_text()
    md = audit_markdown(rep)
    for m in rep["models"]:
        if m.get("error"):
            continue
        name, e = Path(m["path"]).name, m["estimate"]
        block = text.split(f"\n{name}: estimated ", 1)[1].split("\n\n", 1)[0]
        head = re.match(r"(\d+) epochs, (\d+) SW(?:, (\d+) hybrid)?", block)
        assert head and (int(head[1]), int(head[2]), int(head[3] or 0)) == (e["epochs"], e["sw_epochs"], e["hybrid_epochs"]), name
        for unit, key in (("SW", "sw_epochs"), ("hybrid", "hybrid_epochs")):
            shown = sum(int(k) for k in re.findall(rf"^  {unit} x(\d+): ", block, re.M))
            assert shown == e[key], (name, unit, shown, e[key])
        assert f"| `{name}` | {status_badge(m)} | {e['epochs']} | {e['sw_epochs']} | {e['hw_ratio']:.1%} |" in md \
            or f"| `{name}` | **{status_badge(m)}** | {e['epochs']} | {e['sw_epochs']} | {e['hw_ratio']:.1%} |" in md, name
        section = md.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        cells = re.findall(r"^\| `[^`]*` \| [^|]* \| ([^|]*) \|", section, re.M)
        got = Counter()
        for c in cells:
            for k, unit in re.findall(r"(\d+) (SW|hybrid)", c):
                got[unit] += int(k)
        assert (got["SW"], got["hybrid"]) == (e["sw_epochs"], e["hybrid_epochs"]), (name, got)


@pytest.mark.parametrize("options", [frozenset(), FLOAT_IO], ids=["default", "float-io"])
def test_sample_models_counts_add_up(options):
    rep = report(SAMPLES, options)
    assert rows(SAMPLES, options) and any(m["estimate"]["sw_epochs"] for m in rows(SAMPLES, options))
    for m in rows(SAMPLES, options):
        check_row(m)
    check_renderers(rep)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is absent")
def test_shared_models_counts_add_up():
    ok = rows(SHARED)
    assert ok
    for m in ok:
        check_row(m)
    check_renderers(report(SHARED))


@pytest.mark.skipif(not (SHARED / "pele__mobilefacenet_int8_faces.onnx").is_file(), reason="../shared/models is absent")
def test_mobilefacenet_prelu_with_two_reasons_counts_once():
    """The QOperator MobileFaceNet's PRelu fails two requirements (float constant parameter, float
    slope): its 33 epochs are one group listing both, not two groups of 33 (which summed to 144 for
    110 SW epochs)."""
    m = next(r for r in rows(SHARED) if Path(r["path"]).name == "pele__mobilefacenet_int8_faces.onnx")
    prelu = [g for g in grouped_row_reasons(m) if any(op == "PRelu" for _, op, _ in g.items)]
    assert len(prelu) == 1 and prelu[0].epochs == 33 and len(prelu[0].more) == 1


@pytest.mark.skipif(not (SHARED / "sanxia__en_PP-OCRv4_rec_qdq.onnx").is_file(), reason="../shared/models is absent")
def test_pp_ocr_rec_matmul_heads_count_each_epoch():
    """PP-OCRv4 rec's activation x activation MatMuls make one SW Conv epoch per head (8 each): the
    row and its group count 8, not 1 (the groups summed to 82 for 104 SW epochs)."""
    m = next(r for r in rows(SHARED) if Path(r["path"]).name == "sanxia__en_PP-OCRv4_rec_qdq.onnx")
    mm = {n["name"]: n for n in m["sw_nodes"] if n["op_type"] == "MatMul"}
    assert mm and all(n["sw_epochs"] == 8 and n["reported_as"] == ["Conv"] * 8 for n in mm.values())
