"""Text measures the clean stage filters on and the validate stage checks: one definition, so the two agree.

Invisible characters, letter and script shares (vectorised with pyarrow; per row in the script of that row's own
language, for files that mix directions), 64-bit pair hashes (optionally keyed by direction) and a set of them in
8 bytes a member (deduplication), and language identification with py3langid (its model ships inside the wheel;
imported on first use). The script of each language is pipeline/runtime/languages.py's SCRIPTS.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.runtime.languages import SCRIPTS

# RE2 syntax (pyarrow). C0/C1 controls except \t \n \r (whitespace, which the clean stage turns into spaces);
# zero-width space, non-joiner and joiner, left-to-right/right-to-left marks and embeddings, word joiner and
# invisible operators, soft hyphen, BOM. The clean stage removes them; validate expects none to remain.
INVISIBLE = (
    r"[\x{0000}-\x{0008}\x{000B}\x{000C}\x{000E}-\x{001F}\x{007F}-\x{009F}\x{00AD}\x{200B}-\x{200F}"
    r"\x{202A}-\x{202E}\x{2060}-\x{2064}\x{FEFF}]"
)
# Runs of characters that are neither letters (combining marks included) nor spaces.
NON_LETTERS = r"[^\p{L}\p{M} ]+"


def _numpy(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


def letter_shares(texts: pa.Array, script: str | None) -> tuple[np.ndarray, np.ndarray | None]:
    """(letters and marks / non-space characters, letters in `script` / letters); NaN where a denominator is 0.

    Counted through what is rare, for speed (each regex match costs more than scanning): non-letters in runs,
    combining marks and letters outside the script one by one (none at all in most rows).
    """
    chars = _numpy(pc.utf8_length(texts)).astype(np.float64)
    nonspace = chars - _numpy(pc.count_substring(texts, " "))
    stripped = pc.replace_substring_regex(texts, pattern=NON_LETTERS, replacement="")
    letters = nonspace - (chars - _numpy(pc.utf8_length(stripped)))
    with np.errstate(divide="ignore", invalid="ignore"):
        letter_share = np.where(nonspace > 0, letters / nonspace, np.nan)
        if script is None:
            return letter_share, None
        # Combining marks belong to no script of their own: the share is among letters proper.
        marks = _numpy(pc.count_substring_regex(texts, r"\p{M}"))
        foreign = _numpy(pc.count_substring_regex(texts, f"[^\\P{{L}}{script}]"))
        proper = letters - marks
        return letter_share, np.where(proper > 0, (proper - foreign) / proper, np.nan)


def language_groups(langs: pa.Array) -> list[tuple[str | None, np.ndarray | None]]:
    """(language, its row numbers) for each language in `langs` (one per row), in order of first appearance; the
    row numbers are None when every row has that language, the common case, so callers need not gather rows."""
    encoded = pc.dictionary_encode(langs)
    codes = _numpy(pc.fill_null(encoded.indices, -1))
    names = encoded.dictionary.to_pylist()
    values, first_rows = np.unique(codes, return_index=True)
    present = [int(c) for c in values[np.argsort(first_rows)]]
    if len(present) == 1:
        return [(names[present[0]] if present[0] >= 0 else None, None)]
    return [(names[c] if c >= 0 else None, np.flatnonzero(codes == c)) for c in present]


def letter_shares_by_language(
    texts: pa.Array, langs: pa.Array, with_scripts: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """`letter_shares` of each row, the script share measured in the script of the row's own language (`langs`,
    one per row; SCRIPTS). The script share is NaN where the language has no known script (or `with_scripts` is
    false): such a row cannot be judged, so no threshold rejects it."""
    letter, script = np.full(len(texts), np.nan), np.full(len(texts), np.nan)
    if not with_scripts:
        return letter_shares(texts, None)[0], script
    for lang, rows in language_groups(langs):
        part = texts if rows is None else texts.take(pa.array(rows))
        at = slice(None) if rows is None else rows
        letter[at], in_script = letter_shares(part, SCRIPTS.get(lang) if lang else None)
        if in_script is not None:
            script[at] = in_script
    return letter, script


def pair_hashes(src: pa.Array, tgt: pa.Array, directions: pa.Array | None = None) -> np.ndarray:
    """64-bit xxh3 hashes of (src, tgt) pairs, or of (direction, src, tgt) when `directions` (one label per row,
    e.g. "en-de") is given: then the same texts in two directions hash apart, so deduplication and eval overlap
    stay within a direction. Whitespace is collapsed by the clean stage, so no TAB occurs inside a side and the
    parts joined by TAB identify the pair. A collision makes two different pairs look identical: with n pairs the
    chance of any is about n^2 / 2^65 (6e-7 for 4.5M)."""
    import xxhash

    parts = [pc.fill_null(src, ""), pc.fill_null(tgt, "")]
    if directions is not None:
        parts.insert(0, pc.fill_null(directions, ""))
    keys = pc.binary_join_element_wise(*parts, "\t")
    digest = xxhash.xxh3_64_intdigest
    return np.fromiter((digest(k) for k in keys.cast(pa.binary()).to_pylist()), dtype=np.uint64, count=len(keys))


class HashSet64:
    """A set of uint64 hashes as a few sorted numpy runs (a log-structured merge): 8 bytes per member, and 16 at
    most while two runs merge. Runs of similar size merge, so there are O(log n) of them and each hash is sorted
    O(log n) times; a lookup is one binary search per run."""

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(r) for r in self.runs)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.runs)

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        found = np.zeros(len(hashes), dtype=bool)
        for run in self.runs:
            at = np.minimum(np.searchsorted(run, hashes), len(run) - 1)
            found |= run[at] == hashes
        return found

    def add(self, hashes: np.ndarray) -> None:
        """Add hashes that are not members yet (the caller checked with `contains`)."""
        if not len(hashes):
            return
        self.runs.append(np.sort(hashes))
        while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
            last = self.runs.pop()
            self.runs[-1] = np.sort(np.concatenate([self.runs[-1], last]))


def first_occurrences(hashes: np.ndarray) -> np.ndarray:
    """True for the first row of each distinct hash in `hashes` (copies within one batch)."""
    first = np.zeros(len(hashes), dtype=bool)
    first[np.unique(hashes, return_index=True)[1]] = True
    return first


@functools.lru_cache(maxsize=1)
def _py3langid() -> Any:
    # Loading the model takes ~1.5 s; restricted copies share its arrays.
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE)


def forget_language_model() -> None:
    """Drop the cached model (once no detector uses it), so its memory can go back before a memory-heavy step."""
    import gc

    _py3langid.cache_clear()
    gc.collect()


class LanguageDetector:
    """py3langid (a naive Bayes model that ships inside the wheel: no download) restricted to candidate languages.

    Restricting the candidates makes it faster (the scoring is a product with one column per language) and keeps
    it from picking a rare language on short text. ~15k sentences/s on one core here: pure Python per string.
    """

    def __init__(self, candidates: list[str]):
        self.identifier = copy.copy(_py3langid())
        unknown = sorted(set(candidates) - set(self.identifier.labels))
        if unknown:
            raise ValueError(f"py3langid does not know the language(s) {unknown}")
        self.identifier.set_languages(sorted(set(candidates)))

    def detect(self, texts: list[str]) -> list[str]:
        classify = self.identifier.classify
        return [classify(text)[0] for text in texts]
