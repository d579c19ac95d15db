"""Great Expectations at run time: an ephemeral context, a data source and checkpoint per batch, one Data Docs site.

Nothing GX writes lands outside the Data Docs site (in-memory stores, no default docs site, no analytics), and
the site's configuration is `data_docs_site` below, the one place that says how the HTML is written (and
offline_docs.py what is changed in it afterwards so that it loads nothing from another host). What GX
changes in the process while it runs (its logger's level, the pandas engine's fingerprint threshold) is set for
the run only and restored after it, by the context managers below. GX is imported inside the functions: importing
it takes seconds, and importing this package must not.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.logger_levels import logger_levels
from stages.validate.offline_docs import make_data_docs_offline
from stages.validate.report import EXAMPLES_IN_METRICS

SITE_NAME = "validation"
SOURCE_NAME = "clean"  # the Data Docs name each page <data source>-<asset>: clean-train-en-de.html
# GX logs at INFO while it imports and validates; only its warnings are worth a user's attention.
GX_LOGGERS = ("great_expectations",)
RESULT_FORMAT = {
    "result_format": "SUMMARY",
    "partial_unexpected_count": EXAMPLES_IN_METRICS,
    # Unexpected values are located by the corpus file and line they came from.
    "unexpected_index_column_names": ["origin", "line"],
    "include_unexpected_rows": True,
}


def quiet_gx() -> Any:
    """great_expectations, imported with its loggers at WARNING: its import logs a line at INFO for every API
    function it registers (two hundred lines in the stage's log before any work)."""
    with logger_levels(GX_LOGGERS, logging.WARNING):
        import great_expectations as gx
    return gx


@dataclass(frozen=True)
class GxBatch:
    """What one validation definition checks: a Parquet file against a suite; `notes` (markdown) are shown on
    the suite's page in the Data Docs."""

    name: str
    path: Path
    expectations: list[Any]
    notes: str | None = None


@contextmanager
def batch_fingerprints_skipped() -> Iterator[None]:
    """GX fingerprints each batch below 1 GB by hashing every cell only to print the hash in the Data Docs; DVC
    already hashes data/clean, so the stage skips it inside the block (a module setting, restored after)."""
    from great_expectations.execution_engine import pandas_execution_engine

    threshold = pandas_execution_engine.HASH_THRESHOLD
    pandas_execution_engine.HASH_THRESHOLD = 0
    try:
        yield
    finally:
        pandas_execution_engine.HASH_THRESHOLD = threshold


def data_docs_site(site_dir: Path) -> dict[str, Any]:
    """The Data Docs site the checkpoints add their pages to: HTML files under `site_dir`."""
    return {
        "class_name": "SiteBuilder",
        "show_how_to_buttons": False,
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(site_dir.resolve())},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    }


def ephemeral_context(site_dir: Path) -> Any:
    """A GX context that keeps its stores in memory and writes only the Data Docs site in `site_dir`."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        # No default (temporary-directory) docs site: the only files written are ours.
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
        data_docs_sites={SITE_NAME: data_docs_site(site_dir)},
    )
    return gx.get_context(mode="ephemeral", project_config=config)


def validate_batch(context: Any, batch: GxBatch) -> Any:
    """Check one batch with a checkpoint of its own, whose action adds its page to the Data Docs; returns the
    suite validation result.

    The data source is deleted after it ran: a data source's execution engine keeps every batch it loaded for as
    long as the data source lives, which made memory grow with the chunks.
    """
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    source = context.data_sources.add_pandas(SOURCE_NAME)
    suite = context.suites.add(gx.ExpectationSuite(name=batch.name, expectations=batch.expectations, notes=batch.notes))
    data = source.add_parquet_asset(batch.name, path=batch.path).add_batch_definition_whole_dataframe(batch.name)
    definition = context.validation_definitions.add(gx.ValidationDefinition(name=batch.name, data=data, suite=suite))
    checkpoint = context.checkpoints.add(
        gx.Checkpoint(
            name=batch.name,
            validation_definitions=[definition],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=[SITE_NAME])],
            result_format=RESULT_FORMAT,
        )
    )
    (result,) = checkpoint.run(run_id=RunIdentifier(run_name="validate")).run_results.values()
    context.data_sources.delete(SOURCE_NAME)
    return result


def run_checkpoints(batches: list[GxBatch], site_dir: Path) -> list[Any]:
    """Validate each batch (a Parquet asset of its own), one at a time, with its page added to the Data Docs in
    `site_dir`, then make the site work offline (offline_docs.py). Returns the suite validation results in
    `batches` order."""
    with logger_levels(GX_LOGGERS, logging.WARNING), batch_fingerprints_skipped():
        context = ephemeral_context(site_dir)
        results = [validate_batch(context, batch) for batch in batches]
    make_data_docs_offline(site_dir)
    return results
