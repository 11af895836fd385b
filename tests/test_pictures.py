"""The pictures of a graph (issue 36, "No picture"): the epoch strips of the audit HTML and of the
fix page (``nafix MODEL --html FILE``), rendered in a real headless Chromium where one is
installed; the ``nafix.placement`` / ``nafix.reason`` node metadata of a written model (what
Netron shows); the Model Explorer node-data overlay (``nafix audit MODEL -f model-explorer``)."""

from __future__ import annotations

import importlib
import html
import json
import shutil
import sys
import types
from html.parser import HTMLParser
from pathlib import Path

import onnx
import pytest

from fixer.node_info import FOLDED_REASON, annotate_model, node_infos
from fixer.report_html import BLOCKED, COLOURS, epoch_strip, fix_html, html_status_badge
from tests.helpers import headless_chromium, run_cli as run

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"


def _row(epochs, sw_nodes=(), findings=()):
    return {"path": "m.onnx", "error": None, "epochs": list(epochs), "sw_nodes": list(sw_nodes),
            "findings": list(findings)}


def _ep(i, unit, nodes, ms=None, reported_as=None):
    return {"index": i, "unit": unit, "nodes": nodes, **({"ms": ms} if ms is not None else {}),
            **({"reported_as": reported_as} if reported_as else {})}


class _Rects(HTMLParser):
    """The strips of a page: per <svg class='strip'>, its rects (attributes) and their titles."""

    def __init__(self):
        super().__init__()
        self.strips: list[list[dict]] = []
        self._title: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and "strip" in (a.get("class") or "").split():
            self.strips.append([])
        elif tag == "rect" and self.strips:
            self.strips[-1].append({**a, "title": ""})
        elif tag == "title" and self.strips and self.strips[-1]:
            self._title = self.strips[-1][-1]

    def handle_endtag(self, tag):
        if tag == "title":
            self._title = None

    def handle_data(self, data):
        if self._title is not None:
            self._title["title"] += data


def _strips(page: str) -> list[list[dict]]:
    p = _Rects()
    p.feed(page)
    return p.strips


# -- the strip itself -------------------------------------------------------------------------------


def test_strip_draws_each_epoch_in_order_as_wide_as_its_estimated_time():
    row = _row([_ep(1, "HW", ["conv1"], 1.0), _ep(2, "SW", ["soft<max>"], 3.0), _ep(3, "hybrid", ["up"], 0.0001,
                                                                                          "DepthToSpace")],
               sw_nodes=[{"name": "soft<max>", "reasons": ["Softmax on an axis that is not the channels [3P]"],
                          "from_nodes": ["soft<max>"]}])
    (rects,) = _strips(epoch_strip(row, width=400))
    assert [r["data-unit"] for r in rects] == ["HW", "SW", "hybrid"]
    assert [r["fill"] for r in rects] == [COLOURS["HW"], COLOURS["SW"], COLOURS["hybrid"]]
    w = [float(r["width"]) for r in rects]
    assert w[2] == 2.0  # the minimum: a tiny epoch stays visible
    assert w[1] == pytest.approx(3 * w[0]) and sum(w) == pytest.approx(400)
    xs = [float(r["x"]) for r in rects]
    assert xs == sorted(xs) and xs[1] == pytest.approx(w[0])
    # the hover title names the epoch, its nodes and why they run in SW; names are escaped
    assert "epoch 2: SW, estimated 3.000 ms" in rects[1]["title"] and "soft<max>" in rects[1]["title"]
    assert "Softmax on an axis" in rects[1]["title"]
    assert "<max>" not in epoch_strip(row) and "soft&lt;max&gt;" in epoch_strip(row)


def test_strip_without_a_time_estimate_gives_each_epoch_the_same_width_and_says_so():
    row = _row([_ep(1, "HW", ["a"]), _ep(2, "SW", ["b"]), _ep(3, "HW", ["c"])])
    svg = epoch_strip(row, width=300)
    (rects,) = _strips(svg)
    assert [float(r["width"]) for r in rects] == [100.0, 100.0, 100.0]
    assert "width by epoch count (no time estimate)" in svg


def test_a_model_that_will_not_build_shows_no_green():
    row = _row([_ep(1, "HW", ["a"], 1.0), _ep(2, "SW", ["b"], 1.0)],
               findings=[{"constraint": "uint8_activations", "detail": "x is uint8", "severity": "compile_error"}])
    (rects,) = _strips(epoch_strip(row, blocked=True))
    assert [r["fill"] for r in rects] == [BLOCKED, COLOURS["SW"]]
    badge = html_status_badge(row)
    assert "compile error (predicted)" in badge and "uint8_activations" in badge
    assert "no error predicted" in html_status_badge(_row([]))
    hang = html_status_badge(_row([], findings=[{"constraint": "c", "detail": "d", "severity": "hang"}] * 2))
    assert "board hang x2 (predicted)" in hang


