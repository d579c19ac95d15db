"""clean: normalise every split and filter the training pairs; every rejected row is kept with its reason.

Normalisation (all splits, in this order): HTML entities unescaped and tags removed; control and zero-width
characters removed; Unicode NFC (or NFKC); Moses punctuation normalisation (sacremoses, with each side's
language); any run of whitespace (Unicode spaces included) collapsed to one space, ends trimmed.

Filters (train only; valid and test sets are normalised but never filtered, so scores stay comparable), each
switched and tuned in `params.clean`, first match wins, in the order of REASONS: empty, too_short_chars,
too_short_words, too_long_chars, too_long_words, length_ratio, source_equals_target, garbled (too few letters),
wrong_script, overlaps_eval (the pair also occurs in a valid/test split: contamination), duplicate (an identical
pair passed every filter above earlier in the corpus), wrong_language (py3langid, off by default; last because it
is by far the most expensive, so it only sees pairs that survived everything else).

Everything streams over the raw row groups: the work on a batch is vectorised with pyarrow.compute (RE2 regexes,
Unicode normalisation), except two steps that need Python per string, HTML entities and Moses punctuation, which
run only on the rows a vectorised pre-check finds a trigger character in (a few percent of typical text); the
two sides of a batch are normalised on two threads. Duplicates are found with 64-bit hashes of the normalised
pairs kept in sorted numpy runs (HashSet64): 8 bytes per unique training pair, so memory is bounded by that and
not by the text (36 MB for WMT14's 4.5M pairs).

Output: `data/clean/<split>.parquet` (src, tgt, origin, line), `data/clean/rejected.parquet` (split, src, tgt,
origin, line, reason) and `metrics/clean.json`; for every split kept + rejected = input, which the stage checks
before it finishes.
"""

from __future__ import annotations

import html
import logging
import re
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.artifacts import Paths, atomic_path, splits_in, write_json
from pipeline.corpus import PAIR_SCHEMA, count_rows, iter_pair_batches
from pipeline.errors import MissingArtifact, PipelineError
from pipeline.params import CleanParams, Params
from pipeline.text_checks import (
    INVISIBLE,
    SCRIPTS,
    HashSet64,
    LanguageDetector,
    first_occurrences,
    letter_shares,
    pair_hashes,
)

log = logging.getLogger("mtpipe.clean")

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
# Every character one of MosesPunctNormalizer's rules can change. A string without any of them comes out of it
# unchanged but for runs of spaces, which the whitespace step collapses anyway: only the others need the
# (regex-heavy, pure Python) normaliser. tests/unit/test_clean.py checks this claim against sacremoses.
MOSES_TRIGGER = "[\r()%:;`'\"\u201e\u201c\u201d\u2013\u2014\u00b4\u2018\u2019\u201a\u2026\u00ab\u00bb\u00a0]"
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
REJECTED_SCHEMA = pa.schema([("split", pa.string()), *PAIR_SCHEMA, ("reason", pa.string())])


# --- normalisation ----------------------------------------------------------------------------------------


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

    def __call__(self, texts: pa.Array) -> pa.Array:
        candidates = pc.fill_null(pc.match_substring_regex(texts, MOSES_TRIGGER), False)
        picked = pc.indices_nonzero(candidates)
        if not len(picked):
            return texts
        return pc.replace_with_mask(texts, candidates, self.apply(texts.take(picked)))


class Normalizer:
    """The normalisation of one side (language) of the corpus; see the module docstring for the steps."""

    def __init__(self, cfg: CleanParams, lang: str):
        self.cfg = cfg
        self.moses = MosesPunct(lang) if cfg.moses_punct else None

    def __call__(self, texts: pa.Array) -> pa.Array:
        if self.cfg.strip_html:
            texts = strip_html(texts)
        # Remove invisible characters before composing: one between a letter and its combining mark ("u", ZWSP,
        # U+0308) would otherwise block composition and leave the text in decomposed form.
        texts = pc.replace_substring_regex(texts, pattern=INVISIBLE, replacement="")
        texts = pc.utf8_normalize(texts, form=self.cfg.unicode_form)
        if self.moses is not None:
            texts = self.moses(texts)
        texts = pc.replace_substring_regex(texts, pattern=WHITESPACE, replacement=" ")
        return pc.utf8_trim(texts, characters=" ")


