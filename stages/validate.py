"""validate: check the cleaned splits with a Great Expectations suite before anything is trained on them.

The clean stage filters the training split and normalises every split; this stage checks that its output holds
what the rest of the pipeline assumes, so a bug or a changed threshold upstream stops the DAG here instead of
surfacing later as a bad model. The clean stage's thresholds (`params.clean`) are the bounds.

The whole training split is validated, every row, in memory that does not grow with the corpus: GX has no
pairwise checks (source != target, length ratio, duplicate pairs) and the text itself is what costs memory
(~1.1 KB a pair in pandas), so the split is first streamed, row group by row group, into files of the per-row
measures in DERIVED_COLUMNS below (about 45 bytes a pair; no text), one file per `validate.chunk_rows` rows, and
GX validates each chunk as a batch of its own. Duplicates across chunks are found while streaming, with the clean
stage's hash set (8 bytes a pair): `is_duplicate` marks every repeat of an earlier row. Language is checked with
py3langid on a seeded sample of `validate.language_sample` rows (a full pass would cost as much as the clean
stage's optional language filter); every other expectation sees every row. Failed expectations are reported with
example rows, whose text is then looked up in the split by row number.

Why chunks: GX loads a batch into pandas whole, so one batch of the whole split made the stage's peak memory grow
with the corpus (398 MB at 250k pairs, 534 MB at 1M); and a data source's execution engine keeps every batch it
loaded, so each chunk runs with a data source and checkpoint of its own, deleted after it ran (bench/data_prep.py:
372 MB at 250k pairs, 424 MB at 1M, 527 MB at 4.5M, where one checkpoint over all chunks took 721 MB). The cost
is that `validate.mostly` applies within each chunk, and the minimum row count is checked on the last chunk as
the rows the earlier chunks do not supply.

Each expectation carries `meta={"critical": bool}`. Every split (and every chunk of the training split) is a
validation definition of its own, each page added to one Data Docs site (written to `reports/validation/`);
`metrics/validation.json` summarises the same results, the training chunks merged into one summary.
Both are written before a failed critical expectation raises `ValidationFailed`, so the report is there to
inspect. Great Expectations and pandas are imported inside functions: importing GX alone takes seconds.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.artifacts import Paths, atomic_path, splits_in, write_json
from pipeline.corpus import PAIR_SCHEMA, count_rows, iter_pair_batches
from pipeline.errors import InputFileError, MissingArtifact, ValidationFailed
from pipeline.params import Params
from pipeline.text_checks import (
    INVISIBLE,
    SCRIPTS,
    HashSet64,
    LanguageDetector,
    first_occurrences,
    forget_language_model,
    letter_shares,
    pair_hashes,
)

log = logging.getLogger("mtpipe.validate")

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
        "an earlier row of the split holds the same pair (compared by 64-bit xxh3 hashes of src + TAB + tgt)",
    ),
    "has_control": (pa.bool_(), "control or invisible (zero-width, bidi, BOM) characters on either side"),
    "has_html": (
        pa.bool_(),
        "an HTML tag or entity on either side; a warning only, since real text such as 'if a<b and c>d' matches",
    ),
    "src_letter_share": (pa.float32(), "letters (and combining marks) / non-space characters in src"),
    "tgt_letter_share": (pa.float32(), "letters (and combining marks) / non-space characters in tgt"),
    "src_script_share": (pa.float32(), "letters in the script of data.src_lang / letters in src"),
    "tgt_script_share": (pa.float32(), "letters in the script of data.tgt_lang / letters in tgt"),
    "src_lang": (LANGUAGE, "language py3langid detects in src, on the seeded sample only (null elsewhere)"),
    "tgt_lang": (LANGUAGE, "language py3langid detects in tgt, on the seeded sample only (null elsewhere)"),
}
DERIVED_FILE_SCHEMA = pa.schema([(name, dtype) for name, (dtype, _) in DERIVED_COLUMNS.items()])
SITE_NAME = "validation"
SOURCE_NAME = "clean"  # the Data Docs name each page <data source>-<asset>: clean-train.html
EXAMPLES_IN_METRICS = 5
EXAMPLES_IN_ERROR = 3
# Columns of an example row (the derived train file has no text: it is looked up by origin and line afterwards).
ROW_COLUMNS = ("origin", "line", "src", "tgt")


# --- derived columns (pyarrow, batch by batch, so memory stays bounded before GX loads the file) ---------


@dataclass
class Measures:
    """What derive_columns needs besides the batch: thresholds, scripts and the language sample."""

    params: Params
    pool: ThreadPoolExecutor
    sample: np.ndarray  # sorted 0-based rows of the language sample
    detector: LanguageDetector | None = None
    seen: HashSet64 = field(default_factory=HashSet64)  # the pairs of the rows measured so far

    def duplicates(self, src: pa.Array, tgt: pa.Array) -> np.ndarray:
        """True for every row whose pair occurred earlier in the split (in this or an earlier batch)."""
        hashes = pair_hashes(src, tgt)
        repeat = self.seen.contains(hashes) | ~first_occurrences(hashes)
        self.seen.add(hashes[~repeat])
        return repeat

    @property
    def langs(self) -> tuple[str, str]:
        return self.params.data.src_lang, self.params.data.tgt_lang


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


def detected_languages(text: pa.Array, picked: np.ndarray, measures: Measures) -> pa.Array:
    """The language of the sampled rows long enough to judge, null elsewhere."""
    languages = np.full(len(text), None, dtype=object)
    if measures.detector is not None and len(picked):
        min_chars = measures.params.clean.language_id_min_chars
        long_enough = picked[pc.utf8_length(text.take(pa.array(picked))).to_numpy(zero_copy_only=False) >= min_chars]
        if len(long_enough):
            languages[long_enough] = measures.detector.detect(text.take(pa.array(long_enough)).to_pylist())
    return pa.array(languages, pa.string()).cast(LANGUAGE)


def derive_columns(batch: pa.RecordBatch, measures: Measures, first_row: int = 0) -> pa.RecordBatch:
    """The DERIVED_COLUMNS of a batch of pairs whose first row is `first_row` of the split; the two sides are
    measured on two threads."""
    src, tgt = batch.column("src"), batch.column("tgt")
    scripts = [SCRIPTS.get(lang) for lang in measures.langs]
    s, t = measures.pool.map(side_features, (src, tgt), scripts)
    shorter = pc.cast(pc.min_element_wise(s["chars"], t["chars"]), pa.float64())
    longer = pc.cast(pc.max_element_wise(s["chars"], t["chars"]), pa.float64())
    ratio_applies = pc.greater_equal(shorter, max(measures.params.clean.ratio_min_chars, 1))
    sample = measures.sample
    picked = sample[(sample >= first_row) & (sample < first_row + len(batch))] - first_row
    origin = batch.column("origin")
    derived = {
        "origin": origin.dictionary_encode() if not pa.types.is_dictionary(origin.type) else origin,
        "line": batch.column("line"),
        "src_chars": s["chars"],
        "tgt_chars": t["chars"],
        "src_words": s["words"],
        "tgt_words": t["words"],
        "length_ratio": pc.if_else(ratio_applies, pc.divide(longer, shorter), None),
        "is_copy": pc.equal(src, tgt),
        "is_duplicate": pa.array(measures.duplicates(src, tgt), pa.bool_()),
        "has_control": pc.or_kleene(s["has_control"], t["has_control"]),
        "has_html": pc.or_kleene(s["has_html"], t["has_html"]),
        "src_letter_share": s["letter_share"],
        "tgt_letter_share": t["letter_share"],
        "src_script_share": s["script_share"],
        "tgt_script_share": t["script_share"],
        "src_lang": detected_languages(src, picked, measures),
        "tgt_lang": detected_languages(tgt, picked, measures),
    }
    return pa.RecordBatch.from_arrays(
        [derived[field.name].cast(field.type) for field in DERIVED_FILE_SCHEMA],
        schema=DERIVED_FILE_SCHEMA,
    )


@dataclass(frozen=True)
class Chunk:
    """A file of derived columns for rows first_row ... first_row + rows - 1 (0-based) of the training split."""

    path: Path
    first_row: int
    rows: int

    @property
    def name(self) -> str:
        """The GX asset and suite name: "train" when the split is one chunk, else "train-rows-A-B"."""
        return self.path.stem


def chunk_files(work: Path, rows: int, chunk_rows: int) -> list[Chunk]:
    """Where each chunk's derived columns go: one file named "train", or "train-rows-A-B" (1-based, inclusive)."""
    if rows <= chunk_rows:
        return [Chunk(work / "train.parquet", 0, rows)]
    starts = range(0, rows, chunk_rows)
    return [
        Chunk(work / f"train-rows-{a + 1}-{min(a + chunk_rows, rows)}.parquet", a, min(chunk_rows, rows - a))
        for a in starts
    ]


