"""The training filters and their reject reasons, switched and tuned in `params.clean`; first match wins.

The order is REASONS: empty, too_short_chars, too_short_words, too_long_chars, too_long_words, length_ratio,
source_equals_target, garbled (too few letters), wrong_script (too few letters in the script of the side's
language), overlaps_eval (the pair also occurs in a valid/test split of the same direction: contamination),
duplicate (an identical pair of the same direction passed every filter above earlier in the corpus),
wrong_language (py3langid against the side's language, off by default; last because it is by far the most
expensive, so it only sees pairs that survived everything else). The row-level filters are masks over a batch
(rule_masks); the corpus-level ones need one run's state, which Cleaner holds. Duplicates are found with 64-bit
hashes of the normalised pairs keyed by their direction, kept in sorted numpy runs (HashSet64): 8 bytes per unique
training pair, so memory is bounded by that and not by the text (36 MB for WMT14's 4.5M pairs).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.corpus import PAIR_SCHEMA
from pipeline.params import CleanParams
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.languages import SCRIPTS, Directions
from pipeline.text_checks import HashSet64, LanguageDetector, first_occurrences, letter_shares_by_language, pair_hashes
from stages.clean.normalization import Normalizer

log = logging.getLogger("mtpipe.clean")

REASONS = (
    "empty",
    "too_short_chars",
    "too_short_words",
    "too_long_chars",
    "too_long_words",
    "length_ratio",
    "source_equals_target",
    "garbled",
    "wrong_script",
    "overlaps_eval",
    "duplicate",
    "wrong_language",
)


def word_counts(texts: pa.Array) -> np.ndarray:
    # After normalisation words are separated by exactly one space and nothing is left at the ends.
    spaces = pc.count_substring(texts, " ").to_numpy(zero_copy_only=False)
    return np.where(pc.utf8_length(texts).to_numpy(zero_copy_only=False) > 0, spaces + 1, 0)


def rule_masks(
    src: pa.Array, tgt: pa.Array, src_lang: pa.Array, tgt_lang: pa.Array, cfg: CleanParams
) -> list[tuple[str, np.ndarray]]:
    """One boolean mask per row-level filter, in priority order; switched-off filters are left out. Each side's
    script share is measured in the script of that row's language (`src_lang`, `tgt_lang`: one per row)."""
    sc, tc = (pc.utf8_length(x).to_numpy(zero_copy_only=False) for x in (src, tgt))
    sw, tw = word_counts(src), word_counts(tgt)
    shorter, longer = np.minimum(sc, tc), np.maximum(sc, tc)
    ratio_applies = shorter >= cfg.ratio_min_chars
    masks = [
        ("empty", shorter == 0),
        ("too_short_chars", shorter < cfg.min_chars),
        ("too_short_words", np.minimum(sw, tw) < cfg.min_words),
        ("too_long_chars", longer > cfg.max_chars),
        ("too_long_words", np.maximum(sw, tw) > cfg.max_words),
        ("length_ratio", ratio_applies & (longer > cfg.max_length_ratio * np.maximum(shorter, 1))),
    ]
    if cfg.reject_copies:
        masks.append(("source_equals_target", pc.fill_null(pc.equal(src, tgt), False).to_numpy(zero_copy_only=False)))
    if cfg.min_letter_share > 0 or cfg.min_script_share > 0:
        with_scripts = cfg.min_script_share > 0
        (s_letters, s_script), (t_letters, t_script) = (
            letter_shares_by_language(x, langs, with_scripts) for x, langs in ((src, src_lang), (tgt, tgt_lang))
        )
        # NaN (no characters, no letters, a language without a known script) compares False: not rejected here.
        with np.errstate(invalid="ignore"):
            if cfg.min_letter_share > 0:
                masks.append(("garbled", (s_letters < cfg.min_letter_share) | (t_letters < cfg.min_letter_share)))
            if with_scripts:
                masks.append(("wrong_script", (s_script < cfg.min_script_share) | (t_script < cfg.min_script_share)))
    return masks


