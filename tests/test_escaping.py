"""What a model, a report, a rule file or a pair folder names reaches every output only through
``fixer.escape``: models whose node names, op types (a custom-domain op), graph input/output
names, tensor names and file names carry hostile text, run through the CLI in every format.

Hostile text here: a C comment breakout with a preprocessor line, GitHub workflow commands after
a newline (``::error::``, ``::add-mask::``, the older ``##[cmd]``), terminal escape sequences
(window title, OSC 8 hyperlink, C1 CSI), Rich markup (``[link=...]``, a stray ``[/bold]`` that
used to crash the renderer), Markdown table and code breakers (``|``, backticks, a backslash
before ``|``), raw HTML, a bidi override and a trigraph."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
from onnx import helper

from fixer import escape
from tests.helpers import QDQ, run_cli as run, save

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_stedgeai" / "stedgeai"

PIECES = (
    "*/\n#include <evil.h>\nint pwned;/*",
    "\n::error::pwned",
    "\r\n::add-mask::secret",
    " ##[add-mask]hidden",
    "\x1b]0;title\x07",
    "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\",
    "\x9b31m\x1b[2J",
    "[link=http://x]y[/link]",
    "[/bold]",
    "|cell|",
    "`tick``",
    "a\\|b",
    "<script>alert(1)</script>",
    "\u202eevil",
    "??/",
)
PAYLOAD = "".join(PIECES)
#: a file name can hold everything but '/' and NUL
FILE_PAYLOAD = "m\n::error::file\x1b]0;t\x07[bold]x[link=http:x]|`<b>##[add-mask]k\u202e"
OP_PAYLOAD = "Evil[/bold][link=http://x]y[/link]\n::error::op\x1b[31m|`<i>"
#: Markers an injection would leave in a header, a log or a page.
INJECTED = ("#include <evil.h>", "int pwned;")


# --------------------------------------------------------------------------------------- models


def fix_model():
    """Two float graph inputs (names differing only in punctuation, so their C identifiers clash)
    and a float output, all with hostile names: NAF005 and NAF004 make them integer, so the fix
    writes a C header naming them."""
    b = QDQ(float_io=True)
    x1 = b.input("a-b" + PAYLOAD, [1, 2, 4, 4])
    x2 = b.input("a.b" + PAYLOAD, [1, 2, 4, 4])
    y = b.op("Add", [x1, x2], name="add" + PAYLOAD)
    y = b.op("Softmax", [y], name="sm" + PAYLOAD, axis=1)
    b.output(y, name="out" + PAYLOAD)
    return b.model()


def audit_model():
    """Hostile node and tensor names, and a custom-domain op whose type is hostile."""
    b = QDQ()
    x = b.input("in" + PAYLOAD, [1, 2, 4, 4])
    y = b.op("Softmax", [x], name="sm" + PAYLOAD, axis=1)
    b.output(y)
    m = b.model()
    out = "cust" + PAYLOAD
    m.graph.node.append(helper.make_node(OP_PAYLOAD, [m.graph.output[0].name], [out], name="cust" + PAYLOAD,
                                         domain="evil.dom"))
    m.graph.output.append(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
    m.opset_import.append(helper.make_opsetid("evil.dom", 1))
    return m


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    path = d / (FILE_PAYLOAD + ".onnx")
    onnx.save(audit_model(), str(path))
    return path


# --------------------------------------------------------------------------------------- checks

_OWN_GITHUB = re.compile(r"^::(debug|notice|warning|error)( (file|title)=[^:,\r\n]*(,(file|title)=[^:,\r\n]*)*)?::")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def assert_safe_text(text: str, *, github: bool = False) -> None:
    """No raw control character (but the newlines between lines), no line that a GitHub runner
    would take as a workflow command unless it is one of nafix's own annotations, no older
    ``##[cmd]`` anywhere."""
    assert not _CONTROL.search(text), repr(_CONTROL.search(text))
    assert "##[" not in text
    for line in text.split("\n"):
        if line.lstrip().startswith("::"):
            assert github and _OWN_GITHUB.match(line), line


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def assert_one_error_line(err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) <= 1 and err.count("error:") == len(lines), err
    for ln in lines:
        assert "\n" not in ln and "\r" not in ln


