"""pipeline/runtime/serve/html_text.py: `format: "html"` translates a document's text nodes and keeps its markup byte
for byte; a document that is not well nested is refused naming the tags and where they are."""

from __future__ import annotations

import pytest

from pipeline.runtime.serve.html_text import HtmlError, parse


def bracketed(document: str) -> str:
    """The document with each text node "translated" to [ITS UPPER CASE]."""
    parsed = parse(document)
    return parsed.with_translations([f"[{text.upper()}]" for text in parsed.texts])


def test_text_nodes_are_translated_and_tags_and_attributes_kept_as_they_came():
    document = '<p class="green" data-x=\'1\'>Hello <B>world</B>!<br/><img src="a.png" alt="A dog"></p>'
    assert parse(document).texts == ["Hello", "world"]
    assert bracketed(document) == ('<p class="green" data-x=\'1\'>[HELLO] <B>[WORLD]</B>!<br/>'
                                   '<img src="a.png" alt="A dog"></p>')


def test_a_document_with_nothing_to_normalise_comes_back_unchanged_when_each_node_is_its_own_translation():
    document = ('<!DOCTYPE html>\n<html lang="en">\n<head><title>A page</title></head>\n<body>\n<!-- a comment -->\n'
                '<h1 id="top">Two dogs</h1>\n<p>A man sits.</p>\n</body>\n</html>\n')
    parsed = parse(document)
    assert parsed.texts == ["A page", "Two dogs", "A man sits."]
    assert parsed.with_translations(parsed.texts) == document


def test_references_are_decoded_for_the_model_and_the_translation_is_escaped():
    parsed = parse("<p>Fish &amp; chips &lt;3 &#233;t&eacute;</p>")
    assert parsed.texts == ["Fish & chips <3 été"]
    assert parsed.with_translations(["A < B & C"]) == "<p>A &lt; B &amp; C</p>"


def test_whitespace_runs_are_one_space_and_the_whitespace_around_a_node_is_kept():
    parsed = parse("<p>\n    A dog\n    runs.  </p>")
    assert parsed.texts == ["A dog runs."]
    assert parsed.with_translations(["Ein Hund."]) == "<p>\n    Ein Hund.  </p>"


def test_pre_keeps_its_lines_each_translated_alone():
    parsed = parse("<pre>first line\n  second line\n</pre>")
    assert parsed.texts == ["first line", "second line"]
    assert parsed.with_translations(["1", "2"]) == "<pre>1\n  2\n</pre>"


def test_code_scripts_styles_opted_out_elements_and_nodes_without_letters_are_not_translated():
    document = ('<style>p { color: red }</style><script>if (a < b) { x = "<b>"; }</script><p>Run <code>ls -l</code> '
                'or <kbd>Ctrl</kbd>.</p><div translate="no"><span>Acme GmbH</span></div><p> | </p><p>&nbsp;</p>')
    parsed = parse(document)
    assert parsed.texts == ["Run", "or"]
    assert parsed.with_translations(["R", "O"]) == document.replace("Run <", "R <").replace("or <", "O <")


def test_elements_whose_end_tag_html_lets_one_omit_may_be_left_open():
    document = "<ul><li>One<li>Two</ul><table><tr><td>Three<td>Four</table><p>Five"
    assert parse(document).texts == ["One", "Two", "Three", "Four", "Five"]


def test_text_outside_any_element_and_a_less_than_sign_in_text_are_one_node():
    assert parse("a < b and c").texts == ["a < b and c"]
    assert bracketed("a < b") == "[A &lt; B]"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("<div>A dog</span></div>", "</span> at line 1 column 11 closes nothing: no <span> is open"),
        ("<p>\n<b><i>A dog</b></i></p>", "</b> at line 2 column 12 closes <b> (line 2 column 1) while <i> (line 2 "
         "column 4) inside it is still open"),
        ("<div>\n  <span>A dog\n</div>", "</div> at line 3 column 1 closes <div> (line 1 column 1) while <span> "
         "(line 2 column 3) inside it is still open"),
        ("<section><p>A dog", "<section> (line 1 column 1) is never closed"),
        ("A dog</br>", "</br> at line 1 column 6: <br> is a void element and takes no end tag"),
    ],
)
def test_a_document_that_is_not_well_nested_is_refused_naming_the_tags_and_where_they_are(document, message):
    with pytest.raises(HtmlError) as caught:
        parse(document)
    assert str(caught.value) == message


def test_each_text_node_knows_its_line_and_column_for_messages():
    nodes = parse("<p>\n  <b>A dog</b>\n  runs</p>").nodes
    assert [(n.text, n.line, n.column) for n in nodes] == [("A dog", 2, 6), ("runs", 3, 3)]