# -- node annotations (Netron) --------------------------------------------------------------------


def test_node_infos_take_the_worst_unit_share_the_epoch_time_and_give_reasons():
    row = _row([_ep(1, "HW", ["conv", "relu"], 2.0), _ep(2, "hybrid", ["conv"], 1.0, "DepthToSpace"),
                _ep(3, "SW", ["soft"], 4.0)],
               sw_nodes=[{"name": "soft", "reasons": ["why soft"], "from_nodes": ["soft"]},
                         {"name": "conv/DepthToSpace", "reasons": ["lowered"], "from_nodes": ["conv"]}])
    infos = node_infos(row)
    assert infos["conv"].placement == "hybrid" and infos["conv"].ms == pytest.approx(2.0)
    assert infos["relu"].placement == "HW" and infos["relu"].ms == pytest.approx(1.0)
    assert infos["soft"].placement == "SW" and infos["soft"].reason.startswith("why soft (estimated epoch 3, 4.000 ms)")
    assert "lowered" in infos["conv"].reason and infos["conv"].epochs == (1, 2)
    assert sum(i.ms for i in infos.values()) == pytest.approx(7.0)


def test_annotate_sets_only_the_nafix_keys_and_keeps_the_others():
    from onnx import helper as h

    n = h.make_node("Relu", ["x"], ["y"], name="relu")
    for k, v in (("origin", "keras"), ("nafix.placement", "stale"), ("z", "1")):
        n.metadata_props.add(key=k, value=v)
    sub = h.make_graph([h.make_node("Identity", ["x"], ["w"])], "body", [], [])
    iff = h.make_node("If", ["c"], ["o"], name="if", then_branch=sub, else_branch=sub)
    model = h.make_model(h.make_graph([n, iff], "g", [], []))
    row = _row([_ep(1, "SW", ["relu"], 1.0)], sw_nodes=[{"name": "relu", "reasons": ["r1"], "from_nodes": ["relu"]}])
    assert annotate_model(model, row) == 4  # two nodes and the If's two subgraph nodes
    meta = [(p.key, p.value) for p in model.graph.node[0].metadata_props]
    assert [k for k, _ in meta] == ["origin", "nafix.placement", "z", "nafix.reason"]
    assert dict(meta)["nafix.placement"] == "SW" and dict(meta)["nafix.reason"].startswith("r1")
    body = model.graph.node[1].attribute[0].g.node[0]
    assert {p.key: p.value for p in body.metadata_props}["nafix.reason"] == FOLDED_REASON  # its If's


def _meta(n):
    return {p.key: p.value for p in n.metadata_props}


def test_written_model_nodes_carry_placement_and_reason_and_no_annotate_leaves_them_exact(tmp_path, capsys):
    model = onnx.load(SAMPLES / "movenet_like.onnx")
    for i, n in enumerate(model.graph.node):
        n.metadata_props.add(key="origin", value=f"node {i}")
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    code, _, err = run([src], capsys)
    assert code == 0, err
    written = onnx.load(tmp_path / "m.nafix.onnx")
    report = json.loads((tmp_path / "m.nafix.json").read_text())
    assert all(_meta(n).get("nafix.placement") in ("HW", "SW", "hybrid") and _meta(n).get("nafix.reason")
               for n in written.graph.node)
    before = {n.name: n for n in model.graph.node}
    for n in written.graph.node:  # the user's own entries first and unchanged
        if n.name in before:
            assert list(n.metadata_props)[:1] == list(before[n.name].metadata_props)
    # the placement matches the fixed model's estimate: hybrid epochs after NAF003 on this model
    # (each ConvTranspose that replaced a Resize: two inserted hybrid epochs, DepthToSpace and Concat)
    units = [_meta(n)["nafix.placement"] for n in written.graph.node]
    hybrid = {n.name for n in written.graph.node if _meta(n)["nafix.placement"] == "hybrid"}
    assert hybrid == {n.name for n in written.graph.node if n.op_type == "ConvTranspose"} and len(hybrid) == 3
    assert report["estimate"]["after"]["hybrid_epochs"] == 6
    assert "SW" not in units and report["estimate"]["after"]["sw_epochs"] == 0
    conv = next(n for n in written.graph.node if n.name == "conv1")
    assert _meta(conv)["nafix.reason"].startswith("estimated to run on the NPU (estimated epoch 1")

    out2 = tmp_path / "plain" / "m.nafix.onnx"
    code, _, err = run([src, "--no-annotate", "-o", out2], capsys)
    assert code == 0, err
    plain = onnx.load(out2)
    assert not any(p.key.startswith("nafix.") for n in plain.graph.node for p in n.metadata_props)
    kept = [n for n in plain.graph.node if n.name in before]
    for n in kept:  # the metadata of every node kept is the user's, as it was
        assert list(n.metadata_props) == list(before[n.name].metadata_props), n.name
    # byte-identical where nafix changed nothing (a rewrite rewires at most a few readers of each node it replaced)
    untouched = [n for n in kept if n.SerializeToString(deterministic=True)
                 == before[n.name].SerializeToString(deterministic=True)]
    assert len(untouched) >= len(before) - 3 * len(report["changes"]) and len(untouched) > 20
    # the annotations are metadata only: the gate saw the same model and gave the same verdict
    report2 = json.loads((tmp_path / "plain" / "m.nafix.json").read_text())
    assert report2["verification"] == report["verification"]
    for a, b in zip(written.graph.node, plain.graph.node):
        a2 = onnx.NodeProto()
        a2.CopyFrom(a)
        keep = [p for p in a2.metadata_props if not p.key.startswith("nafix.")]
        del a2.metadata_props[:]
        a2.metadata_props.extend(keep)
        assert a2 == b