def gfm_cells(row: str) -> int:
    """Cells of a GFM table row as GitHub splits it: a backslash pairs with the next character,
    every other ``|`` is a delimiter."""
    n, i = 0, 0
    while i < len(row):
        if row[i] == "\\":
            i += 2
            continue
        n += row[i] == "|"
        i += 1
    return n - 1


def assert_markdown_tables_keep_columns(text: str) -> int:
    """Every row of every table has its header's column count; returns the rows checked."""
    checked, width = 0, None
    for line in text.split("\n"):
        if not line.startswith("|"):
            width = None
            continue
        if width is None:
            width = gfm_cells(line)
        assert gfm_cells(line) == width, line
        checked += 1
    return checked


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.rows, self.attrs = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [k for k, _ in attrs]
        if tag == "tr":
            self.rows.append(0)
        elif tag in ("td", "th"):
            self.rows[-1] += 1


#: what nafix's Markdown renders to: a tag outside this set came from a name
MARKDOWN_TAGS = {"h1", "h2", "p", "em", "strong", "code", "table", "thead", "tbody", "tr", "th", "td", "ul", "li", "br"}


def rendered_markdown(text: str) -> _Tags:
    """The HTML a CommonMark + GFM-table renderer (markdown-it, which rich depends on) makes of
    ``text``, parsed: tags, attributes and cells per row."""
    from markdown_it import MarkdownIt

    p = _Tags()
    p.feed(MarkdownIt("commonmark").enable("table").render(text))
    return p


def assert_markdown_renders_safely(text: str) -> None:
    p = rendered_markdown(text)
    assert set(p.tags) <= MARKDOWN_TAGS, set(p.tags) - MARKDOWN_TAGS
    assert not p.attrs  # no link, no image, no inline style


# --------------------------------------------------------------------------------------- the escaping layer


def test_terminal_text_is_one_line_with_no_control_and_no_workflow_command():
    for s in PIECES + (PAYLOAD, "  ::error::x", "::add-mask::x"):
        t = escape.terminal(s)
        assert_safe_text(t)
        assert "\n" not in t and "\r" not in t
    assert escape.terminal("\x1b]0;t\x07") == "\\x1b]0;t\\x07"
    assert escape.terminal("a\nb\tc\u202ed") == "a\\nb\\tc\\u202ed"
    assert escape.terminal("ns::op C:\\models\\m.onnx") == "ns::op C:\\models\\m.onnx"  # ordinary text unchanged


def test_github_escaping_is_githubs_plus_visible_controls():
    assert escape.github_data("a\r\nb 100%\x1b") == "a%0D%0Ab 100%25\\x1b"
    assert escape.github_property("a,b:c\n") == "a%2Cb%3Ac%0A"


def test_markdown_text_and_code_keep_a_table_row_whole():
    for s in PIECES + (PAYLOAD, "a\\", "\\|", "x\\\\|y"):
        for cell in (escape.markdown(s), escape.markdown_code(s, table=True)):
            assert_safe_text(cell)
            row = f"| h | x |\n|---|---|\n| {cell} | x |\n"
            assert gfm_cells(row.splitlines()[2]) == 2, cell
            assert_markdown_renders_safely(row)
            assert rendered_markdown(row).rows == [2, 2], cell
    assert escape.markdown_code("a`b``c") == "```a`b``c```"
    assert escape.markdown_code("`x") == "`` `x ``"
    assert escape.markdown("my_model.onnx") == "my_model.onnx"  # an underscore inside a word stays
    assert escape.markdown("_x_ *y*") == "\\_x\\_ \\*y\\*"


