"""validate: check the cleaned splits with a Great Expectations suite before anything is trained on them.

The clean stage filters the training split and normalises every split; this stage checks that its output holds
what the rest of the pipeline assumes, so a bug or a changed threshold upstream stops the DAG here instead of
surfacing later as a bad model. GX has no pairwise checks (source != target, length ratio, duplicate pairs), so
the training split is first extended with the precomputed per-row columns of DERIVED_COLUMNS below, and the
expectations run on those. The clean stage's thresholds (`params.clean`) are the bounds.

Each expectation carries `meta={"critical": bool}`. Every split runs as its own validation definition in one
checkpoint, so the Data Docs site (written to `reports/validation/`) shows them all; `metrics/validation.json`
summarises the same results. Both are written before a failed critical expectation raises `ValidationFailed`,
so the report is there to inspect. Great Expectations and pandas are imported inside functions: importing GX
alone takes seconds.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.artifacts import Paths, atomic_path, splits_in, write_json
from pipeline.corpus import PAIR_SCHEMA, count_rows, iter_pair_batches
from pipeline.errors import InputFileError, MissingArtifact, ValidationFailed
from pipeline.params import CleanParams, Params

log = logging.getLogger("mtpipe.validate")

# RE2 syntax (pyarrow): C0 controls, DEL, C1 controls, zero-width space/non-joiner/joiner, BOM. The clean
# stage removes all of them and turns tabs and newlines into spaces, so none may remain.
CONTROL_PATTERN = r"[\x00-\x1f\x7f-\x{9f}\x{200b}-\x{200d}\x{feff}]"
HTML_PATTERN = r"<[a-zA-Z/][^>]*>|&[a-z]+;"
# A run of characters that are not whitespace as Python's str.isspace() defines it (ASCII \t-\r, \x1c-\x1f,
# space, U+0085, and the Unicode separators \p{Z}), so the count equals `len(s.split())`, as the clean stage
# counts words.
WORD_PATTERN = r"[^\t-\r\x1c-\x20\x{85}\p{Z}]+"

# name -> (type, meaning); the meanings also appear as notes on the train suite's page in the Data Docs.
DERIVED_COLUMNS: dict[str, tuple[pa.DataType, str]] = {
    "src_chars": (pa.int64(), "characters (code points) in src"),
    "tgt_chars": (pa.int64(), "characters (code points) in tgt"),
    "src_words": (pa.int64(), "whitespace-separated words in src, as Python's str.split() counts them"),
    "tgt_words": (pa.int64(), "whitespace-separated words in tgt, as Python's str.split() counts them"),
    "length_ratio": (
        pa.float64(),
        "longer / shorter side in characters; null (not checked) when the shorter side has fewer than "
        "clean.ratio_min_chars characters, where the clean stage does not apply the ratio filter either",
    ),
    "is_copy": (pa.bool_(), "src == tgt"),
    "pair_key": (pa.string(), "src + TAB + tgt (whitespace is collapsed upstream, so no TAB occurs inside)"),
    "has_control": (pa.bool_(), "C0/C1 control or zero-width characters (U+200B-U+200D, U+FEFF) on either side"),
    "has_html": (
        pa.bool_(),
        "an HTML tag or entity on either side; a warning only, since real text such as 'if a<b and c>d' matches",
    ),
}
DERIVED_FILE_SCHEMA = pa.schema([*PAIR_SCHEMA, *((name, dtype) for name, (dtype, _) in DERIVED_COLUMNS.items())])
SITE_NAME = "validation"
EXAMPLES_IN_METRICS = 5
EXAMPLES_IN_ERROR = 3
ROW_COLUMNS = ("origin", "line", "src", "tgt")


# --- derived columns (pyarrow, batch by batch, so memory stays bounded before GX loads the file) ---------


def side_features(text: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """(chars, words, has_control, has_html) for one side of a batch."""
    chars = pc.cast(pc.utf8_length(text), pa.int64())
    words = pc.cast(pc.count_substring_regex(text, WORD_PATTERN), pa.int64())
    return chars, words, pc.match_substring_regex(text, CONTROL_PATTERN), pc.match_substring_regex(text, HTML_PATTERN)


def derive_columns(batch: pa.RecordBatch, clean: CleanParams, pool: ThreadPoolExecutor) -> pa.RecordBatch:
    """The pair batch with the DERIVED_COLUMNS appended; the two sides are computed on two threads."""
    src, tgt = batch.column("src"), batch.column("tgt")
    (src_chars, src_words, src_control, src_html), (tgt_chars, tgt_words, tgt_control, tgt_html) = pool.map(
        side_features, (src, tgt)
    )
    shorter = pc.cast(pc.min_element_wise(src_chars, tgt_chars), pa.float64())
    longer = pc.cast(pc.max_element_wise(src_chars, tgt_chars), pa.float64())
    ratio_applies = pc.greater_equal(shorter, max(clean.ratio_min_chars, 1))
    derived = {
        "src_chars": src_chars,
        "tgt_chars": tgt_chars,
        "src_words": src_words,
        "tgt_words": tgt_words,
        "length_ratio": pc.if_else(ratio_applies, pc.divide(longer, shorter), None),
        "is_copy": pc.equal(src, tgt),
        "pair_key": pc.binary_join_element_wise(src, tgt, "\t"),
        "has_control": pc.or_kleene(src_control, tgt_control),
        "has_html": pc.or_kleene(src_html, tgt_html),
    }
    return pa.RecordBatch.from_arrays([*batch.columns, *derived.values()], schema=DERIVED_FILE_SCHEMA)


def write_derived(train_file: Path, out_file: Path, clean: CleanParams) -> None:
    """Stream the train split through derive_columns into `out_file`, in bounded memory."""
    with pq.ParquetWriter(out_file, DERIVED_FILE_SCHEMA) as writer, ThreadPoolExecutor(2) as pool:
        for batch in iter_pair_batches(train_file):
            writer.write_batch(derive_columns(batch.cast(PAIR_SCHEMA), clean, pool))


# --- the suites ------------------------------------------------------------------------------------------


def train_expectations(params: Params) -> list[Any]:
    import great_expectations as gx

    ex, clean, mostly = gx.expectations, params.clean, params.validate_.mostly
    critical, warning = {"critical": True}, {"critical": False}
    expectations = [
        ex.ExpectTableRowCountToBeBetween(min_value=params.validate_.min_rows, meta=critical),
        ex.ExpectColumnValuesToNotBeNull(column="src", meta=critical),
        ex.ExpectColumnValuesToNotBeNull(column="tgt", meta=critical),
    ]
    for side in ("src", "tgt"):
        expectations.append(
            ex.ExpectColumnValuesToBeBetween(
                column=f"{side}_chars",
                min_value=clean.min_chars,
                max_value=clean.max_chars,
                mostly=mostly,
                meta=critical,
            )
        )
    for side in ("src", "tgt"):
        expectations.append(
            ex.ExpectColumnValuesToBeBetween(column=f"{side}_words", max_value=clean.max_words, meta=critical)
        )
    expectations += [
        ex.ExpectColumnValuesToBeBetween(
            column="length_ratio", max_value=clean.max_length_ratio, mostly=mostly, meta=critical
        ),
        ex.ExpectColumnValuesToBeInSet(column="is_copy", value_set=[False], meta=critical),
        # Without deduplication in the clean stage duplicates are expected; they are still reported.
        ex.ExpectColumnValuesToBeUnique(column="pair_key", meta={"critical": clean.deduplicate}),
        ex.ExpectColumnValuesToBeInSet(column="has_control", value_set=[False], meta=critical),
        ex.ExpectColumnValuesToBeInSet(column="has_html", value_set=[False], meta=warning),
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


def run_checkpoint(params: Params, split_files: dict[str, Path], site_dir: Path, notes: dict[str, str]) -> list[Any]:
    """Validate every split in one checkpoint whose action writes the Data Docs to `site_dir`.

    Each split is a parquet asset of its own: a dataframe asset cannot be used, because a checkpoint passes the
    same batch parameters to every validation definition. `notes` (per split, markdown) are shown on the
    suite's page in the Data Docs. Returns the suite validation results in `split_files` order.
    """
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
    source = context.data_sources.add_pandas("clean")
    definitions = []
    for split, path in split_files.items():
        expectations = train_expectations(params) if split == "train" else heldout_expectations()
        suite = context.suites.add(gx.ExpectationSuite(name=split, expectations=expectations, notes=notes.get(split)))
        batch = source.add_parquet_asset(split, path=path).add_batch_definition_whole_dataframe(split)
        definitions.append(
            context.validation_definitions.add(gx.ValidationDefinition(name=split, data=batch, suite=suite))
        )
    checkpoint = context.checkpoints.add(
        gx.Checkpoint(
            name="validate",
            validation_definitions=definitions,
            actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=[SITE_NAME])],
            result_format={
                "result_format": "SUMMARY",
                "partial_unexpected_count": EXAMPLES_IN_METRICS,
                # Unexpected values are located by the corpus file and line they came from.
                "unexpected_index_column_names": ["origin", "line"],
                "include_unexpected_rows": True,
            },
        )
    )
    # GX fingerprints each batch below 1 GB by hashing every cell (~4 s per 1M pairs here) only to print the hash
    # in the Data Docs; DVC already hashes data/clean, so the stage skips it (and restores the setting after).
    threshold = pandas_execution_engine.HASH_THRESHOLD
    pandas_execution_engine.HASH_THRESHOLD = 0
    try:
        result = checkpoint.run(run_id=RunIdentifier(run_name="validate"))
    finally:
        pandas_execution_engine.HASH_THRESHOLD = threshold
    by_split = {r.suite_name: r for r in result.run_results.values()}
    return [by_split[split] for split in split_files]


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


def summarise(rows: int, suite_result: Any) -> dict[str, Any]:
    stats = suite_result.statistics
    critical, warnings = [], []
    for evr in suite_result.results:
        if evr.success:
            continue
        (critical if evr.expectation_config.meta.get("critical", True) else warnings).append(describe_failure(evr))
    return {
        "success": not critical,
        "rows": rows,
        "evaluated_expectations": int(stats["evaluated_expectations"]),
        "successful_expectations": int(stats["successful_expectations"]),
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


def _check_readable(path: Path) -> None:
    try:
        names = pq.read_schema(path).names
    except (pa.ArrowInvalid, OSError) as err:
        raise InputFileError(path, f"not a readable Parquet file ({err})") from None
    missing = [c for c in PAIR_SCHEMA.names if c not in names]
    if missing:
        raise InputFileError(path, f"missing column(s) {missing}; has {names}")


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
    # The train split with its derived columns lives only for this run, beside the report (not in /tmp, which
    # may be a small in-memory filesystem).
    with tempfile.TemporaryDirectory(prefix=".validate-", dir=report.parent) as work:
        derived = Path(work) / "train.parquet"
        write_derived(inputs["train"], derived, params.clean)
        with atomic_path(report) as site_dir:
            # The Data Docs show the derived file's (then deleted) path; the notes name the real source.
            columns = "\n".join(f"- `{name}`: {meaning}" for name, (_, meaning) in DERIVED_COLUMNS.items())
            notes = {"train": f"Data: `{inputs['train']}` with derived columns:\n\n{columns}"}
            results = run_checkpoint(params, {**inputs, "train": derived}, site_dir, notes)

    per_split = {split: summarise(rows[split], r) for split, r in zip(inputs, results, strict=True)}
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
