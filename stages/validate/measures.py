"""The per-row measures GX checks instead of the text: direction, lengths, ratio, copies, repeats, shares, languages.

GX has no pairwise checks (source != target, length ratio, duplicate pairs), and the text is what costs memory
once GX loads a file into pandas, so each batch of pairs becomes a batch of the DERIVED_COLUMNS below (about 45 bytes
a pair, no text), computed with pyarrow. The suite runs per direction (directions.py), so a measurer serves one
direction's rows: the scripts are that direction's languages', and repeats are found within the direction, as the
clean stage deduplicates. The measures shared with the clean stage (invisible characters, letter and script
shares, pair hashes, language identification) come from pipeline/text_checks.py, so the two agree.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.text_checks import INVISIBLE, HashSet64, LanguageDetector, first_occurrences, letter_shares, pair_hashes
from stages.validate.directions import direction_names

HTML_PATTERN = r"<[a-zA-Z/][^>]*>|&[a-z]+;"
# A run of characters that are not whitespace as Python's str.isspace() defines it (ASCII \t-\r, \x1c-\x1f,
# space, U+0085, and the Unicode separators \p{Z}), so the count equals `len(s.split())`, independently of how
# the clean stage counts words.
WORD_PATTERN = r"[^\t-\r\x1c-\x20\x{85}\p{Z}]+"
LANGUAGE = pa.dictionary(pa.int8(), pa.string())

# name -> (type, meaning); the meanings also appear as notes on the train suite's page in the Data Docs.
DERIVED_COLUMNS: dict[str, tuple[pa.DataType, str]] = {
    "origin": (pa.dictionary(pa.int32(), pa.string()), "the input file (or dataset split) the pair came from"),
    "line": (pa.int32(), "1-based line (or row) of the pair in its origin"),
    "direction": (pa.dictionary(pa.int8(), pa.string()), "src_lang-tgt_lang, the languages the row carries"),
    "src_chars": (pa.int32(), "characters (code points) in src; null when src is null"),
    "tgt_chars": (pa.int32(), "characters (code points) in tgt; null when tgt is null"),
    "src_words": (pa.int32(), "whitespace-separated words in src, as Python's str.split() counts them"),
    "tgt_words": (pa.int32(), "whitespace-separated words in tgt, as Python's str.split() counts them"),
    "length_ratio": (
        pa.float32(),
        "longer / shorter side in characters; null (not checked) when the shorter side has fewer than "
        "clean.ratio_min_chars characters, where the clean stage does not apply the ratio filter either",
    ),
    "is_copy": (pa.bool_(), "src == tgt"),
    "is_duplicate": (
        pa.bool_(),
        "an earlier row of the split in the same direction holds the same pair (compared by 64-bit xxh3 hashes of "
        "src + TAB + tgt)",
    ),
    "has_control": (pa.bool_(), "control or invisible (zero-width, bidi, BOM) characters on either side"),
    "has_html": (
        pa.bool_(),
        "an HTML tag or entity on either side; a warning only, since real text such as 'if a<b and c>d' matches",
    ),
    "src_letter_share": (pa.float32(), "letters (and combining marks) / non-space characters in src"),
    "tgt_letter_share": (pa.float32(), "letters (and combining marks) / non-space characters in tgt"),
    "src_script_share": (pa.float32(), "letters in the script of the source language / letters in src"),
    "tgt_script_share": (pa.float32(), "letters in the script of the target language / letters in tgt"),
    "src_lang": (LANGUAGE, "language py3langid detects in src, on the seeded sample only (null elsewhere)"),
    "tgt_lang": (LANGUAGE, "language py3langid detects in tgt, on the seeded sample only (null elsewhere)"),
}
DERIVED_FILE_SCHEMA = pa.schema([(name, dtype) for name, (dtype, _) in DERIVED_COLUMNS.items()])


@dataclass
class SplitMeasurer:
    """What measuring one direction's rows of a split batch by batch needs besides each batch, and what it carries
    from one batch to the next: the pairs seen so far, so that `is_duplicate` marks every repeat of an earlier row
    of the direction."""

    src_script: str | None  # RE2 class of the source language's script; None when the script is not known
    tgt_script: str | None
    ratio_min_chars: int  # clean.ratio_min_chars
    language_id_min_chars: int  # clean.language_id_min_chars
    pool: ThreadPoolExecutor  # two threads: the two sides are measured at once
    language_sample: np.ndarray  # sorted 0-based rows of the direction's rows whose languages are detected
    detector: LanguageDetector | None = None  # None when the language sample is empty
    seen_pairs: HashSet64 = field(default_factory=HashSet64)

    def duplicates(self, src: pa.Array, tgt: pa.Array) -> np.ndarray:
        """True for every row whose pair occurred earlier in the direction (in this or an earlier batch)."""
        hashes = pair_hashes(src, tgt)
        repeat = self.seen_pairs.contains(hashes) | ~first_occurrences(hashes)
        self.seen_pairs.add(hashes[~repeat])
        return repeat


def language_sample(rows: int, size: int, seed: int) -> np.ndarray:
    """`size` distinct rows of `rows`, sorted, the same for the same seed and split size."""
    if size <= 0 or rows <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(rows, size=min(size, rows), replace=False))


def side_features(text: pa.Array, script: str | None) -> dict[str, Any]:
    """Per-row measures of one side of a batch."""
    letter_share, script_share = letter_shares(text, script)
    return {
        "chars": pc.cast(pc.utf8_length(text), pa.int32()),
        "words": pc.cast(pc.count_substring_regex(text, WORD_PATTERN), pa.int32()),
        "has_control": pc.match_substring_regex(text, INVISIBLE),
        "has_html": pc.match_substring_regex(text, HTML_PATTERN),
        # NaN (no characters, no letters) is stored as null: nothing to check there.
        "letter_share": pa.array(letter_share, pa.float32(), from_pandas=True),
        "script_share": pa.array(
            np.full(len(text), np.nan) if script_share is None else script_share, pa.float32(), from_pandas=True
        ),
    }


def detected_languages(text: pa.Array, sampled_rows: np.ndarray, measurer: SplitMeasurer) -> pa.Array:
    """The language of the sampled rows (0-based in this batch) long enough to judge, null elsewhere."""
    languages = np.full(len(text), None, dtype=object)
    if measurer.detector is not None and len(sampled_rows):
        lengths = pc.utf8_length(text.take(pa.array(sampled_rows))).to_numpy(zero_copy_only=False)
        long_enough = sampled_rows[lengths >= measurer.language_id_min_chars]
        if len(long_enough):
            languages[long_enough] = measurer.detector.detect(text.take(pa.array(long_enough)).to_pylist())
    return pa.array(languages, pa.string()).cast(LANGUAGE)


def derive_columns(batch: pa.RecordBatch, measurer: SplitMeasurer, first_row: int = 0) -> pa.RecordBatch:
    """The DERIVED_COLUMNS of a batch of one direction's pairs whose first row is `first_row` of the direction's rows
    in the split; the two sides are measured on two threads."""
    src, tgt = batch.column("src"), batch.column("tgt")
    src_side, tgt_side = measurer.pool.map(side_features, (src, tgt), (measurer.src_script, measurer.tgt_script))
    shorter = pc.cast(pc.min_element_wise(src_side["chars"], tgt_side["chars"]), pa.float64())
    longer = pc.cast(pc.max_element_wise(src_side["chars"], tgt_side["chars"]), pa.float64())
    ratio_applies = pc.greater_equal(shorter, max(measurer.ratio_min_chars, 1))
    sample = measurer.language_sample
    sampled_rows = sample[(sample >= first_row) & (sample < first_row + len(batch))] - first_row
    origin = batch.column("origin")
    derived = {
        "origin": origin.dictionary_encode() if not pa.types.is_dictionary(origin.type) else origin,
        "line": batch.column("line"),
        "direction": direction_names(batch),
        "src_chars": src_side["chars"],
        "tgt_chars": tgt_side["chars"],
        "src_words": src_side["words"],
        "tgt_words": tgt_side["words"],
        "length_ratio": pc.if_else(ratio_applies, pc.divide(longer, shorter), None),
        "is_copy": pc.equal(src, tgt),
        "is_duplicate": pa.array(measurer.duplicates(src, tgt), pa.bool_()),
        "has_control": pc.or_kleene(src_side["has_control"], tgt_side["has_control"]),
        "has_html": pc.or_kleene(src_side["has_html"], tgt_side["has_html"]),
        "src_letter_share": src_side["letter_share"],
        "tgt_letter_share": tgt_side["letter_share"],
        "src_script_share": src_side["script_share"],
        "tgt_script_share": tgt_side["script_share"],
        "src_lang": detected_languages(src, sampled_rows, measurer),
        "tgt_lang": detected_languages(tgt, sampled_rows, measurer),
    }
    return pa.RecordBatch.from_arrays(
        [derived[column.name].cast(column.type) for column in DERIVED_FILE_SCHEMA],
        schema=DERIVED_FILE_SCHEMA,
    )
