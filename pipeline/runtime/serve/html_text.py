"""`format: "html"`: the text nodes of an HTML document translated, its markup kept byte for byte.

A document is cut (stdlib html.parser) into its markup (tags with their attributes, comments, the doctype: copied
as they came) and its text nodes. A text node is translated as one line: its character references decoded, its
runs of whitespace read as one space (HTML renders them so), its leading and trailing whitespace kept around the
translation, which is written back escaped (&, <, >). Inside <pre> and <textarea> whitespace is kept and each line
of a node is translated on its own. Not translated: nodes without a letter or a digit (whitespace, the " | "
between links), attribute values, and the text inside <script>, <style>, <code>, <kbd>, <samp>, <var> or an
element with translate="no" (HTML's own attribute for it). An inline element splits a sentence into nodes
("Hello <b>world</b> again" is three), each translated alone.

A document must be well nested, or its markup could not be kept: every element but the void ones (<br>, <img>,
...) is closed by its end tag, innermost first. The elements whose end tag HTML lets a writer leave out (<p>,
<li>, <td>, <tr>, <option>, ... ) may be left open: the end tag of an element around them, or the end of the
document, closes them. An end tag that closes nothing open, one that closes an element while an element inside it
is still open, an end tag of a void element, and an element never closed are each an HtmlError naming the tags
and their line and column in the document.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from html.parser import HTMLParser

VOID_ELEMENTS = frozenset("area base br col embed hr img input link meta param source track wbr".split())
# HTML's optional end tags (WHATWG HTML, 13.1.2.4): left open, they are closed by their parent's end tag.
OPTIONAL_END_TAGS = frozenset(
    "html head body p li dt dd option optgroup tr td th thead tbody tfoot colgroup caption rb rt rtc rp".split()
)
UNTRANSLATED_ELEMENTS = frozenset("script style code kbd samp var".split())
WHITESPACE_KEPT = frozenset("pre textarea".split())
# HTML's whitespace (not Python's, which takes in the no-break space that &nbsp; writes).
HTML_WHITESPACE = " \t\n\f\r"
_WHITESPACE = re.compile(f"[{HTML_WHITESPACE}]+")


class HtmlError(ValueError):
    """A document whose markup is not well nested; the message names the tags and where they are."""


@dataclass(frozen=True)
class TextNode:
    """A piece of text to translate: `text` as the model reads it, at `line` and `column` of the document."""

    text: str
    line: int
    column: int


@dataclass(frozen=True)
class _Slot:
    """Where a TextNode's translation goes, between the whitespace it had around it."""

    node: int
    leading: str
    trailing: str


@dataclass(frozen=True)
class HtmlDocument:
    parts: tuple[str | _Slot, ...]
    nodes: tuple[TextNode, ...]

    @property
    def texts(self) -> list[str]:
        return [node.text for node in self.nodes]

    def with_translations(self, translations: list[str]) -> str:
        """The document with each text node replaced by its translation (one per node, in order)."""
        if len(translations) != len(self.nodes):
            raise ValueError(f"{len(translations)} translations for {len(self.nodes)} text nodes")
        return "".join(
            part if isinstance(part, str)
            else part.leading + html.escape(translations[part.node], quote=False) + part.trailing
            for part in self.parts
        )


@dataclass
class _Open:
    tag: str
    line: int
    column: int
    translated: bool  # its text nodes are translated
    keeps_whitespace: bool

    def __str__(self) -> str:
        return f"<{self.tag}> (line {self.line} column {self.column})"


