"""One direction's results in a split as one summary, its training chunks merged into it.

Every chunk of a direction's training rows is checked by the same expectations in the same order (suite.py), so
the i-th result of each chunk is the same expectation: it succeeds on the direction when it succeeds on every
chunk, and its failures are summed into one. The row count is the exception: each chunk checks its share of
validate.min_rows, and the merged failure reports the direction's rows against validate.min_rows itself.
(report.py then adds the directions of a split together.)
"""

from __future__ import annotations

from typing import Any

from stages.validate.report import EXAMPLES_IN_METRICS, describe_failure


def merge_failures(failures: list[dict[str, Any]], rows: int, min_rows: int | None) -> dict[str, Any]:
    """One expectation's failures in several chunks as one: counts summed, the first examples kept; the row count
    is the direction's, against `min_rows` when given (validate.min_rows for the chunked training split)."""
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
    for failure in failures:
        merged["examples"] = (merged["examples"] + failure.get("examples", []))[:EXAMPLES_IN_METRICS]
        merged["rows"] = (merged["rows"] + failure.get("rows", []))[:EXAMPLES_IN_METRICS]
    errors = [f["error"] for f in failures if f.get("error")]
    if errors:
        merged["error"] = errors[0]
    return {k: v for k, v in merged.items() if v is not None}


def summarise(rows: int, suite_results: list[Any], min_rows: int | None = None) -> dict[str, Any]:
    """One direction's results in a split (GX suite validation results, one per chunk); rows validated in chunks
    summarised as one: an expectation succeeds when it succeeds on every chunk."""
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