def normalize(texts: pa.Array, form: str = "NFC", lang: str | None = None, cfg: CleanParams | None = None) -> pa.Array:
    """Unicode and whitespace normalisation of texts (invisible characters removed, NFC or NFKC, whitespace
    collapsed); given the stage's `cfg`, its whole normalisation for `lang`, HTML and Moses punctuation included."""
    if cfg is None:
        cfg = CleanParams(unicode_form=form, strip_html=False, moses_punct=False)
    return Normalizer(cfg, lang or "en")(texts)


# --- the filters ------------------------------------------------------------------------------------------


def word_counts(texts: pa.Array) -> np.ndarray:
    # After normalisation words are separated by exactly one space and nothing is left at the ends.
    spaces = pc.count_substring(texts, " ").to_numpy(zero_copy_only=False)
    return np.where(pc.utf8_length(texts).to_numpy(zero_copy_only=False) > 0, spaces + 1, 0)


def rule_masks(
    src: pa.Array, tgt: pa.Array, cfg: CleanParams, scripts: tuple[str | None, str | None] = (None, None)
) -> list[tuple[str, np.ndarray]]:
    """One boolean mask per row-level filter, in priority order; switched-off filters are left out."""
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
        use_scripts = scripts if cfg.min_script_share > 0 else (None, None)
        (s_letters, s_script), (t_letters, t_script) = (
            letter_shares(x, script) for x, script in zip((src, tgt), use_scripts, strict=True)
        )
        with np.errstate(invalid="ignore"):  # NaN (no characters, no letters) compares False: not rejected here
            if cfg.min_letter_share > 0:
                masks.append(("garbled", (s_letters < cfg.min_letter_share) | (t_letters < cfg.min_letter_share)))
            if cfg.min_script_share > 0:
                wrong = np.zeros(len(src), dtype=bool)
                for share in (s_script, t_script):
                    if share is not None:
                        wrong |= share < cfg.min_script_share
                masks.append(("wrong_script", wrong))
    return masks


