"""One escaping function per output kind. Every renderer puts text it did not write itself (node,
tensor, op-type, input/output and file names, pair-folder names, error messages, compiler output,
rule files given with ``--rules``) through the function of the output it writes, here and nowhere
else, so each threat is answered once.

All of them start with :func:`visible`: a control character never reaches an output raw.
Backslashes are kept as they are (Windows paths stay readable), so an escape is for the reader's
eyes, not a reversible encoding; the JSON report keeps every name exactly.
"""

from __future__ import annotations

import hashlib
import html as _html
import re
from typing import Any

from .json_schema import dumps

# C0 and C1 controls and DEL; the Unicode format characters that reorder or hide text (bidi
# embeddings, overrides and isolates, zero-width space, word joiner and invisible operators, BOM,
# interlinear annotations, tag characters), the line and paragraph separators, soft hyphen,
# Mongolian vowel separator, and lone surrogates (undecodable bytes of a file name). Zero-width
# (non-)joiners stay: emoji and several scripts need them.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u206f"
                      "\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible_char(m: re.Match) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def visible(text: Any) -> str:
    """``text`` with every control character replaced by a visible escape (``\\n``, ``\\x1b``,
    ``\\u202e``). Threat: a name carrying ESC / OSC / CSI sequences retitles the terminal, recolours
    or hides output, or plants an OSC 8 hyperlink; CR rewrites a line already shown; a newline
    starts a line of its own (a CI workflow command, a forged report line); bidi overrides make a
    name read differently from what it is."""
    s = text if isinstance(text, str) else str(text)
    return _CONTROL.sub(_visible_char, s)


# ---------------------------------------------------------------------------------------------
# terminals and CI logs
# ---------------------------------------------------------------------------------------------

_LEADING_COMMAND = re.compile(r"^(\s*)::")


def terminal(text: Any) -> str:
    """One line of text for a terminal or a CI log (the console table, ``error:`` lines, compiler
    output streamed through): :func:`visible` (so it stays one line, with no escape sequence),
    then workflow commands defused. Threat: GitHub Actions runs any output line that starts, after
    blanks, with ``::command::`` (``::error::``, ``::add-mask::``, ``::stop-commands::``), or that
    holds ``##[command]`` anywhere (its older syntax), as a command of the job. Rich markup is not
    this function's business: pass the result to Rich as a ``rich.text.Text``, never as a str."""
    s = visible(text).replace("##[", "##\\[")
    return _LEADING_COMMAND.sub(lambda m: m.group(1) + "\\::", s, count=1)


def github_data(text: Any) -> str:
    """The message of a GitHub workflow command (after the second ``::``): GitHub's own escaping
    of ``%``, CR and LF (the runner decodes them), then :func:`visible` for the other control
    characters, and ``##[`` defused as in :func:`terminal`. Threat: a newline in a name ends the
    annotation and starts a command of its own."""
    s = (text if isinstance(text, str) else str(text)).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return visible(s).replace("##[", "##\\[")


def github_property(text: Any) -> str:
    """A property value of a GitHub workflow command (``file=``, ``title=``): :func:`github_data`
    plus ``:`` and ``,``. Threat: a ``,`` or ``:`` in a file name ends the property and forges
    another one, or ends the command's properties early."""
    return github_data(text).replace(":", "%3A").replace(",", "%2C")


# ---------------------------------------------------------------------------------------------
# Markdown, HTML, JSON
# ---------------------------------------------------------------------------------------------

# ASCII punctuation that means something inline in CommonMark / GFM (emphasis, code, links and
# images, raw HTML and entities, table cells, strike-through, heading closers, math): each gets a
# backslash, which CommonMark defines as "this character, literally" for any ASCII punctuation.
_MD_SPECIAL = re.compile(r"[\\`*\[\]<>|~#&$]|_+")


def _md_escape(m: re.Match) -> str:
    g, s, a, b = m.group(), m.string, m.start(), m.end()
    if g[0] == "_" and 0 < a and b < len(s) and (s[a - 1] + s[b]).isascii() and s[a - 1].isalnum() and s[b].isalnum():
        return g  # inside a word: CommonMark takes no emphasis from it
    return "".join("\\" + c for c in g)


def markdown(text: Any) -> str:
    """Literal inline Markdown text (a table cell, a list item, a heading): :func:`visible` (one
    line: a table row keeps its columns), then a backslash before each character Markdown would
    act on (a run of ``_`` inside a word is literal already and keeps its look). Threat: ``|`` splits a
    table cell, a newline ends the row or starts a block, backticks end a code span, ``<script>``
    and other raw HTML pass through to a page that renders the report, ``[x](url)`` plants a link."""
    return _MD_SPECIAL.sub(_md_escape, visible(text).replace("##[", "##\\["))


_HTML_OPEN = re.compile(r"<(?=[A-Za-z/!?])")  # where CommonMark starts raw HTML or an autolink ("<=" is text)


