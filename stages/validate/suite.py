"""The expectation suites, built from params: the clean stage's thresholds (`params.clean`) are the bounds.

Each expectation carries `meta={"critical": bool}`: a failed critical one fails the stage, a failed non-critical
one is reported as a warning. The training split is checked through its measures (measures.py), one suite per
chunk (chunks.py); the held-out splits are checked as they are. Great Expectations is imported inside the
functions: importing it takes seconds, and importing this package must not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.params import Params
from pipeline.text_checks import SCRIPTS
from stages.validate.chunks import Chunk
from stages.validate.gx_runtime import GxBatch
from stages.validate.measures import DERIVED_COLUMNS

CRITICAL = {"critical": True}
WARNING = {"critical": False}


def _sides(params: Params) -> tuple[tuple[str, str], tuple[str, str]]:
    """(column prefix, language) of each side of a pair."""
    return ("src", params.data.src_lang), ("tgt", params.data.tgt_lang)


def train_expectations(params: Params, min_rows: int) -> list[Any]:
    """The suite of a chunk of the training split's derived columns; `min_rows` is what its row count is checked
    against (the chunk's share of validate.min_rows, see train_chunk_batch)."""
    import great_expectations as gx

    expect, clean, mostly = gx.expectations, params.clean, params.validate_.mostly
    sides = _sides(params)
    expectations = [expect.ExpectTableRowCountToBeBetween(min_value=min_rows, meta=CRITICAL)]
    # Not null: the length of a null side is null.
    expectations += [expect.ExpectColumnValuesToNotBeNull(column=f"{side}_chars", meta=CRITICAL) for side, _ in sides]
    bounds = {"chars": (clean.min_chars, clean.max_chars), "words": (clean.min_words, clean.max_words)}
    expectations += [
        expect.ExpectColumnValuesToBeBetween(
            column=f"{side}_{unit}", min_value=low, max_value=high, mostly=mostly, meta=CRITICAL
        )
        for unit, (low, high) in bounds.items()
        for side, _ in sides
    ]
    expectations += [
        expect.ExpectColumnValuesToBeBetween(
            column="length_ratio", max_value=clean.max_length_ratio, mostly=mostly, meta=CRITICAL
        ),
        # With clean.reject_copies off, copies are expected; they are still reported.
        expect.ExpectColumnValuesToBeInSet(column="is_copy", value_set=[False], meta={"critical": clean.reject_copies}),
        # Without deduplication in the clean stage duplicates are expected; they are still reported.
        expect.ExpectColumnValuesToBeInSet(
            column="is_duplicate", value_set=[False], meta={"critical": clean.deduplicate}
        ),
        expect.ExpectColumnValuesToBeInSet(column="has_control", value_set=[False], meta=CRITICAL),
        expect.ExpectColumnValuesToBeInSet(column="has_html", value_set=[False], meta=WARNING),
    ]
    if clean.min_letter_share > 0:
        expectations += [
            expect.ExpectColumnValuesToBeBetween(
                column=f"{side}_letter_share", min_value=clean.min_letter_share, mostly=mostly, meta=CRITICAL
            )
            for side, _ in sides
        ]
    if clean.min_script_share > 0:
        expectations += [
            expect.ExpectColumnValuesToBeBetween(
                column=f"{side}_script_share", min_value=clean.min_script_share, mostly=mostly, meta=CRITICAL
            )
            for side, lang in sides
            if lang in SCRIPTS
        ]
    if params.validate_.language_sample > 0:
        # Nulls (rows outside the sample, sides too short to judge) are not counted: `mostly` is a share of the
        # sampled sides.
        expectations += [
            expect.ExpectColumnValuesToBeInSet(
                column=f"{side}_lang", value_set=[lang], mostly=params.validate_.min_language_match, meta=CRITICAL
            )
            for side, lang in sides
        ]
    return expectations


def heldout_expectations() -> list[Any]:
    """Valid and test splits are normalised but never filtered: they only have to be present and complete."""
    import great_expectations as gx

    expect = gx.expectations
    return [
        expect.ExpectTableRowCountToBeBetween(min_value=1, meta=CRITICAL),
        expect.ExpectColumnValuesToNotBeNull(column="src", meta=CRITICAL),
        expect.ExpectColumnValuesToNotBeNull(column="tgt", meta=CRITICAL),
    ]


def train_chunk_batch(params: Params, chunk: Chunk, rows: int, source: Path, language_sample_rows: int) -> GxBatch:
    """A chunk of the training split (of `rows` rows, read from `source`) as GX checks it. The row count of the
    last chunk is checked against the rows the earlier ones leave to reach validate.min_rows (1 for the others),
    so the split as a whole is checked."""
    is_last = chunk.first_row + chunk.rows == rows
    min_rows = max(params.validate_.min_rows - chunk.first_row, 1) if is_last else 1
    # The Data Docs show the derived file's (then deleted) path; the notes name the real source.
    part = (
        "every row"
        if chunk.rows == rows
        else f"rows {chunk.first_row + 1:,} to {chunk.first_row + chunk.rows:,} of {rows:,}"
    )
    columns = "\n".join(f"- `{name}`: {meaning}" for name, (_, meaning) in DERIVED_COLUMNS.items())
    notes = (
        f"Data: {part} of `{source}`, as the measures below (no text); the language columns on a seeded sample of "
        f"{language_sample_rows} rows of the split (validate.language_sample, validate.seed). The row "
        f"count expectation asks for the rows this chunk adds towards validate.min_rows = "
        f"{params.validate_.min_rows}.\n\n{columns}"
    )
    return GxBatch(chunk.name, chunk.path, train_expectations(params, min_rows), notes)
