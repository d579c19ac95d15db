"""The normalisation every split gets, each side of each row in the language the row gives it, in this order.

HTML entities unescaped and tags removed; control and zero-width characters removed; Unicode NFC (or NFKC); Moses
punctuation normalisation (moses.py, one normaliser per language, built once); any run of whitespace (Unicode spaces
included) collapsed to one space, ends trimmed. Each step runs on whole Arrow arrays (pyarrow.compute: RE2 regexes,
Unicode normalisation); HTML entities, which need Python per string, are unescaped only on the rows a vectorised
pre-check finds an `&` in, and a per-language step runs once per language present, on that language's rows.
"""

from __future__ import annotations

import html
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.params import CleanParams
from pipeline.runtime.errors import PipelineError
from pipeline.text_checks import INVISIBLE, language_groups
from stages.clean.moses import MosesPunct

# Whitespace other than the plain space (RE2's \s is ASCII only, hence the Unicode spaces listed).
OTHER_SPACES = r"\t\n\f\r\x{00A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}"
# What becomes one space: a run of two or more whitespace characters, or a single one that is not a plain space.
# A single plain space, by far the most common match of a plain `\s+`, is left alone: each match costs time.
WHITESPACE = f"[ {OTHER_SPACES}]{{2,}}|[{OTHER_SPACES}]"
# Tags that separate words become a space ("line<br>break"), every other tag goes ("<b>bold</b>."), and so do
# comments. A tag starts with a letter, '/' or '!' right after '<', so "a < b" and "<3" are left alone.
HTML_BREAKING_TAG = (
    r"(?i)</?(?:br|p|div|li|ul|ol|dl|dt|dd|tr|td|th|table|h[1-6]|hr|blockquote|section|article|header|footer)"
    r"\b[^<>]*>"
)
HTML_TAG = r"<!--.*?-->|<[a-zA-Z/!][^<>]*>"


def apply_where(texts: pa.Array, candidates: pa.Array, fn: Callable[[str], str]) -> pa.Array:
    """`fn` applied in Python to the rows where `candidates` is true; the other rows are not touched."""
    mask = pc.fill_null(candidates, False)
    picked = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
    if not len(picked):
        return texts
    changed = [fn(text) for text in texts.take(pa.array(picked)).to_pylist()]
    return pc.replace_with_mask(texts, mask, pa.array(changed, pa.string()))


def unescape_entities(text: str) -> str:
    # Web-crawled text is often escaped twice ("&amp;quot;"): unescape until nothing changes (at most 3 times).
    for _ in range(3):
        unescaped = html.unescape(text)
        if unescaped == text:
            break
        text = unescaped
    return text


def strip_html(texts: pa.Array) -> pa.Array:
    # Entities first: an escaped tag ("&lt;b&gt;") becomes a tag, which the next step then removes.
    texts = apply_where(texts, pc.match_substring(texts, "&"), unescape_entities)
    texts = pc.replace_substring_regex(texts, pattern=HTML_BREAKING_TAG, replacement=" ")
    return pc.replace_substring_regex(texts, pattern=HTML_TAG, replacement="")


class Normalizer:
    """The normalisation of texts in the given languages (see the module docstring for the steps); the Moses step
    has one normaliser per language, built here once, so worker threads only read them."""

    def __init__(self, cfg: CleanParams, languages: list[str]):
        self.cfg = cfg
        self.moses = {lang: MosesPunct(lang) for lang in dict.fromkeys(languages)} if cfg.moses_punct else {}

    def __call__(self, texts: pa.Array, langs: pa.Array) -> pa.Array:
        """`texts` normalised, each row with the language `langs` gives it (one per row)."""
        if self.cfg.strip_html:
            texts = strip_html(texts)
        # Remove invisible characters before composing: one between a letter and its combining mark ("u", ZWSP,
        # U+0308) would otherwise block composition and leave the text in decomposed form.
        texts = pc.replace_substring_regex(texts, pattern=INVISIBLE, replacement="")
        texts = pc.utf8_normalize(texts, form=self.cfg.unicode_form)
        if self.cfg.moses_punct:
            texts = self.moses_punct(texts, langs)
        texts = pc.replace_substring_regex(texts, pattern=WHITESPACE, replacement=" ")
        return pc.utf8_trim(texts, characters=" ")

    def moses_punct(self, texts: pa.Array, langs: pa.Array) -> pa.Array:
        for lang, rows in language_groups(langs):
            if lang not in self.moses:
                raise PipelineError(f"clean: no punctuation normaliser for language {lang!r} (built for "
                                    f"{sorted(self.moses)})")  # the stage checks row languages first
            within = None
            if rows is not None:
                mask = np.zeros(len(texts), dtype=bool)
                mask[rows] = True
                within = pa.array(mask)
            texts = self.moses[lang](texts, within)
        return texts


def normalize(texts: pa.Array, form: str = "NFC", lang: str | None = None, cfg: CleanParams | None = None) -> pa.Array:
    """Unicode and whitespace normalisation of texts (invisible characters removed, NFC or NFKC, whitespace
    collapsed); given the stage's `cfg`, its whole normalisation for `lang`, HTML and Moses punctuation included."""
    if cfg is None:
        cfg = CleanParams(unicode_form=form, strip_html=False, moses_punct=False)
    lang = lang or "en"
    return Normalizer(cfg, [lang])(texts, pa.array([lang] * len(texts), pa.string()))
