"""clean: normalise every split and filter the training pairs; every rejected row is kept with its reason.

Every row carries its own languages (src_lang, tgt_lang), and a file may mix directions: everything that depends
on a language uses the row's own, and everything that compares pairs stays within the row's direction.

Normalisation (all splits, in this order): HTML entities unescaped and tags removed; control and zero-width
characters removed; Unicode NFC (or NFKC); Moses punctuation normalisation (sacremoses, with the language of
each side of each row: one normaliser per language, built once); any run of whitespace (Unicode spaces included)
collapsed to one space, ends trimmed.

Filters (train only; valid and test sets are normalised but never filtered, so scores stay comparable), each
switched and tuned in `params.clean`, first match wins, in the order of REASONS: empty, too_short_chars,
too_short_words, too_long_chars, too_long_words, length_ratio, source_equals_target, garbled (too few letters),
wrong_script (too few letters in the script of the side's language), overlaps_eval (the pair also occurs in a
valid/test split of the same direction: contamination), duplicate (an identical pair of the same direction passed
every filter above earlier in the corpus), wrong_language (py3langid against the side's language, off by default;
last because it is by far the most expensive, so it only sees pairs that survived everything else).

Everything streams over the raw row groups: the work on a batch is vectorised with pyarrow.compute (RE2 regexes,
Unicode normalisation), except two steps that need Python per string, HTML entities and Moses punctuation, which
run only on the rows a vectorised pre-check finds a trigger character in (a few percent of typical text); the
two sides of a batch are normalised on two threads. A per-language step runs once per language present in the
batch, on that language's rows. Duplicates are found with 64-bit hashes of the normalised pairs keyed by their
direction, kept in sorted numpy runs (HashSet64): 8 bytes per unique training pair, so memory is bounded by that
and not by the text (36 MB for WMT14's 4.5M pairs).

Output: `data/clean/<split>.parquet` (PAIR_SCHEMA), `data/clean/rejected.parquet` (split, the pair columns,
reason) and `metrics/clean.json` (totals, per split, and per direction and split); for every split and every
direction kept + rejected = input, which the stage checks before it finishes. A row whose direction is not in
`data.directions` stops the stage naming the file and the direction.
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
from pipeline.corpus import PAIR_SCHEMA, count_rows, direction_column, iter_pair_batches
from pipeline.errors import MissingArtifact
from pipeline.params import CleanParams, Params
from pipeline.runtime.errors import InputFileError, PipelineError
from pipeline.runtime.languages import SCRIPTS, Directions
from pipeline.text_checks import (
    INVISIBLE,
    HashSet64,
    LanguageDetector,
    first_occurrences,
    language_groups,
    letter_shares_by_language,
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

    def __call__(self, texts: pa.Array, within: pa.Array | None = None) -> pa.Array:
        """`texts` normalised; only the rows where `within` (a boolean mask) is true, when it is given."""
        candidates = pc.fill_null(pc.match_substring_regex(texts, MOSES_TRIGGER), False)
        if within is not None:
            candidates = pc.and_(candidates, within)
        picked = pc.indices_nonzero(candidates)
        if not len(picked):
            return texts
        return pc.replace_with_mask(texts, candidates, self.apply(texts.take(picked)))


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


# --- the filters ------------------------------------------------------------------------------------------


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


def direction_labels(batch: pa.RecordBatch) -> pa.Array:
    """Each row's direction, "src_lang-tgt_lang" (null where a language is missing)."""
    return direction_column(batch)


def check_directions(batch: pa.RecordBatch, labels: pa.Array, source: Path, directions: Directions) -> None:
    """Every row names its languages, and its direction is one of data.directions; InputFileError naming the file
    (and the line of a row without languages) otherwise."""
    if labels.null_count:
        row = int(pc.index(pc.is_null(labels), True).as_py())
        raise InputFileError(source, "a row without src_lang/tgt_lang (every row names its languages): rerun the "
                             "download stage", line=batch.column("line")[row].as_py())
    unknown = sorted(set(pc.unique(labels).to_pylist()) - set(directions.names))
    if unknown:
        raise InputFileError(source, f"rows of direction(s) {', '.join(unknown)}, which data.directions "
                             f"({', '.join(directions.names)}) does not list: rerun the download stage")


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


class SplitTally:
    """Rows in, kept and rejected (with their reasons) of one split, per direction. Kept and rejected are counted
    from what is written, apart from the input count, so `check` proves nothing was lost."""

    def __init__(self, split: str, source: Path):
        self.split, self.source = split, source
        self.input: Counter[str] = Counter()
        self.kept: Counter[str] = Counter()
        self.reasons: dict[str, Counter[str]] = {}

    def add(self, labels: pa.Array, written: pa.Array, rejected_labels: pa.Array, reasons: list[str]) -> None:
        """One batch: every row's direction, the directions of the rows written out and of the rows rejected."""
        self.input.update(_value_counts(labels))
        self.kept.update(_value_counts(written))
        for direction, reason in zip(rejected_labels.to_pylist(), reasons, strict=True):
            self.reasons.setdefault(direction, Counter())[reason] += 1

    def of(self, direction: str) -> dict[str, int]:
        rejected = sum(self.reasons.get(direction, Counter()).values())
        return {"input": self.input[direction], "kept": self.kept[direction], "rejected": rejected}

    def reasons_of(self, direction: str | None = None) -> dict[str, int]:
        """The reasons of one direction, or of the whole split, in the order of REASONS."""
        counts = self.reasons.get(direction, Counter()) if direction else sum(self.reasons.values(), Counter())
        return {r: counts[r] for r in REASONS if counts[r]}

    def totals(self) -> dict[str, Any]:
        figures = [self.of(d) for d in self.input]
        return {**{k: sum(f[k] for f in figures) for k in ("input", "kept", "rejected")}, "reasons": self.reasons_of()}

    def check(self) -> None:
        """kept + rejected = input for every direction (an invariant, never expected to fail), and some pairs kept."""
        for direction in sorted({*self.input, *self.kept, *self.reasons}):
            counts = self.of(direction)
            if counts["kept"] + counts["rejected"] != counts["input"]:
                raise PipelineError(f"clean lost rows of direction {direction} in split '{self.split}': {counts}")
        if not sum(self.kept.values()):
            raise PipelineError(
                f"clean kept no pairs of split '{self.split}' ({self.source}); rejected: {self.reasons_of()}"
            )