class _Scanner(HTMLParser):
    """Records where each piece of the document starts, and checks the nesting as the tags come."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.starts: list[tuple[int, int, str, _Open | None]] = []  # (line, column, kind, enclosing element)
        self.open: list[_Open] = []

    def _note(self, kind: str) -> None:
        line, offset = self.getpos()
        self.starts.append((line, offset + 1, kind, self.open[-1] if self.open else None))

    def handle_data(self, data: str) -> None:
        self._note("text")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._note("markup")
        if tag in VOID_ELEMENTS:
            return
        line, column, _, parent = self.starts[-1]
        inherited = parent is None or parent.translated
        opted_out = (dict(attrs).get("translate") or "").strip().lower() == "no"
        translated = inherited and tag not in UNTRANSLATED_ELEMENTS and not opted_out
        keeps = tag in WHITESPACE_KEPT or (parent is not None and parent.keeps_whitespace)
        self.open.append(_Open(tag, line, column, translated, keeps))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._note("markup")  # <x/>: opens nothing

    def handle_endtag(self, tag: str) -> None:
        self._note("markup")
        line, column = self.starts[-1][:2]
        here = f"</{tag}> at line {line} column {column}"
        if tag in VOID_ELEMENTS:
            raise HtmlError(f"{here}: <{tag}> is a void element and takes no end tag")
        opened = [i for i, element in enumerate(self.open) if element.tag == tag]
        if not opened:
            raise HtmlError(f"{here} closes nothing: no <{tag}> is open")
        inside = self.open[opened[-1] + 1 :]
        unclosed = [element for element in inside if element.tag not in OPTIONAL_END_TAGS]
        if unclosed:
            raise HtmlError(f"{here} closes {self.open[opened[-1]]} while {unclosed[-1]} inside it is still open")
        del self.open[opened[-1] :]

    def handle_comment(self, data: str) -> None:
        self._note("markup")

    def handle_decl(self, decl: str) -> None:
        self._note("markup")

    def handle_pi(self, data: str) -> None:
        self._note("markup")

    def unknown_decl(self, data: str) -> None:
        self._note("markup")


def parse(document: str) -> HtmlDocument:
    """The document's markup and text nodes; HtmlError when it is not well nested."""
    scanner = _Scanner()
    scanner.feed(document)
    scanner.close()
    unclosed = [element for element in scanner.open if element.tag not in OPTIONAL_END_TAGS]
    if unclosed:
        raise HtmlError(f"{unclosed[-1]} is never closed")
    parts: list[str | _Slot] = []
    nodes: list[TextNode] = []
    for piece in _pieces(document, scanner.starts):
        if piece.kind == "text" and (piece.enclosing is None or piece.enclosing.translated):
            keeps_whitespace = piece.enclosing is not None and piece.enclosing.keeps_whitespace
            _cut_text(piece, keeps_whitespace, parts, nodes)
        else:
            parts.append(piece.raw)
    return HtmlDocument(tuple(parts), tuple(nodes))


@dataclass(frozen=True)
class _Piece:
    kind: str  # "text" or "markup"
    raw: str
    line: int
    column: int
    enclosing: _Open | None


def _pieces(document: str, starts: list[tuple[int, int, str, _Open | None]]) -> list[_Piece]:
    """The document cut where each piece starts (so that, joined, the pieces are the document). The parser hands
    a text node over in several pieces at times ("a < b"): they are joined into one."""
    line_starts = [0] + [match.end() for match in re.finditer("\n", document)]
    offsets = [line_starts[line - 1] + column - 1 for line, column, _, _ in starts] + [len(document)]
    pieces: list[_Piece] = []
    for index, (line, column, kind, enclosing) in enumerate(starts):
        raw = document[offsets[index] : offsets[index + 1]]
        if kind == "text" and pieces and pieces[-1].kind == "text":
            pieces[-1] = _Piece("text", pieces[-1].raw + raw, pieces[-1].line, pieces[-1].column, enclosing)
        else:
            pieces.append(_Piece(kind, raw, line, column, enclosing))
    return pieces


def _cut_text(piece: _Piece, keeps_whitespace: bool, parts: list[str | _Slot], nodes: list[TextNode]) -> None:
    """A text node into parts: its translatable text as slots (one per line where whitespace is kept), the rest
    as it came."""
    line, column = piece.line, piece.column
    for number, raw in enumerate(piece.raw.split("\n") if keeps_whitespace else [piece.raw]):
        if number:
            parts.append("\n")
            line, column = line + 1, 1
        core = raw.strip(HTML_WHITESPACE)
        if not any(character.isalnum() for character in html.unescape(core)):
            parts.append(raw)  # whitespace or punctuation between elements: nothing a model would translate
            continue
        leading = raw[: len(raw) - len(raw.lstrip(HTML_WHITESPACE))]
        trailing = raw[len(raw.rstrip(HTML_WHITESPACE)) :]
        if "\n" in leading:
            line, column = line + leading.count("\n"), len(leading) - leading.rfind("\n")
        else:
            column += len(leading)
        parts.append(_Slot(len(nodes), leading, trailing))
        nodes.append(TextNode(_WHITESPACE.sub(" ", html.unescape(core)), line, column))