class Cleaner:
    """The state of one clean run: one normaliser per language, the detector, the valid/test pairs to keep out of
    training and the training pairs seen so far (hashes keyed by direction, so both stay within a direction)."""

    def __init__(self, cfg: CleanParams, directions: Directions):
        self.cfg, self.directions = cfg, directions
        languages = directions.languages
        self.normalizer = Normalizer(cfg, languages)
        unknown = [lang for lang in languages if lang not in SCRIPTS]
        if cfg.min_script_share > 0 and unknown:  # params refuses these; a guard for code that builds params itself
            log.warning("no known script for %s: the wrong_script filter does not judge those sides", unknown)
        self.detector = None
        if cfg.language_id:
            try:
                self.detector = LanguageDetector([*cfg.language_id_candidates, *languages])
            except ValueError as err:
                raise PipelineError(f"clean.language_id: {err}") from None
        self.eval_pairs = HashSet64()
        self.seen = HashSet64()
        self.pool = ThreadPoolExecutor(2)  # the two sides of a batch; pyarrow kernels release the GIL

    def close(self) -> None:
        self.pool.shutdown()

    def normalized(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        sides = (("src", "src_lang"), ("tgt", "tgt_lang"))
        src, tgt = self.pool.map(lambda side: self.normalizer(batch.column(side[0]), batch.column(side[1])), sides)
        return pa.record_batch([src, tgt, *batch.columns[2:]], schema=PAIR_SCHEMA)

    def eval_split(self, batch: pa.RecordBatch, labels: pa.Array) -> pa.RecordBatch:
        batch = self.normalized(batch)
        if self.cfg.remove_eval_overlap:
            hashes = np.unique(pair_hashes(batch.column("src"), batch.column("tgt"), labels))
            self.eval_pairs.add(hashes[~self.eval_pairs.contains(hashes)])
        return batch

    def wrong_language(self, batch: pa.RecordBatch, rows: np.ndarray) -> np.ndarray:
        """True for the `rows` where a side long enough to judge is detected as another language than the row's."""
        wrong = np.zeros(len(rows), dtype=bool)
        for side in ("src", "tgt"):
            texts, langs = batch.column(side), batch.column(f"{side}_lang")
            long_enough = pc.utf8_length(texts).to_numpy(zero_copy_only=False)[rows] >= self.cfg.language_id_min_chars
            checked = pa.array(rows[long_enough])
            if not len(checked):
                continue
            detected = np.array(self.detector.detect(texts.take(checked).to_pylist()), dtype=object)
            wrong[np.flatnonzero(long_enough)] |= detected != langs.take(checked).to_numpy(zero_copy_only=False)
        return wrong

    def train_split(self, batch: pa.RecordBatch, labels: pa.Array) -> tuple[pa.RecordBatch, np.ndarray]:
        """The batch normalised, and each row's reject reason (None: kept)."""
        batch = self.normalized(batch)
        src, tgt = batch.column("src"), batch.column("tgt")
        reason = np.full(len(batch), None, dtype=object)
        for name, mask in rule_masks(src, tgt, batch.column("src_lang"), batch.column("tgt_lang"), self.cfg):
            reason[mask & (reason == None)] = name  # noqa: E711 - elementwise comparison

        # Corpus-level filters, on the rows every row-level filter let through.
        rows = np.flatnonzero(reason == None)  # noqa: E711
        picked = pa.array(rows)
        hashes = pair_hashes(src.take(picked), tgt.take(picked), labels.take(picked))
        if self.cfg.remove_eval_overlap:
            in_eval = self.eval_pairs.contains(hashes)
            reason[rows[in_eval]] = "overlaps_eval"
            rows, hashes = rows[~in_eval], hashes[~in_eval]
        if self.cfg.deduplicate:
            copy = self.seen.contains(hashes) | ~first_occurrences(hashes)
            reason[rows[copy]] = "duplicate"
            rows, hashes = rows[~copy], hashes[~copy]
            self.seen.add(hashes)
        if self.detector is not None and len(rows):
            reason[rows[self.wrong_language(batch, rows)]] = "wrong_language"
        return batch, reason