# -- the fix page ---------------------------------------------------------------------------------


@pytest.fixture
def fix_page(tmp_path, capsys):
    src = tmp_path / "movenet_like.onnx"
    shutil.copy(SAMPLES / "movenet_like.onnx", src)
    page = tmp_path / "fix.html"
    code, out, err = run([src, "--html", page, "-f", "json"], capsys)
    assert code == 0, err
    return page, json.loads(out)


def test_fix_html_shows_both_strips_the_changes_and_the_verification(fix_page, tmp_path, capsys):
    page, report = fix_page
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "Generated by nafix" in text[:200]
    before, after = _strips(text)
    est = report["estimate"]
    assert len(before) == est["before"]["epochs"] and len(after) == est["after"]["epochs"]
    assert [r["data-unit"] for r in before].count("SW") == est["before"]["sw_epochs"] == 3
    assert [r["data-unit"] for r in after].count("hybrid") == est["after"]["hybrid_epochs"]
    # one time scale: the faster model's strip is shorter by its estimated time
    wb, wa = (sum(float(r["width"]) for r in s) for s in (before, after))
    assert wa / wb == pytest.approx(est["after"]["latency_ms"] / est["before"]["latency_ms"], rel=0.05)
    assert all("Resize" in r["title"] for r in before if r["data-unit"] == "SW")
    assert text.count("<td>NAF003</td>") == len(report["changes"]) == 3
    assert "onnxruntime gate: <b>passed</b>" in text and "<code>heatmaps</code>" in text
    # the gate's caution (random inputs, outputs moved a lot) is on the page exactly when it is in the JSON
    caution = report["verification"].get("caution")
    assert ("id='caution'" in text) == bool(caution) and (not caution or html.escape(caution, quote=True) in text)
    assert "<script" not in text and "http" not in text.replace("http-equiv", "")
    # a file the user wrote is never replaced without --force; nafix's own page is
    mine = tmp_path / "mine.html"
    mine.write_text("my notes")
    code, _, err = run([tmp_path / "movenet_like.onnx", "--html", mine, "--dry-run"], capsys)
    assert code == 2 and "was not written by nafix" in err and mine.read_text() == "my notes"
    code, _, err = run([tmp_path / "movenet_like.onnx", "--html", page, "--dry-run"], capsys)
    assert code == 0, err
    # never the model the fix writes, nor an input
    code, _, err = run([tmp_path / "movenet_like.onnx", "--html", tmp_path / "movenet_like.nafix.onnx",
                        "--force", "--dry-run"], capsys)
    assert code == 2 and "--html" in err
    code, _, err = run([tmp_path / "movenet_like.onnx", "--html", tmp_path / "movenet_like.onnx", "--force"], capsys)
    assert code == 2 and "input" in err