def _value_counts(labels: pa.Array) -> Counter[str]:
    counts = pc.value_counts(labels)
    return Counter(dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True)))


def run(params: Params, paths: Paths) -> dict[str, Any]:
    if not paths.raw.exists():
        raise MissingArtifact(paths.raw, "download")
    splits = splits_in(paths.raw)
    if "train" not in splits:
        raise MissingArtifact(paths.split_file(paths.raw, "train"), "download")
    directions = params.data.pairs
    # Valid and test splits first: their pairs must be known before training pairs can be checked against them.
    order = [s for s in splits if s != "train"] + ["train"]
    tallies: dict[str, SplitTally] = {}
    with atomic_path(paths.clean) as out:
        out.mkdir()
        with pq.ParquetWriter(out / "rejected.parquet", REJECTED_SCHEMA) as rejected_writer:
            cleaner = Cleaner(params.clean, directions)
            try:
                for split in order:
                    source = paths.split_file(paths.raw, split)
                    tallies[split] = _clean_split(cleaner, split, source, out, rejected_writer)
            finally:
                cleaner.close()
            log.info("deduplication kept %d pair hashes in %.1f MB", len(cleaner.seen), cleaner.seen.nbytes / 2**20)
        _check_every_direction_trains(tallies, directions)
    report = {split: tallies[split].totals() for split in splits}  # train first again, as the files list them
    totals = {k: sum(r[k] for r in report.values()) for k in ("input", "kept", "rejected")}
    per_direction = {
        d: {**{split: tallies[split].of(d) for split in splits}, "reasons": tallies["train"].reasons_of(d)}
        for d in directions.names
    }
    write_json(paths.metrics("clean"), {**totals, "splits": report, "directions": per_direction})
    train = report["train"]
    log.info("train: kept %d of %d pairs; rejected %s", train["kept"], train["input"], train["reasons"])
    if len(directions.names) > 1:
        for d, figures in per_direction.items():
            log.info("train %s: kept %d of %d pairs; rejected %s", d, figures["train"]["kept"],
                     figures["train"]["input"], figures["reasons"])
    return {"train_kept": train["kept"], "train_rejected": train["rejected"]}


def _check_every_direction_trains(tallies: dict[str, SplitTally], directions: Directions) -> None:
    """Each direction of data.directions keeps training pairs and has valid pairs (when there is a valid split);
    otherwise the model could not learn or be validated on it: a PipelineError naming the direction."""
    train = tallies["train"]
    for d in directions.names:
        if not train.kept[d]:
            raise PipelineError(f"clean kept no training pairs of direction {d} ({train.input[d]} in "
                                f"{train.source}); rejected: {train.reasons_of(d)}")
        if "valid" in tallies and not tallies["valid"].input[d]:
            raise PipelineError(f"{tallies['valid'].source} has no pairs of direction {d}: every direction needs "
                                "validation pairs")


def _clean_split(
    cleaner: Cleaner, split: str, source: Path, out: Path, rejected_writer: pq.ParquetWriter
) -> SplitTally:
    from tqdm import tqdm

    tally = SplitTally(split, source)
    # disable=None: a bar on a terminal only; a log file (DVC, CI, Prefect) gets none of its redraws.
    progress = tqdm(total=count_rows(source), desc=f"clean {split}", unit="pairs", unit_scale=True, mininterval=2,
                    disable=None)
    with pq.ParquetWriter(out / f"{split}.parquet", PAIR_SCHEMA) as writer, progress:
        for batch in iter_pair_batches(source):
            batch = batch.cast(PAIR_SCHEMA)
            labels = direction_labels(batch)
            check_directions(batch, labels, source, cleaner.directions)
            if split == "train":
                batch, reason = cleaner.train_split(batch, labels)
            else:
                batch, reason = cleaner.eval_split(batch, labels), np.full(len(batch), None, dtype=object)
            rejected = reason != None  # noqa: E711 - elementwise comparison
            if rejected.any():
                _write_rejected(rejected_writer, split, batch.filter(pa.array(rejected)), reason[rejected].tolist())
            kept = pa.array(~rejected)
            writer.write_batch(batch.filter(kept))
            tally.add(labels, labels.filter(kept), labels.filter(pa.array(rejected)), reason[rejected].tolist())
            progress.update(len(batch))
    tally.check()
    return tally


def _write_rejected(writer: pq.ParquetWriter, split: str, bad: pa.RecordBatch, reasons: list[str]) -> None:
    columns = [pa.array([split] * len(bad), pa.string()), *bad.columns, pa.array(reasons, pa.string())]
    writer.write_batch(pa.record_batch(columns, schema=REJECTED_SCHEMA))


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "clean")
