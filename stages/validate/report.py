"""What the stage reports: each failed expectation as `metrics/validation.json` holds it and as the error shows
it, the stage's metrics over all splits, and the outcome (a log line, warnings, `ValidationFailed`).

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


def _failures(per_split: dict[str, dict[str, Any]], kind: str) -> list[tuple[str, dict[str, Any]]]:
    """(split, failure) of every failure of `kind` ("failed_critical" or "failed_non_critical")."""
    return [(split, failure) for split, summary in per_split.items() for failure in summary[kind]]


def stage_metrics(per_split: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`metrics/validation.json`: the totals over all splits, then each split's summary."""
    failed = _failures(per_split, "failed_critical")
    return {
        "success": not failed,
        "rows": sum(summary["rows"] for summary in per_split.values()),
        "evaluated_expectations": sum(summary["evaluated_expectations"] for summary in per_split.values()),
        "failed_critical": len(failed),
        "failed_non_critical": len(_failures(per_split, "failed_non_critical")),
        "splits": per_split,
    }


def report_outcome(metrics: dict[str, Any], seconds: float, data_docs: Path, metrics_file: Path) -> None:
    """Log what was validated and each warning; raise ValidationFailed listing every critical failure."""
    per_split = metrics["splits"]
    failed, warned = _failures(per_split, "failed_critical"), _failures(per_split, "failed_non_critical")
    log.info(
        "validated %d rows in %d split(s) against %d expectations in %.1fs: %d critical failure(s), %d warning(s)",
        metrics["rows"],
        len(per_split),
        metrics["evaluated_expectations"],
        seconds,
        len(failed),
        len(warned),
    )
    for split, failure in warned:
        log.warning("non-critical expectation failed (see %s):\n%s", data_docs, format_failure(split, failure))
    if failed:
        lines = "\n".join(format_failure(split, failure) for split, failure in failed)
        raise ValidationFailed(
            f"{len(failed)} critical expectation(s) failed; Data Docs in {data_docs}, "
            f"details in {metrics_file}:\n{lines}"
        )