def write_derived(train_file: Path, work: Path, params: Params) -> tuple[list[Chunk], dict[str, Any]]:
    """Stream the train split through derive_columns into chunk files, in bounded memory; returns the chunks and
    what the language sample covered."""
    rows = count_rows(train_file)
    vp = params.validate_
    sample = language_sample(rows, vp.language_sample, vp.seed)
    detector = None
    if len(sample):
        try:
            detector = LanguageDetector(
                [*params.clean.language_id_candidates, params.data.src_lang, params.data.tgt_lang]
            )
        except ValueError as err:
            raise ValidationFailed(f"language check: {err}") from None
    chunks = chunk_files(work, rows, vp.chunk_rows)
    with ThreadPoolExecutor(2) as pool, ExitStack() as files:
        writers = [files.enter_context(pq.ParquetWriter(chunk.path, DERIVED_FILE_SCHEMA)) for chunk in chunks]
        measures = Measures(params, pool, sample, detector)
        first_row = 0
        for batch in iter_pair_batches(train_file):
            derived = derive_columns(batch.cast(PAIR_SCHEMA), measures, first_row)
            # The batch's rows, cut at chunk boundaries.
            for i in range(first_row // vp.chunk_rows, (first_row + len(batch) - 1) // vp.chunk_rows + 1):
                a = max(chunks[i].first_row, first_row) - first_row
                b = min(chunks[i].first_row + chunks[i].rows, first_row + len(batch)) - first_row
                writers[i].write_batch(derived.slice(a, b - a))
            first_row += len(batch)
    # The detector's model (~110 MB) and the hash set are not needed while GX holds a chunk: hand them back first.
    del measures, detector
    forget_language_model()
    return chunks, {"language_sample_rows": len(sample)}


def fetch_rows(path: Path, keys: set[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The pairs at the given (origin, line) of a split, streamed (for example rows of failed expectations)."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    lines = pa.array(sorted({line for _, line in keys}), pa.int64())
    for batch in iter_pair_batches(path):
        candidates = batch.filter(pc.is_in(batch.column("line"), value_set=lines))
        for pair in candidates.to_pylist():
            if (pair["origin"], pair["line"]) in keys:
                found[(pair["origin"], pair["line"])] = pair
        if len(found) == len(keys):
            break
    return found


# --- the suites ------------------------------------------------------------------------------------------


def train_expectations(params: Params, min_rows: int) -> list[Any]:
    """The suite of a chunk of the training split's derived columns; `min_rows` is what its row count is checked
    against (the chunk's share of validate.min_rows, see train_batch)."""
    import great_expectations as gx

    ex, clean, vp, mostly = gx.expectations, params.clean, params.validate_, params.validate_.mostly
    critical, warning = {"critical": True}, {"critical": False}
    expectations = [ex.ExpectTableRowCountToBeBetween(min_value=min_rows, meta=critical)]
    # Not null: the length of a null side is null.
    expectations += [ex.ExpectColumnValuesToNotBeNull(column=f"{side}_chars", meta=critical) for side in ("src", "tgt")]
    bounds = {"chars": (clean.min_chars, clean.max_chars), "words": (clean.min_words, clean.max_words)}
    expectations += [
        ex.ExpectColumnValuesToBeBetween(
            column=f"{side}_{unit}", min_value=low, max_value=high, mostly=mostly, meta=critical
        )
        for unit, (low, high) in bounds.items()
        for side in ("src", "tgt")
    ]
    expectations += [
        ex.ExpectColumnValuesToBeBetween(
            column="length_ratio", max_value=clean.max_length_ratio, mostly=mostly, meta=critical
        ),
        # With clean.reject_copies off, copies are expected; they are still reported.
        ex.ExpectColumnValuesToBeInSet(column="is_copy", value_set=[False], meta={"critical": clean.reject_copies}),
        # Without deduplication in the clean stage duplicates are expected; they are still reported.
        ex.ExpectColumnValuesToBeInSet(column="is_duplicate", value_set=[False], meta={"critical": clean.deduplicate}),
        ex.ExpectColumnValuesToBeInSet(column="has_control", value_set=[False], meta=critical),
        ex.ExpectColumnValuesToBeInSet(column="has_html", value_set=[False], meta=warning),
    ]
    if clean.min_letter_share > 0:
        expectations += [
            ex.ExpectColumnValuesToBeBetween(
                column=f"{side}_letter_share", min_value=clean.min_letter_share, mostly=mostly, meta=critical
            )
            for side in ("src", "tgt")
        ]
    if clean.min_script_share > 0:
        expectations += [
            ex.ExpectColumnValuesToBeBetween(
                column=f"{side}_script_share", min_value=clean.min_script_share, mostly=mostly, meta=critical
            )
            for side, lang in zip(("src", "tgt"), (params.data.src_lang, params.data.tgt_lang), strict=True)
            if lang in SCRIPTS
        ]
    if vp.language_sample > 0:
        # Nulls (rows outside the sample, sides too short to judge) are not counted: `mostly` is a share of the
        # sampled sides.
        expectations += [
            ex.ExpectColumnValuesToBeInSet(
                column=f"{side}_lang", value_set=[lang], mostly=vp.min_language_match, meta=critical
            )
            for side, lang in zip(("src", "tgt"), (params.data.src_lang, params.data.tgt_lang), strict=True)
        ]
    return expectations


def heldout_expectations() -> list[Any]:
    """Valid and test splits are normalised but never filtered: they only have to be present and complete."""
    import great_expectations as gx

    ex, critical = gx.expectations, {"critical": True}
    return [
        ex.ExpectTableRowCountToBeBetween(min_value=1, meta=critical),
        ex.ExpectColumnValuesToNotBeNull(column="src", meta=critical),
        ex.ExpectColumnValuesToNotBeNull(column="tgt", meta=critical),
    ]


def _quiet_gx() -> None:
    # GX logs at INFO while it imports and validates; only its warnings are worth a user's attention.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)


@dataclass(frozen=True)
class GxBatch:
    """What one validation definition checks: a Parquet file against a suite; `notes` (markdown) are shown on
    the suite's page in the Data Docs."""

    name: str
    path: Path
    expectations: list[Any]
    notes: str | None = None


def run_checkpoint(batches: list[GxBatch], site_dir: Path) -> list[Any]:
    """Validate each batch (a Parquet asset of its own) with a checkpoint whose action adds its page to the Data
    Docs in `site_dir`, one batch at a time. Returns the suite validation results in `batches` order."""
    _quiet_gx()
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )
    from great_expectations.execution_engine import pandas_execution_engine

    config = DataContextConfig(
        # In-memory stores and no default (temporary-directory) docs site: the only files written are ours.
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
        data_docs_sites={
            SITE_NAME: {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(site_dir.resolve()),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
        },
    )
    context = gx.get_context(mode="ephemeral", project_config=config)
    result_format = {
        "result_format": "SUMMARY",
        "partial_unexpected_count": EXAMPLES_IN_METRICS,
        # Unexpected values are located by the corpus file and line they came from.
        "unexpected_index_column_names": ["origin", "line"],
        "include_unexpected_rows": True,
    }
    results = []
    # GX fingerprints each batch below 1 GB by hashing every cell (~4 s per 1M pairs here) only to print the hash
    # in the Data Docs; DVC already hashes data/clean, so the stage skips it (and restores the setting after).
    threshold = pandas_execution_engine.HASH_THRESHOLD
    pandas_execution_engine.HASH_THRESHOLD = 0
    try:
        for b in batches:
            # A data source per batch, deleted after it ran: a data source's execution engine keeps every batch
            # it loaded for as long as the data source lives, which made memory grow with the chunks.
            source = context.data_sources.add_pandas(SOURCE_NAME)
            suite = context.suites.add(gx.ExpectationSuite(name=b.name, expectations=b.expectations, notes=b.notes))
            data = source.add_parquet_asset(b.name, path=b.path).add_batch_definition_whole_dataframe(b.name)
            definition = context.validation_definitions.add(
                gx.ValidationDefinition(name=b.name, data=data, suite=suite)
            )
            checkpoint = context.checkpoints.add(
                gx.Checkpoint(
                    name=b.name,
                    validation_definitions=[definition],
                    actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=[SITE_NAME])],
                    result_format=result_format,
                )
            )
            (result,) = checkpoint.run(run_id=RunIdentifier(run_name="validate")).run_results.values()
            results.append(result)
            context.data_sources.delete(SOURCE_NAME)
    finally:
        pandas_execution_engine.HASH_THRESHOLD = threshold
    return results


# --- summarising results ---------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A JSON-safe Python value: numpy scalars unwrapped, NaN/NA as None."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        try:
            value = value.item()
        except (ValueError, TypeError):
            pass
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    try:
        import pandas as pd

        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return str(value)


def _example_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = result.get("unexpected_rows")
    if rows is None or not hasattr(rows, "to_dict"):
        return []
    keep = [c for c in ROW_COLUMNS if c in rows.columns]
    return [_plain(r) for r in rows[keep].head(EXAMPLES_IN_METRICS).to_dict(orient="records")]


def _exception_message(info: dict[str, Any] | None) -> str | None:
    if not info:
        return None
    if "raised_exception" not in info:  # keyed by metric: {metric_id: {raised_exception, ...}}
        infos = [v for v in info.values() if isinstance(v, dict)]
        info = next((v for v in infos if v.get("raised_exception")), {})
    return info.get("exception_message") if info.get("raised_exception") else None


def describe_failure(evr: Any) -> dict[str, Any]:
    """One failed expectation as the metrics JSON reports it."""
    config, result = evr.expectation_config, evr.result or {}
    kwargs = {k: _plain(v) for k, v in config.kwargs.items() if k not in ("batch_id", "column") and v is not None}
    failure = {
        "expectation": config.type,
        "column": config.kwargs.get("column"),
        "kwargs": kwargs,
        "unexpected_count": _plain(result.get("unexpected_count")),
        "unexpected_percent": _plain(result.get("unexpected_percent")),
        "observed_value": _plain(result.get("observed_value")),
        "examples": _plain(list(result.get("partial_unexpected_list") or [])[:EXAMPLES_IN_METRICS]),
        "rows": _example_rows(result),
    }
    error = _exception_message(evr.exception_info)
    if error:
        failure["error"] = error
    return {k: v for k, v in failure.items() if v is not None}


def merge_failures(failures: list[dict[str, Any]], rows: int, min_rows: int | None) -> dict[str, Any]:
    """One expectation's failures in several chunks as one: counts summed, the first examples kept; the row count
    is the split's, against `min_rows` when given (validate.min_rows for the chunked training split)."""
    merged = {**failures[0], "examples": [], "rows": []}
    if merged["expectation"] == "expect_table_row_count_to_be_between" and min_rows is not None:
        merged.update(observed_value=rows, kwargs={**merged["kwargs"], "min_value": min_rows})
    counted = [f for f in failures if f.get("unexpected_count") is not None]
    if counted:
        unexpected = sum(f["unexpected_count"] for f in counted)
        # unexpected_percent is of the non-null values: recover each chunk's count of them to weigh the shares.
        checked = sum(
            f["unexpected_count"] * 100 / f["unexpected_percent"] for f in counted if f.get("unexpected_percent")
        )
        merged.update(unexpected_count=unexpected, unexpected_percent=100 * unexpected / checked if checked else None)
    for f in failures:
        merged["examples"] = (merged["examples"] + f.get("examples", []))[:EXAMPLES_IN_METRICS]
        merged["rows"] = (merged["rows"] + f.get("rows", []))[:EXAMPLES_IN_METRICS]
    errors = [f["error"] for f in failures if f.get("error")]
    if errors:
        merged["error"] = errors[0]
    return {k: v for k, v in merged.items() if v is not None}


def summarise(rows: int, suite_results: list[Any], min_rows: int | None = None) -> dict[str, Any]:
    """A split's results; a split validated in chunks (same expectations, in the same order) summarised as one:
    an expectation succeeds when it succeeds on every chunk."""
    critical, warnings = [], []
    evaluated = len(suite_results[0].results)
    for i in range(evaluated):
        failed = [describe_failure(r.results[i]) for r in suite_results if not r.results[i].success]
        if failed:
            merged = merge_failures(failed, rows, min_rows)
            config = suite_results[0].results[i].expectation_config
            (critical if config.meta.get("critical", True) else warnings).append(merged)
    return {
        "success": not critical,
        "rows": rows,
        "evaluated_expectations": evaluated,
        "successful_expectations": evaluated - len(critical) - len(warnings),
        "failed_critical": critical,
        "failed_non_critical": warnings,
    }


def _short(text: Any, width: int = 60) -> str:
    if not isinstance(text, str):
        return repr(text)
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def format_failure(split: str, failure: dict[str, Any]) -> str:
    """`split: type on column: N unexpected (P%) [kwargs]`, then up to 3 example rows as `origin:line src= tgt=`."""
    where = f" on {failure['column']}" if failure.get("column") else ""
    if failure.get("unexpected_count") is not None:
        percent = failure.get("unexpected_percent")
        what = f"{failure['unexpected_count']} unexpected" + (f" ({percent:.2f}%)" if percent is not None else "")
    else:
        what = f"observed {failure.get('observed_value')!r}"
    expected = ", ".join(f"{k}={v!r}" for k, v in failure["kwargs"].items())
    line = f"  {split}: {failure['expectation']}{where}: {what}" + (f" [{expected}]" if expected else "")
    if failure.get("error"):
        line += f"; error: {failure['error']}"
    for row in failure["rows"][:EXAMPLES_IN_ERROR]:
        line += (
            f"\n      {row.get('origin')}:{row.get('line')} src={_short(row.get('src'))} tgt={_short(row.get('tgt'))}"
        )
    if not failure["rows"] and failure.get("examples"):
        line += f"\n      e.g. {', '.join(_short(v) for v in failure['examples'][:EXAMPLES_IN_ERROR])}"
    return line


# --- the stage -------------------------------------------------------------------------------------------


# --- the stage -------------------------------------------------------------------------------------------


def _check_readable(path: Path) -> None:
    try:
        names = pq.read_schema(path).names
    except (pa.ArrowInvalid, OSError) as err:
        raise InputFileError(path, f"not a readable Parquet file ({err})") from None
    missing = [c for c in PAIR_SCHEMA.names if c not in names]
    if missing:
        raise InputFileError(path, f"missing column(s) {missing}; has {names}")


def add_example_text(train_file: Path, summary: dict[str, Any]) -> None:
    """Fill in src and tgt of the train split's example rows (the derived file GX saw has no text)."""
    failures = summary["failed_critical"] + summary["failed_non_critical"]
    wanted = {(r.get("origin"), r.get("line")) for f in failures for r in f["rows"]}
    texts = fetch_rows(train_file, wanted) if wanted else {}
    for failure in failures:
        for row in failure["rows"]:
            pair = texts.get((row.get("origin"), row.get("line")), {})
            row.update({"src": pair.get("src"), "tgt": pair.get("tgt")})
        if failure.get("column") == "is_duplicate":  # True says nothing: show the pair that repeats
            failure["examples"] = [f"{r['src']}\t{r['tgt']}" for r in failure["rows"]]


def train_batch(params: Params, chunk: Chunk, rows: int, source: Path, sample: dict[str, Any]) -> GxBatch:
    """A chunk of the training split as GX checks it. The row count of the last chunk is checked against the rows
    the earlier ones leave to reach validate.min_rows (1 for the others), so the split as a whole is checked."""
    last = chunk.first_row + chunk.rows == rows
    min_rows = max(params.validate_.min_rows - chunk.first_row, 1) if last else 1
    # The Data Docs show the derived file's (then deleted) path; the notes name the real source.
    part = (
        "every row"
        if chunk.rows == rows
        else f"rows {chunk.first_row + 1:,} to {chunk.first_row + chunk.rows:,} of {rows:,}"
    )
    columns = "\n".join(f"- `{name}`: {meaning}" for name, (_, meaning) in DERIVED_COLUMNS.items())
    notes = (
        f"Data: {part} of `{source}`, as the measures below (no text); the language columns on a seeded sample of "
        f"{sample['language_sample_rows']} rows of the split (validate.language_sample, validate.seed). The row "
        f"count expectation asks for the rows this chunk adds towards validate.min_rows = "
        f"{params.validate_.min_rows}.\n\n{columns}"
    )
    return GxBatch(chunk.name, chunk.path, train_expectations(params, min_rows), notes)


def run(params: Params, paths: Paths) -> dict[str, Any]:
    start = time.perf_counter()
    splits = splits_in(paths.clean)
    if "train" not in splits:
        raise MissingArtifact(paths.split_file(paths.clean, "train"), "clean")
    inputs = {split: paths.split_file(paths.clean, split) for split in splits}
    for path in inputs.values():
        _check_readable(path)
    rows = {split: count_rows(path) for split, path in inputs.items()}

    report = paths.validation_report
    report.parent.mkdir(parents=True, exist_ok=True)
    # The derived train file lives only for this run, beside the report (not in /tmp, which may be a small
    # in-memory filesystem).
    with tempfile.TemporaryDirectory(prefix=".validate-", dir=report.parent) as work:
        chunks, sample = write_derived(inputs["train"], Path(work), params)
        batches = [train_batch(params, chunk, rows["train"], inputs["train"], sample) for chunk in chunks]
        heldout = [split for split in inputs if split != "train"]
        batches += [GxBatch(split, inputs[split], heldout_expectations()) for split in heldout]
        with atomic_path(report) as site_dir:
            results = run_checkpoint(batches, site_dir)

    by_split = {
        "train": results[: len(chunks)],
        **{s: [r] for s, r in zip(heldout, results[len(chunks) :], strict=True)},
    }
    # The chunks' row counts are merged into the split's, checked against validate.min_rows.
    min_rows = {"train": params.validate_.min_rows}
    per_split = {split: summarise(rows[split], by_split[split], min_rows.get(split)) for split in inputs}
    add_example_text(inputs["train"], per_split["train"])
    per_split["train"].update(sample)
    failed = [(s, f) for s, summary in per_split.items() for f in summary["failed_critical"]]
    warned = [(s, f) for s, summary in per_split.items() for f in summary["failed_non_critical"]]
    evaluated = sum(s["evaluated_expectations"] for s in per_split.values())
    metrics = {
        "success": not failed,
        "rows": sum(rows.values()),
        "evaluated_expectations": evaluated,
        "failed_critical": len(failed),
        "failed_non_critical": len(warned),
        "splits": per_split,
    }
    write_json(paths.metrics("validation"), metrics)

    seconds = time.perf_counter() - start
    log.info(
        "validated %d rows in %d split(s) against %d expectations in %.1fs: %d critical failure(s), %d warning(s)",
        metrics["rows"],
        len(per_split),
        evaluated,
        seconds,
        len(failed),
        len(warned),
    )
    for split, failure in warned:
        log.warning(
            "non-critical expectation failed (see %s):\n%s", report / "index.html", format_failure(split, failure)
        )
    if failed:
        lines = "\n".join(format_failure(split, failure) for split, failure in failed)
        raise ValidationFailed(
            f"{len(failed)} critical expectation(s) failed; Data Docs in {report / 'index.html'}, "
            f"details in {paths.metrics('validation')}:\n{lines}"
        )
    return {k: v for k, v in metrics.items() if k != "splits"}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "validate")
