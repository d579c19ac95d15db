"""sacremoses' punctuation normalisation for one language, run on whole Arrow arrays instead of string by string.

MosesPunctNormalizer applies its rules one string at a time in pure Python; here the same rules run as RE2
replacements (Python's Unicode `\\d` and `\\s` spelled out, since RE2's are ASCII only), and only on the rows where
a pre-check finds a character some rule can change (MOSES_TRIGGER). A self-check against sacremoses on probe strings
decides, per language, whether the translated rules are used or the normaliser itself.
"""

from __future__ import annotations

import logging
import re

import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger("mtpipe.clean")

# Every character one of MosesPunctNormalizer's rules can change. A string without any of them comes out of it
# unchanged but for runs of spaces, which the whitespace step collapses anyway: only the others need the
# (regex-heavy, pure Python) normaliser. tests/unit/test_clean.py checks this claim against sacremoses.
MOSES_TRIGGER = "[\r()%:;`'\"\u201e\u201c\u201d\u2013\u2014\u00b4\u2018\u2019\u201a\u2026\u00ab\u00bb\u00a0]"
# Python's `re` on str: \d is any Unicode decimal digit and \s any character str.isspace() accepts; RE2's are
# ASCII only, so the two escapes are spelled out when sacremoses' rules are translated.
PY_DIGIT = r"\p{Nd}"
PY_SPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x{85}\p{Z}"
# Strings that exercise every rule, for the self-check below.
MOSES_PROBES = (
    "He said ``hello'' ( twice ) , then left : really ; ok",
    "„Hallo“, sagte er… – und ging — weg. 5 % mehr, 1\u00a0000 Euro.",
    "It\u2019s Peter\u2018s \u00ab\u00a0quoted\u00a0\u00bb text\u00a0: oui\u00a0! non\u00a0? 3\u00a0%, nº\u00a05",
    "«a» »b« \u201cc\u201d \u2018d\u2019 \u201ae\u2018 \u00b4f\u00b4 ´´g´´ ''h'' `i` \u2026 \u0663\u00a0\u0664 (x) .",
    'a "b", c "d". e".\u00a0f" ,"g" ...", 20\u00a0ºC 3\u00a0cm x\r\ny',
)


def _re2_pattern(pattern: str) -> str:
    out, in_class, i = [], False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            escape = pattern[i + 1]
            if escape == "d":
                out.append(PY_DIGIT)
            elif escape == "s":
                out.append(PY_SPACE if in_class else f"[{PY_SPACE}]")
            else:
                out.append(ch + escape)
            i += 2
            continue
        in_class = (in_class or ch == "[") and not (in_class and ch == "]")
        out.append(ch)
        i += 1
    return "".join(out)


class MosesPunct:
    """sacremoses' MosesPunctNormalizer for one language, run on whole Arrow arrays.

    `MosesPunctNormalizer.normalize` applies its ~45 regex substitutions one string at a time in Python (~35 us a
    string here). This runs the same substitutions, taken in order from the normaliser sacremoses builds for the
    language, as RE2 replacements over the array (~6x faster), and only on the rows where a pre-check finds a
    character some rule can change. A self-check on probe strings at start-up compares the result with
    `normalize`; should a future sacremoses rule not translate, the stage falls back to calling `normalize` on
    each of those rows (same output, lower speed) and says so.
    """

    def __init__(self, lang: str):
        from sacremoses import MosesPunctNormalizer

        self.reference = MosesPunctNormalizer(lang=lang)
        self.rules = [(_re2_pattern(p), re.sub(r"\\g<(\d+)>", r"\\\1", r)) for p, r in self.reference.substitutions]
        self.vectorised = self.check()
        if not self.vectorised:
            log.warning("sacremoses' rules for %r do not translate to RE2: normalising string by string (slower)", lang)

    def check(self) -> bool:
        """Whether the RE2 rules give what `normalize` gives on the probe strings."""
        self.vectorised = True
        try:
            return self.apply(pa.array(MOSES_PROBES)).to_pylist() == [self.reference.normalize(t) for t in MOSES_PROBES]
        except (pa.ArrowInvalid, re.error):
            return False

    def apply(self, texts: pa.Array) -> pa.Array:
        if not self.vectorised:
            return pa.array([self.reference.normalize(t) for t in texts.to_pylist()], pa.string())
        for pattern, replacement in self.rules:
            texts = pc.replace_substring_regex(texts, pattern=pattern, replacement=replacement)
        return pc.utf8_trim_whitespace(texts)

    def __call__(self, texts: pa.Array, within: pa.Array | None = None) -> pa.Array:
        """`texts` normalised; only the rows where `within` (a boolean mask) is true, when it is given."""
        candidates = pc.fill_null(pc.match_substring_regex(texts, MOSES_TRIGGER), False)
        if within is not None:
            candidates = pc.and_(candidates, within)
        picked = pc.indices_nonzero(candidates)
        if not len(picked):
            return texts
        return pc.replace_with_mask(texts, candidates, self.apply(texts.take(picked)))