def test_html_and_json_escaping():
    page = escape.html(PAYLOAD)
    assert "<" not in page and "'" not in page and "\n" not in page
    assert_safe_text(page)
    text = escape.json_text({"name": PAYLOAD}, indent=2)
    assert json.loads(text) == {"name": PAYLOAD}  # lossless
    assert_safe_text(text)


def test_c_comment_and_identifier():
    for s in PIECES + (PAYLOAD, "*/", "/*/", "**/", "x\\"):
        c = escape.c_comment(s)
        assert "*/" not in c and "/*" not in c and "\n" not in c and "??" not in c and c.isascii()
    taken: set[str] = set()
    ids = [escape.c_identifier(n, taken=taken) for n in ("a-b", "a.b", "a_b", "9lives", "", "x" * 500, "é")]
    assert len(set(ids)) == len(ids)
    for i in ids + [escape.c_identifier("int", upper=False), escape.c_identifier("_Bool", upper=False)]:
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", i) and i not in escape.C_KEYWORDS and len(i) <= escape.C_IDENT_MAX + 4
    assert escape.c_identifier("NAFIX_IN_image") == "NAFIX_IN_IMAGE"


def test_log_lines_are_escaped(capsys):
    from fixer.cli import _LogFormatter

    rec = logging.LogRecord("fixer.x", logging.WARNING, __file__, 1, "name %s", (PAYLOAD,), None)
    line = _LogFormatter("%(levelname)s %(name)s: %(message)s").format(rec)
    assert "\n" not in line
    assert_safe_text(line)


# --------------------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("fmt", ["table", "markdown", "json", "github", "sarif", "html"])
def test_audit_in_every_format_escapes_what_the_model_names(hostile, fmt, capsys):
    code, out, err = run(["audit", hostile, "--no-cache", "--jobs", "1", "-f", fmt], capsys)
    assert code == 0, err
    assert_safe_text(out, github=fmt == "github")
    assert_safe_text(err)
    assert_one_error_line(err)
    if fmt == "table":
        assert "[/bold]" in out and "[link=http://x]y[/link]" in out  # shown as text, not taken as markup
        assert "\\x1b]0;title\\x07" in out and "\\n::error::pwned" in out
    elif fmt == "markdown":
        assert assert_markdown_tables_keep_columns(out) >= 4
        assert_markdown_renders_safely(out)
        assert rendered_markdown(out).rows == [9, 9, 4, 4, 4]  # audit table with status and est. ms; SW-node table: node, op, est. epochs, why
        # no line of the report comes from a name: every one is nafix's structure
        assert all(ln == "" or ln[0] in "#|-_G" for ln in out.split("\n")), out
    elif fmt in ("json", "sarif"):
        strings = set(_strings(json.loads(out)))
        assert "sm" + PAYLOAD in strings and OP_PAYLOAD in strings  # the names themselves, exactly
    elif fmt == "github":
        assert len(out.splitlines()) == 4  # debug, the estimate, two SW nodes: one line each
    elif fmt == "html":
        p = _Tags()
        p.feed(out)
        assert p.tags.count("script") == 1 and "b" not in p.tags and "i" not in p.tags


def test_audit_merge_and_baseline_render_hostile_rows(hostile, tmp_path, capsys):
    report = tmp_path / "r.json"
    code, _, err = run(["audit", hostile, "--no-cache", "--jobs", "1", "-f", "json", "-o", report], capsys)
    assert code == 0, err
    for fmt in ("table", "markdown", "github"):
        code, out, err = run(["audit", "merge", report, "-f", fmt], capsys)
        assert code == 0, err
        assert_safe_text(out, github=fmt == "github")
        assert_safe_text(err)
    # a baseline recorded when the model had no SW node: every SW node is new, printed by name
    model = tmp_path / hostile.name
    b = QDQ()
    b.output(b.op("Conv", [b.input("x", [1, 2, 4, 4]), b.weight("w", [4, 2, 1, 1])], name="conv"))
    save(b.model(), model)
    base = tmp_path / "base.json"
    code, out, err = run(["audit", model, "--no-cache", "--jobs", "1", "--write-baseline", base, "-f", "json"], capsys)
    assert code == 0, err
    shutil.copy(hostile, model)
    code, out, err = run(["audit", model, "--no-cache", "--jobs", "1", "--baseline", base], capsys)
    assert code == 1, err
    assert "new: " in err
    assert_safe_text(out)
    assert_safe_text(err)


