"""What the stage reports: each failed expectation as `metrics/validation.json` holds it and as the error shows
it, the stage's metrics over all splits and per direction, and the outcome (log lines per direction, warnings,
`ValidationFailed` naming each failing direction).

The metrics file and the Data Docs are written before a failed critical expectation raises, so the report is
there to inspect.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from pipeline.errors import ValidationFailed

log = logging.getLogger("mtpipe.validate")

EXAMPLES_IN_METRICS = 5
EXAMPLES_IN_ERROR = 3
# Columns of an example row (the derived train file has no text: it is looked up by origin and line afterwards).
ROW_COLUMNS = ("origin", "line", "src", "tgt")


def json_safe(value: Any) -> Any:
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
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
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
    return [json_safe(r) for r in rows[keep].head(EXAMPLES_IN_METRICS).to_dict(orient="records")]


def _exception_message(info: dict[str, Any] | None) -> str | None:
    if not info:
        return None
    if "raised_exception" not in info:  # keyed by metric: {metric_id: {raised_exception, ...}}
        infos = [v for v in info.values() if isinstance(v, dict)]
        info = next((v for v in infos if v.get("raised_exception")), {})
    return info.get("exception_message") if info.get("raised_exception") else None


def describe_failure(expectation_result: Any) -> dict[str, Any]:
    """One failed expectation (a GX ExpectationValidationResult) as the metrics JSON reports it."""
    config, result = expectation_result.expectation_config, expectation_result.result or {}
    kwargs = {k: json_safe(v) for k, v in config.kwargs.items() if k not in ("batch_id", "column") and v is not None}
    failure = {
        "expectation": config.type,
        "column": config.kwargs.get("column"),
        "kwargs": kwargs,
        "unexpected_count": json_safe(result.get("unexpected_count")),
        "unexpected_percent": json_safe(result.get("unexpected_percent")),
        "observed_value": json_safe(result.get("observed_value")),
        "examples": json_safe(list(result.get("partial_unexpected_list") or [])[:EXAMPLES_IN_METRICS]),
        "rows": _example_rows(result),
    }
    error = _exception_message(expectation_result.exception_info)
    if error:
        failure["error"] = error
    return {k: v for k, v in failure.items() if v is not None}


def _short(text: Any, width: int = 60) -> str:
    if not isinstance(text, str):
        return repr(text)
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def expectation_label(failure: dict[str, Any]) -> str:
    """`type on column` (or the type alone, for a table expectation)."""
    return failure["expectation"] + (f" on {failure['column']}" if failure.get("column") else "")


def format_failure(split: str, failure: dict[str, Any]) -> str:
    """`split direction: type on column: N unexpected (P%) [kwargs]`, then up to 3 example rows as
    `origin:line src= tgt=`."""
    if failure.get("unexpected_count") is not None:
        percent = failure.get("unexpected_percent")
        what = f"{failure['unexpected_count']} unexpected" + (f" ({percent:.2f}%)" if percent is not None else "")
    else:
        what = f"observed {failure.get('observed_value')!r}"
    expected = ", ".join(f"{k}={v!r}" for k, v in failure["kwargs"].items())
    where = f"{split} {failure['direction']}" if failure.get("direction") else split
    line = f"  {where}: {expectation_label(failure)}: {what}" + (f" [{expected}]" if expected else "")
    if failure.get("error"):
        line += f"; error: {failure['error']}"
    for row in failure["rows"][:EXAMPLES_IN_ERROR]:
        line += (
            f"\n      {row.get('origin')}:{row.get('line')} src={_short(row.get('src'))} tgt={_short(row.get('tgt'))}"
        )
    if not failure["rows"] and failure.get("examples"):
        line += f"\n      e.g. {', '.join(_short(v) for v in failure['examples'][:EXAMPLES_IN_ERROR])}"
    return line


def _failures(per_split: dict[str, dict[str, Any]], kind: str) -> list[tuple[str, dict[str, Any]]]:
    """(split, failure) of every failure of `kind` ("failed_critical" or "failed_non_critical")."""
    return [(split, failure) for split, summary in per_split.items() for failure in summary[kind]]


def _total(summaries: list[dict[str, Any]], key: str) -> int:
    return sum(summary[key] for summary in summaries)


def split_summary(groups: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A split's direction groups (direction -> merge.summarise's summary) as one summary of the split: the
    totals, each failure tagged with its direction, and the rows of each direction."""

    def tagged(kind: str) -> list[dict[str, Any]]:
        return [{"direction": direction, **f} for direction, summary in groups.items() for f in summary[kind]]

    summaries = list(groups.values())
    summary = {
        "success": all(s["success"] for s in summaries),
        "rows": _total(summaries, "rows"),
        "rows_per_direction": {direction: s["rows"] for direction, s in groups.items()},
        "evaluated_expectations": _total(summaries, "evaluated_expectations"),
        "successful_expectations": _total(summaries, "successful_expectations"),
        "failed_critical": tagged("failed_critical"),
        "failed_non_critical": tagged("failed_non_critical"),
    }
    if all("language_sample_rows" in s for s in summaries):
        summary["language_sample_rows"] = _total(summaries, "language_sample_rows")
    return summary