def markdown_prose(text: Any) -> str:
    """Authored Markdown prose from a file nafix did not write (a rule's summary, why and
    references given with ``--rules``): its inline Markdown (code spans, emphasis, links) is kept,
    but it stays one line (:func:`visible`), ``|`` cannot split a table cell and ``<`` cannot open
    raw HTML or an autolink (``<=`` stays as it is). Threat: ``<script>`` or a forged table row in a rules reference
    generated from someone else's rule files."""
    return _HTML_OPEN.sub(r"\\<", visible(text).replace("##[", "##\\[").replace("|", "\\|"))


def markdown_code(text: Any, *, table: bool = False) -> str:
    """``text`` as an inline code span whatever it holds: the fence is one backtick longer than
    the longest run inside, padded when the text starts or ends with a backtick or a blank;
    :func:`visible` first. With ``table``, ``|`` is escaped as GFM requires inside a cell (a code
    span does not protect it); a text holding a backslash right before a ``|`` is written as
    :func:`markdown` text instead, since GFM pairs a backslash with the next character before it
    splits cells. Threat: a backtick in a name closes the span and the rest renders as Markdown or
    HTML; a ``|`` splits the cell."""
    s = visible(text).replace("##[", "##\\[")
    if table:
        if "\\|" in s:
            return markdown(text)
        s = s.replace("|", "\\|")
    if not s:
        return "` `"
    fence = "`" * (max((len(r) for r in re.findall("`+", s)), default=0) + 1)
    pad = " " if s[0] in "` " or s[-1] in "` " else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def html(text: Any) -> str:
    """Text or an attribute value (quoted with ' or ") in HTML: ``html.escape`` of
    :func:`visible`, and ``##[`` as ``##&#91;``. Threat: ``<script>`` or a quote that ends an
    attribute runs script in the page; a newline in a name printed with the page puts a workflow
    command at the start of a log line."""
    return _html.escape(visible(text), quote=True).replace("##[", "##&#91;")


def json_text(obj: Any, **kwargs: Any) -> str:
    """:func:`fixer.json_schema.dumps` (never NaN or Infinity) in ASCII, so every control character is
    a ``\\u`` escape, with ``##[`` written ``##\\u005b`` (only ever inside a string; the same string
    once parsed). Threat: a report printed in a CI log runs ``##[command]`` held by a name."""
    kwargs["ensure_ascii"] = True
    return dumps(obj, **kwargs).replace("##[", "##\\u005b")


# ---------------------------------------------------------------------------------------------
# C
# ---------------------------------------------------------------------------------------------


def c_comment(text: Any) -> str:
    """Text inside a ``/* ... */`` comment of a generated C header: :func:`visible` (no newline, so
    no backslash-newline splice and no line of its own), non-ASCII as ``\\u`` escapes (any
    toolchain reads it), ``*/`` and ``/*`` broken by a backslash, and ``??`` (the start of a
    trigraph: ``??/`` is a backslash under -trigraphs) as ``?\\?``. Threat: an input name
    ``x */ #include <evil.h>`` ends the comment and puts preprocessor lines and C statements into
    a header that firmware includes."""
    s = visible(text)
    s = "".join(c if ord(c) < 0x80 else (f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}") for c in s)
    s = s.replace("*/", "*\\/").replace("/*", "/\\*").replace("??", "?\\?")
    assert "*/" not in s and "/*" not in s and "\n" not in s
    return s


C_KEYWORDS = frozenset((
    "auto break case char const continue default do double else enum extern float for goto if inline int long "
    "register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while "
    "_Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary _Noreturn _Static_assert _Thread_local "
    "alignas alignof bool constexpr false nullptr static_assert thread_local true typeof typeof_unqual "
    "_BitInt _Decimal32 _Decimal64 _Decimal128 asm").split())

#: Longest identifier nafix derives from a name: real tensor names fit whole (a framework's
#: ``StatefulPartitionedCall/model/conv2d/BiasAdd:0``), a name of any length stays bounded.
C_IDENT_MAX = 96


def c_identifier(name: Any, *, upper: bool = True, taken: set[str] | None = None) -> str:
    """A valid, unique C identifier derived from a name: every character but ``[0-9A-Za-z]`` is
    ``_`` (none at the ends, so no reserved ``_X``/``__x`` spelling), a
    leading digit prefixed with ``T_``, upper-cased with ``upper``, a long name cut to
    :data:`C_IDENT_MAX` with a hash of the whole name, a C keyword suffixed with ``_``; with
    ``taken`` (identifiers already used in the same file, updated), a clash gets ``_2``, ``_3``...
    Threat: a name that is not an identifier breaks the header, or two names that differ only in
    punctuation define one macro twice with different values."""
    raw = name if isinstance(name, str) else str(name)
    s = re.sub(r"[^0-9A-Za-z]", "_", raw).strip("_") or "T"
    if upper:
        s = s.upper()
    if s[0].isdigit():
        s = "T_" + s
    if len(s) > C_IDENT_MAX:
        digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        s = f"{s[:C_IDENT_MAX - 9].rstrip('_')}_{digest.upper() if upper else digest}"
    if s in C_KEYWORDS:
        s += "_"
    if taken is not None:
        base, k = s, 2
        while s in taken:
            s = f"{base}_{k}"
            k += 1
        taken.add(s)
    return s