def test_an_unreadable_model_with_a_hostile_name_gives_one_error_line(tmp_path, capsys):
    bad = tmp_path / (FILE_PAYLOAD + ".onnx")
    bad.write_bytes(b"not a protobuf")
    for args in (["audit", bad, "--no-cache"], ["fix", bad], ["audit", bad, tmp_path / "nowhere" / FILE_PAYLOAD]):
        code, out, err = run(args, capsys)
        assert code == 2, err
        (line,) = err.splitlines()
        assert line.startswith("error: ") and "\\n::error::file" in line
        assert_safe_text(out + err)


def test_fix_header_compiles_and_carries_no_injection(tmp_path, capsys):
    src = tmp_path / "model.onnx"
    save(fix_model(), src)
    code, out, err = run(["fix", src, "--stedgeai-option", "--input-data-type float32",
                          "--stedgeai-option", "--output-data-type float32"], capsys)
    assert code == 0, err
    assert_safe_text(out)
    assert_safe_text(err)
    header = (tmp_path / "model.nafix.h").read_text()
    assert header.isascii()
    for line in header.splitlines():
        assert not line.startswith("#") or re.match(r"#(ifndef|define|endif|include <stdint\.h>)( |$)", line), line
        assert not any(mark in line and not line.startswith("/*") for mark in INJECTED), line
    defined = re.findall(r"^#define (\w+)", header, re.M)
    types = re.findall(r"^typedef \w+ (\w+);", header, re.M)
    assert len(defined) == len(set(defined)) == 1 + 2 * 3 and len(set(types)) == 3  # guard + 3 edges
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed: the header's text was checked, not compiled")
    (tmp_path / "use.c").write_text(
        '#include "model.nafix.h"\n'
        f"double values[] = {{{', '.join(d for d in defined[1:])}}};\n"
        + "".join(f"{t} v{i};\n" for i, t in enumerate(types)))
    for extra in ([], ["-trigraphs"], ["-std=c99", "-pedantic"]):
        proc = subprocess.run([gcc, "-fsyntax-only", "-Wall", "-Werror", "-Wcomment", *extra, "-x", "c", "use.c"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    pre = subprocess.run([gcc, "-E", "-P", "-x", "c", "model.nafix.h"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert pre.returncode == 0, pre.stderr
    # a name outside a comment only ever as part of a longer identifier, never as a statement of its own
    assert "evil.h" not in pre.stdout and not re.search(r"\bint pwned\b", pre.stdout)
    assert all(d in header for d in defined) and not re.search(r"(?<![\w/])pwned\b", pre.stdout)


def test_compile_streams_compiler_output_escaped(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("FAKE_STEDGEAI_WARN", "w\n::error::warn\x1b]0;t\x07[/bold]")
    src = tmp_path / (FILE_PAYLOAD + ".onnx")
    save(fix_model(), src)
    code, out, err = run(["compile", src, "--stedgeai", FAKE, "--workdir", tmp_path / "work"], capsys)
    assert code == 0, err
    assert "stedgeai (m\\n::error::file" in err and "\\::error::warn\\x1b]0;t\\x07[/bold]" in err
    assert_safe_text(out)
    assert_safe_text(err)


def test_compile_comparison_renders_markup_as_text():
    """The measured table of ``fix --compile``: version, labels, op names and messages as text."""
    from rich.console import Console

    from fixer.report import comparison_renderables

    rep = SimpleNamespace(epochs=3, sw_epochs=1, hybrid_epochs=None, hw_ratio=2 / 3, sw_ops=[OP_PAYLOAD],
                          memory=[SimpleNamespace(name="pool[/bold]\x1b[2J", used_bytes=1, total_bytes=2)])
    res = SimpleNamespace(report=rep, ok=True, problems=["p" + PAYLOAD],
                          known_errors=[SimpleNamespace(code="E[/bold]", cause="c" + PAYLOAD, fix="f[/red]")])
    cm = SimpleNamespace(label="before" + PAYLOAD, result=res,
                         disagreements=[{"what": "node", "node": PAYLOAD, "op": OP_PAYLOAD, "predicted": "HW",
                                         "actual": "SW"}, {"what": "sw_ops", "op": OP_PAYLOAD, "predicted": 1,
                                                           "actual": 2}])
    comp = SimpleNamespace(version="4.0[/bold][link=http://x]", before=cm, after=None, improved=False)
    console = Console(record=True, width=100, file=open(os.devnull, "w"), soft_wrap=True)
    for r in comparison_renderables(comp):
        console.print(r)
    text = console.export_text()
    assert "4.0[/bold][link=http://x]" in text and "E[/bold]" in text
    assert_safe_text(text)


def test_rules_from_a_hostile_rule_file(tmp_path, capsys):
    folder = tmp_path / "rules"
    folder.mkdir()
    rule = {
        "id": "NAF901", "name": "evil-rule", "summary": "Evil [/bold] [link=http://x]y[/link] | \x1b]0;t\x07 <script>",
        "why": "Because\n::error::why ##[add-mask]x", "references": ["ref\n::error::ref <img src=x>"],
        "fixes": ["sw_op:" + OP_PAYLOAD], "match": {"op": [OP_PAYLOAD], "when": []},
        "rewrite": {"rewriter": "drop_trailing_softmax"}, "verify": {"contract": "ranking"}, "opt_in": True,
    }
    (folder / "NAF901-evil-rule.yaml").write_text(json.dumps(rule))  # JSON is YAML
    code, out, err = run(["rules", "--rules", folder], capsys)
    assert code == 0, err
    assert "Evil [/bold]" in out
    assert_safe_text(out)
    code, out, err = run(["rules", "--rules", folder, "--markdown"], capsys)
    assert code == 0, err
    assert_safe_text(out)
    assert assert_markdown_tables_keep_columns(out) > 10
    assert_markdown_renders_safely(out)
    assert set(rendered_markdown(out).rows) == {5}
    code, out, err = run(["rules", "NAF901", "--rules", folder], capsys)
    assert code == 0, err
    assert_safe_text(out)


def test_calibrate_table_escapes_pair_folder_names(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    pair = tmp_path / "pairs" / FILE_PAYLOAD
    pair.mkdir(parents=True)
    save(fix_model(), pair / "model.onnx")
    proc = subprocess.run([sys.executable, str(FAKE), "generate", "-m", str(pair / "model.onnx"), "--target", "stm32n6",
                           "--st-neural-art", "--output", str(tmp_path / "gen"), "--workspace", str(tmp_path / "ws")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (pair / "report.txt").write_text(next((tmp_path / "gen").glob("*_generate_report.txt")).read_text())
    code, out, err = run(["calibrate", tmp_path / "pairs"], capsys)
    assert code == 0, err
    assert assert_markdown_tables_keep_columns(out) == 3
    assert "m\\\\n::error::file" in out
    assert_markdown_renders_safely(out)
    assert rendered_markdown(out).rows == [10, 10]
    assert_safe_text(out)
    assert_safe_text(err)
    code, out, err = run(["calibrate", tmp_path / "pairs", "-f", "json"], capsys)
    assert code == 0 and json.loads(out)["rows"][0]["pair"] == FILE_PAYLOAD