class Cleaner:
    def __init__(self, cfg: CleanParams, src_lang: str, tgt_lang: str, rejected: pq.ParquetWriter):
        self.cfg, self.rejected = cfg, rejected
        self.langs = (src_lang, tgt_lang)
        self.normalizers = (Normalizer(cfg, src_lang), Normalizer(cfg, tgt_lang))
        self.scripts = (SCRIPTS.get(src_lang), SCRIPTS.get(tgt_lang))
        if cfg.min_script_share > 0 and None in self.scripts:
            unknown = [lang for lang, s in zip(self.langs, self.scripts, strict=True) if s is None]
            log.warning("no known script for %s: the wrong_script filter skips that side", unknown)
        self.detector = None
        if cfg.language_id:
            try:
                self.detector = LanguageDetector([*cfg.language_id_candidates, src_lang, tgt_lang])
            except ValueError as err:
                raise PipelineError(f"clean.language_id: {err}") from None
        self.eval_pairs = HashSet64()
        self.seen = HashSet64()
        self.pool = ThreadPoolExecutor(2)  # the two sides of a batch; pyarrow kernels release the GIL

    def close(self) -> None:
        self.pool.shutdown()

    def normalized(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        src, tgt = self.pool.map(lambda f, x: f(x), self.normalizers, (batch.column("src"), batch.column("tgt")))
        return pa.record_batch([src, tgt, batch.column("origin"), batch.column("line")], schema=PAIR_SCHEMA)

    def eval_split(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        batch = self.normalized(batch)
        if self.cfg.remove_eval_overlap:
            hashes = np.unique(pair_hashes(batch.column("src"), batch.column("tgt")))
            self.eval_pairs.add(hashes[~self.eval_pairs.contains(hashes)])
        return batch

    def wrong_language(self, src: pa.Array, tgt: pa.Array, rows: np.ndarray) -> np.ndarray:
        """True for the `rows` where a side long enough to judge is detected as another language."""
        wrong = np.zeros(len(rows), dtype=bool)
        for texts, lang in zip((src, tgt), self.langs, strict=True):
            long_enough = pc.utf8_length(texts).to_numpy(zero_copy_only=False)[rows] >= self.cfg.language_id_min_chars
            checked = rows[long_enough]
            detected = self.detector.detect(texts.take(pa.array(checked)).to_pylist()) if len(checked) else []
            wrong[np.flatnonzero(long_enough)] |= np.array(detected, dtype=object) != lang
        return wrong

    def train_split(self, batch: pa.RecordBatch, split: str) -> tuple[pa.RecordBatch, Counter[str]]:
        batch = self.normalized(batch)
        src, tgt = batch.column("src"), batch.column("tgt")
        reason = np.full(len(batch), None, dtype=object)
        for name, mask in rule_masks(src, tgt, self.cfg, self.scripts):
            reason[mask & (reason == None)] = name  # noqa: E711 - elementwise comparison

        # Corpus-level filters, on the rows every row-level filter let through.
        rows = np.flatnonzero(reason == None)  # noqa: E711
        hashes = pair_hashes(src.take(pa.array(rows)), tgt.take(pa.array(rows)))
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
            reason[rows[self.wrong_language(src, tgt, rows)]] = "wrong_language"

        rejected = reason != None  # noqa: E711
        if rejected.any():
            bad = batch.take(pa.array(np.flatnonzero(rejected)))
            self.rejected.write_batch(
                pa.record_batch(
                    [pa.array([split] * len(bad)), *bad.columns, pa.array(reason[rejected].tolist(), pa.string())],
                    schema=REJECTED_SCHEMA,
                )
            )
        return batch.filter(pa.array(~rejected)), Counter(reason[rejected].tolist())


def run(params: Params, paths: Paths) -> dict[str, Any]:
    if not paths.raw.exists():
        raise MissingArtifact(paths.raw, "download")
    splits = splits_in(paths.raw)
    if "train" not in splits:
        raise MissingArtifact(paths.split_file(paths.raw, "train"), "download")
    # Valid and test splits first: their pairs must be known before training pairs can be checked against them.
    order = [s for s in splits if s != "train"] + ["train"]
    report: dict[str, Any] = {}
    with atomic_path(paths.clean) as out:
        out.mkdir()
        with pq.ParquetWriter(out / "rejected.parquet", REJECTED_SCHEMA) as rejected_writer:
            cleaner = Cleaner(params.clean, params.data.src_lang, params.data.tgt_lang, rejected_writer)
            try:
                for split in order:
                    report[split] = _clean_split(cleaner, split, paths.split_file(paths.raw, split), out)
            finally:
                cleaner.close()
            log.info("deduplication kept %d pair hashes in %.1f MB", len(cleaner.seen), cleaner.seen.nbytes / 2**20)
    report = {split: report[split] for split in splits}  # train first again, as the files list them
    totals = {k: sum(r[k] for r in report.values()) for k in ("input", "kept", "rejected")}
    metrics = {**totals, "splits": report}
    write_json(paths.metrics("clean"), metrics)
    train = report["train"]
    log.info("train: kept %d of %d pairs; rejected %s", train["kept"], train["input"], train["reasons"])
    return {"train_kept": train["kept"], "train_rejected": train["rejected"]}


def _clean_split(cleaner: Cleaner, split: str, source: Path, out: Path) -> dict[str, Any]:
    from tqdm import tqdm

    counts = {"input": 0, "kept": 0, "rejected": 0}
    reasons: Counter[str] = Counter()
    # disable=None: a bar on a terminal only; a log file (DVC, CI, Prefect) gets none of its redraws.
    progress = tqdm(total=count_rows(source), desc=f"clean {split}", unit="pairs", unit_scale=True, mininterval=2,
                    disable=None)
    with pq.ParquetWriter(out / f"{split}.parquet", PAIR_SCHEMA) as writer, progress:
        for batch in iter_pair_batches(source):
            batch = batch.cast(PAIR_SCHEMA)
            counts["input"] += len(batch)
            if split == "train":
                batch, batch_reasons = cleaner.train_split(batch, split)
                reasons.update(batch_reasons)
            else:
                batch = cleaner.eval_split(batch)
            writer.write_batch(batch)
            counts["kept"] += len(batch)
            progress.update(counts["input"] - progress.n)
    counts["rejected"] = sum(reasons.values())
    if counts["kept"] + counts["rejected"] != counts["input"]:
        raise PipelineError(f"clean lost rows in split '{split}': {counts}")  # an invariant, never expected
    if counts["kept"] == 0:
        raise PipelineError(f"clean kept no pairs of split '{split}' ({source}); rejected: {dict(reasons)}")
    return {**counts, "reasons": {r: reasons[r] for r in REASONS if reasons[r]}}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "clean")