def direction_summary(direction: str, per_group: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """One direction's results over the splits that hold it: its rows, and each failed expectation named as
    `split: type on column` (the details are under "splits" in the metrics)."""
    groups = {split: groups[direction] for split, groups in per_group.items() if direction in groups}
    summaries = list(groups.values())

    def named(kind: str) -> list[str]:
        return [f"{split}: {expectation_label(f)}" for split, summary in groups.items() for f in summary[kind]]

    summary = {
        "success": all(s["success"] for s in summaries),
        "rows": _total(summaries, "rows"),
        "rows_per_split": {split: s["rows"] for split, s in groups.items()},
        "evaluated_expectations": _total(summaries, "evaluated_expectations"),
        "failed_critical": named("failed_critical"),
        "failed_non_critical": named("failed_non_critical"),
    }
    if "language_sample_rows" in groups.get("train", {}):
        summary["language_sample_rows"] = groups["train"]["language_sample_rows"]
    return summary


def stage_metrics(per_group: dict[str, dict[str, dict[str, Any]]], directions: list[str]) -> dict[str, Any]:
    """`metrics/validation.json` from the summary of each split's direction groups (split -> direction ->
    summary): the totals over all splits, each direction's results (in `directions` order), then each split's
    summary."""
    per_split = {split: split_summary(groups) for split, groups in per_group.items()}
    failed = _failures(per_split, "failed_critical")
    return {
        "success": not failed,
        "rows": sum(summary["rows"] for summary in per_split.values()),
        "evaluated_expectations": sum(summary["evaluated_expectations"] for summary in per_split.values()),
        "failed_critical": len(failed),
        "failed_non_critical": len(_failures(per_split, "failed_non_critical")),
        "directions": {direction: direction_summary(direction, per_group) for direction in directions},
        "splits": per_split,
    }


def report_outcome(metrics: dict[str, Any], seconds: float, data_docs: Path, metrics_file: Path) -> None:
    """Log what was validated, each direction's result and each warning; raise ValidationFailed naming every
    failing direction and listing every critical failure."""
    per_split, per_direction = metrics["splits"], metrics["directions"]
    failed, warned = _failures(per_split, "failed_critical"), _failures(per_split, "failed_non_critical")
    log.info(
        "validated %d rows of %d direction(s) in %d split(s) against %d expectations in %.1fs: "
        "%d critical failure(s), %d warning(s)",
        metrics["rows"],
        len(per_direction),
        len(per_split),
        metrics["evaluated_expectations"],
        seconds,
        len(failed),
        len(warned),
    )
    for direction, summary in per_direction.items():
        log.info(
            "  %s: %s, %d rows (%s), %d critical failure(s), %d warning(s)",
            direction,
            "passed" if summary["success"] else "FAILED",
            summary["rows"],
            ", ".join(f"{split} {rows}" for split, rows in summary["rows_per_split"].items()),
            len(summary["failed_critical"]),
            len(summary["failed_non_critical"]),
        )
    for split, failure in warned:
        log.warning("non-critical expectation failed (see %s):\n%s", data_docs, format_failure(split, failure))
    if failed:
        failing = [d for d, summary in per_direction.items() if not summary["success"]]
        lines = "\n".join(format_failure(split, failure) for split, failure in failed)
        raise ValidationFailed(
            f"{len(failed)} critical expectation(s) failed, in direction(s) {', '.join(failing)}; Data Docs in "
            f"{data_docs}, details in {metrics_file}:\n{lines}"
        )