def test_fix_html_escapes_names_and_says_when_the_gate_failed():
    evil = "<img src=x onerror=alert(1)>"
    row = _row([_ep(1, "SW", [evil], 1.0)], sw_nodes=[{"name": evil, "reasons": [evil], "from_nodes": [evil]}])
    est = {"epochs": 1, "sw_epochs": 1, "hybrid_epochs": 0, "hw_ratio": 0.0, "latency_ms": 1.0}
    fix = {"input": evil, "output": None, "written": False, "profile": "stm32n6", "estimate": {"before": est, "after": est},
           "changes": [{"rule": "NAF001", "node": evil, "op_type": "Softmax", "detail": evil}],
           "verification": {"ok": False, "outputs": [{"name": evil, "ok": False, "cosine": 0.5, "max_abs_error": 3.0,
                                                      "detail": evil}]},
           "remaining_sw_nodes": [{"name": evil, "op_type": "Softmax", "reasons": [evil]}], "findings": [],
           "warnings": [evil], "advice": []}
    page = fix_html(fix, row, row)
    assert "<img" not in page and "&lt;img src=x" in page
    assert "onnxruntime gate: <b>FAILED</b>" in page and "No model written" in page


# -- Model Explorer -------------------------------------------------------------------------------


def _model_explorer_classes():
    """Model Explorer's own node-data dataclasses (``model_explorer/node_data_builder.py`` of the
    ``ai-edge-model-explorer`` package), loaded without the package's ``__init__`` (which starts its
    web server's imports: flask, ...); None when the package is not installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("ai-edge-model-explorer")
    except PackageNotFoundError:
        return None
    files = [f for f in dist.files or () if f.name == "node_data_builder.py"]
    if not files:
        return None
    name = "_nafix_model_explorer"
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(Path(dist.locate_file(files[0])).parent)]
        sys.modules[name] = pkg
    return importlib.import_module(f"{name}.node_data_builder")


@pytest.fixture
def overlay(tmp_path, capsys):
    src = tmp_path / "movenet_like.onnx"
    shutil.copy(SAMPLES / "movenet_like.onnx", src)
    out = tmp_path / "me.json"
    code, _, err = run(["audit", src, "-f", "model-explorer", "-o", out, "--no-cache"], capsys)
    assert code == 0, err
    code, text, err = run(["audit", src, "-f", "json", "--no-cache"], capsys)
    assert code == 0, err
    return json.loads(out.read_text()), json.loads(text)["models"][0], onnx.load(src), out


def test_model_explorer_overlay_colours_every_node_output_by_placement_and_time(overlay):
    data, row, model, _ = overlay
    outputs = {o for n in model.graph.node for o in n.output if o}
    assert set(data["results"]) == outputs
    producer = {o: n.name for n in model.graph.node for o in n.output}
    infos = node_infos(row)
    for tensor, res in data["results"].items():
        info = infos.get(producer[tensor])
        if info is None:  # no epoch of its own
            assert res["value"] == 0 and res["bgColor"] not in COLOURS.values()
        else:
            assert res["bgColor"] == COLOURS[info.placement] and res["value"] == pytest.approx(info.ms, abs=1e-6)
    sw = [producer[t] for t, r in data["results"].items() if r["bgColor"] == COLOURS["SW"]]
    assert sorted(sw) == sorted(n["name"] for n in row["sw_nodes"]) == ["resize_up1", "resize_up2", "resize_up3"]
    # the values are the epochs' estimated time, shared among their nodes (one value per node)
    per_node = {producer[t]: r["value"] for t, r in data["results"].items()}
    assert sum(per_node.values()) == pytest.approx(sum(ep["ms"] for ep in row["epochs"]), rel=1e-3)


def test_model_explorer_overlay_has_the_format_of_model_explorers_own_classes(overlay, tmp_path, capsys):
    data, _, _, out = overlay
    # the fields of GraphNodeData / NodeDataResult / GradientItem as read in ai-edge-model-explorer
    # 0.1.34, model_explorer/node_data_builder.py (checked below against the package when installed)
    assert set(data) <= {"name", "results", "thresholds", "gradient", "hideInAggregatedStatsTable",
                         "hideInChildrenStatsTable", "hideAggregatedStats", "showExpandedSummaryOnGroupNode",
                         "showLabelCountColumnsInChildrenStatsTable"}
    assert all(set(r) <= {"value", "bgColor", "textColor"} and isinstance(r["value"], (int, float))
               for r in data["results"].values())
    stops = [g["stop"] for g in data["gradient"]]
    assert stops[0] == 0 and stops[-1] == 1 and all(set(g) <= {"stop", "bgColor", "textColor"} for g in data["gradient"])
    # a rerun replaces nafix's own file; a user's file needs --force
    src = tmp_path / "movenet_like.onnx"
    code, _, err = run(["audit", src, "-f", "model-explorer", "-o", out, "--no-cache"], capsys)
    assert code == 0, err
    code, _, err = run(["audit", src, SAMPLES / "classifier_softmax.onnx", "-f", "model-explorer", "--no-cache"], capsys)
    assert code == 2 and "one model" in err
    me = _model_explorer_classes()
    if me is None:
        pytest.skip("ai-edge-model-explorer is not installed (pip install --no-deps ai-edge-model-explorer)")
    gnd = me.GraphNodeData(
        name=data["name"], results={k: me.NodeDataResult(**v) for k, v in data["results"].items()},
        gradient=[me.GradientItem(**g) for g in data["gradient"]])
    assert json.loads(gnd.to_json_string()) == {**data, "thresholds": [], "hideInAggregatedStatsTable": False,
                                                "hideInChildrenStatsTable": False,
                                                "showExpandedSummaryOnGroupNode": False,
                                                "showLabelCountColumnsInChildrenStatsTable": False}
    model_data = me.ModelNodeData(graphsData={"main": gnd})  # what the UI loads per graph
    assert json.loads(model_data.to_json_string())["main"]["results"] == data["results"]


# -- a real headless browser ------------------------------------------------------------------------


def _chromium(page: Path, tmp_path: Path, *args: str):
    return headless_chromium(page.as_uri(), tmp_path, *args)


def screenshot(page: Path, png: Path, tmp_path: Path, size: str = "1100,900") -> "object":
    """The page rendered by headless Chromium as a Pillow RGB image."""
    from PIL import Image

    _chromium(page, tmp_path, f"--window-size={size}", f"--screenshot={png}")
    if not png.is_file():
        pytest.skip("the browser wrote no screenshot here")
    return Image.open(png).convert("RGB")


def _hex(c: str) -> tuple[int, int, int]:
    return tuple(int(c[i:i + 2], 16) for i in (1, 3, 5))


def _count(img, colour: str) -> int:
    want = _hex(colour)
    return sum(n for n, c in img.getcolors(maxcolors=1 << 24) if c == want)


def test_fix_html_in_headless_chromium_draws_the_strips(fix_page, tmp_path):
    page, report = fix_page
    dom = _chromium(page, tmp_path, "--dump-dom").stdout
    before, after = _strips(dom)
    assert (len(before), len(after)) == (report["estimate"]["before"]["epochs"], report["estimate"]["after"]["epochs"])
    img = screenshot(page, tmp_path / "fix.png", tmp_path)
    # the strips are painted: red SW epochs before, amber hybrid after, green HW in both (at least a
    # 2 px x 18 px epoch of each; the legend's swatches alone are smaller)
    for unit in ("SW", "hybrid", "HW"):
        assert _count(img, COLOURS[unit]) > 400, unit


def test_audit_html_in_headless_chromium_draws_a_strip_per_model_and_the_status(tmp_path, capsys):
    page = tmp_path / "audit.html"
    models = [SAMPLES / n for n in ("movenet_like.onnx", "uint8_default_quant.onnx", "denoiser_257.onnx")]
    code, _, err = run(["audit", *models, "-f", "html", "-o", page, "--no-cache"], capsys)
    assert code == 0, err
    code, text, err = run(["audit", *models, "-f", "json", "--no-cache"], capsys)
    data = json.loads(text)
    dom = _chromium(page, tmp_path, "--dump-dom").stdout
    strips = _strips(dom)
    # one strip per model in the table, one in each model's details
    assert len(strips) == 2 * len(data["models"])
    epochs = [m["estimate"]["epochs"] for m in data["models"]]
    assert [len(s) for s in strips[:3]] == epochs
    blocked = [i for i, m in enumerate(data["models"]) if any(f["severity"] == "compile_error" for f in m["findings"])]
    assert blocked == [2]  # uint8_default_quant (sorted by path)
    assert all(r["fill"] == BLOCKED for r in strips[2] if r["data-unit"] == "HW")
    assert "compile error (predicted)" in dom
    img = screenshot(page, tmp_path / "audit.png", tmp_path, "1400,700")
    assert _count(img, COLOURS["SW"]) > 100 and _count(img, COLOURS["HW"]) > 100 and _count(img, BLOCKED) > 50


def test_a_merged_report_with_a_hostile_epoch_time_is_refused_by_the_schema():
    from fixer.json_schema import EPOCH, problem

    assert problem({"index": 1, "unit": "SW", "nodes": ["a"], "ms": 0.5}, EPOCH) is None
    assert problem({"index": 1, "unit": "SW", "nodes": ["a"], "ms": "<b>"}, EPOCH) is not None
    # an unknown unit is drawn as SW (never a class or colour taken from the report)
    (rects,) = _strips(epoch_strip(_row([_ep(1, "x' onmouseover='alert(1)", ["a"], 1.0)])))
    assert rects[0]["data-unit"] == "SW" and rects[0]["fill"] == COLOURS["SW"]
