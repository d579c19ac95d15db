"""The expectation suites, built from params: the clean stage's thresholds (`params.clean`) are the bounds.

Each expectation carries `meta={"critical": bool}`: a failed critical one fails the stage, a failed non-critical
one is reported as a warning. Every suite is of one direction's rows (directions.py) and checks them against that
direction's languages (their scripts, the language detected), and that the row's direction is one data.directions
lists; the rows of a direction it does not list are checked for that alone, which fails. The training split is
checked through its measures (measures.py), one suite per chunk (chunks.py); the held-out splits are checked as
they are (heldout.py). Great Expectations is imported inside the functions: importing it takes seconds, and
importing this package must not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.params import Params
from pipeline.runtime.languages import SCRIPTS, Direction
from stages.validate.chunks import Chunk, DirectionChunks
from stages.validate.directions import group_name, is_listed
from stages.validate.gx_runtime import GxBatch, quiet_gx
from stages.validate.measures import DERIVED_COLUMNS

CRITICAL = {"critical": True}
WARNING = {"critical": False}


Sides = tuple[tuple[str, str], tuple[str, str]]  # (column prefix, language) of the source, then the target


def _sides(direction: Direction) -> Sides:
    """(column prefix, language) of each side of a pair."""
    return ("src", direction.src), ("tgt", direction.tgt)


def direction_expectation(params: Params) -> Any:
    """Every row's languages name a direction of data.directions."""
    gx = quiet_gx()

    return gx.expectations.ExpectColumnValuesToBeInSet(
        column="direction", value_set=params.data.directions.names, meta=CRITICAL
    )


def unlisted_note(params: Params, direction: Direction) -> str:
    return (
        f"data.directions ({', '.join(params.data.directions.names)}) does not list {direction}: its rows are checked "
        "only for their direction, which fails."
    )


def train_expectations(params: Params, direction: Direction, min_rows: int) -> list[Any]:
    """The suite of a chunk of one direction's derived columns of the training split; `min_rows` is what its row
    count is checked against (the chunk's share of validate.min_rows, see train_chunk_batch)."""
    gx = quiet_gx()

    if not is_listed(params, direction):
        return [direction_expectation(params)]
    expect, sides = gx.expectations, _sides(direction)
    return [
        expect.ExpectTableRowCountToBeBetween(min_value=min_rows, meta=CRITICAL),
        direction_expectation(params),
        *_length_expectations(expect, params, sides),
        *_flag_expectations(expect, params),
        *_share_expectations(expect, params, sides),
    ]


def _length_expectations(expect: Any, params: Params, sides: Sides) -> list[Any]:
    """Each side's characters and words within clean's bounds, and the length ratio within its maximum."""
    clean, mostly = params.clean, params.validate_.mostly
    # Not null: the length of a null side is null.
    expectations = [expect.ExpectColumnValuesToNotBeNull(column=f"{side}_chars", meta=CRITICAL) for side, _ in sides]
    bounds = {"chars": (clean.min_chars, clean.max_chars), "words": (clean.min_words, clean.max_words)}
    expectations += [
        expect.ExpectColumnValuesToBeBetween(
            column=f"{side}_{unit}", min_value=low, max_value=high, mostly=mostly, meta=CRITICAL
        )
        for unit, (low, high) in bounds.items()
        for side, _ in sides
    ]
    expectations.append(expect.ExpectColumnValuesToBeBetween(
        column="length_ratio", max_value=clean.max_length_ratio, mostly=mostly, meta=CRITICAL
    ))
    return expectations


def _flag_expectations(expect: Any, params: Params) -> list[Any]:
    """No row flagged as a copy, a duplicate, with control characters or with markup."""
    clean = params.clean
    return [
        # With clean.reject_copies off, copies are expected; they are still reported.
        expect.ExpectColumnValuesToBeInSet(column="is_copy", value_set=[False], meta={"critical": clean.reject_copies}),
        # Without deduplication in the clean stage duplicates are expected; they are still reported.
        expect.ExpectColumnValuesToBeInSet(
            column="is_duplicate", value_set=[False], meta={"critical": clean.deduplicate}
        ),
        expect.ExpectColumnValuesToBeInSet(column="has_control", value_set=[False], meta=CRITICAL),
        expect.ExpectColumnValuesToBeInSet(column="has_html", value_set=[False], meta=WARNING),
    ]


def _share_expectations(expect: Any, params: Params, sides: Sides) -> list[Any]:
    """Letter and script shares above clean's minimums, and the sampled sides in their language, where switched on."""
    clean, mostly = params.clean, params.validate_.mostly
    expectations = []
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


def heldout_expectations(params: Params, direction: Direction) -> list[Any]:
    """Valid and test splits are normalised but never filtered: each direction's rows only have to be present and
    complete."""
    gx = quiet_gx()

    if not is_listed(params, direction):
        return [direction_expectation(params)]
    expect = gx.expectations
    return [
        expect.ExpectTableRowCountToBeBetween(min_value=1, meta=CRITICAL),
        direction_expectation(params),
        expect.ExpectColumnValuesToNotBeNull(column="src", meta=CRITICAL),
        expect.ExpectColumnValuesToNotBeNull(column="tgt", meta=CRITICAL),
    ]


def heldout_batch(params: Params, split: str, direction: Direction, path: Path, source: Path) -> GxBatch:
    """One direction's rows of a held-out split (written to `path` from `source`) as GX checks them."""
    notes = f"Data: the {direction} rows of `{source}` (their languages say src_lang-tgt_lang = {direction})."
    if not is_listed(params, direction):
        notes += f" {unlisted_note(params, direction)}"
    return GxBatch(group_name(split, direction), path, heldout_expectations(params, direction), notes)


def train_chunk_batch(params: Params, group: DirectionChunks, chunk: Chunk, source: Path) -> GxBatch:
    """A chunk of one direction's rows of the training split (read from `source`) as GX checks it. The row count
    of the direction's last chunk is checked against the rows its earlier ones leave to reach validate.min_rows (1
    for the others), so the direction as a whole is checked."""
    rows = group.rows
    is_last = chunk.first_row + chunk.rows == rows
    min_rows = max(params.validate_.min_rows - chunk.first_row, 1) if is_last else 1
    # The Data Docs show the derived file's (then deleted) path; the notes name the real source.
    part = (
        f"every {group.direction} row"
        if chunk.rows == rows
        else f"{group.direction} rows {chunk.first_row + 1:,} to {chunk.first_row + chunk.rows:,} of {rows:,}"
    )
    columns = "\n".join(f"- `{name}`: {meaning}" for name, (_, meaning) in DERIVED_COLUMNS.items())
    notes = (
        f"Data: {part} of `{source}` (rows whose languages say src_lang-tgt_lang = {group.direction}), as the "
        f"measures below (no text); the language columns on a seeded sample of {group.language_sample_rows} of "
        f"the direction's rows (validate.language_sample, validate.seed). The row count expectation asks for the "
        f"rows this chunk adds towards validate.min_rows = {params.validate_.min_rows} for the direction."
        f"\n\n{columns}"
    )
    if not is_listed(params, group.direction):
        notes = f"Data: {part} of `{source}`. {unlisted_note(params, group.direction)}"
    return GxBatch(chunk.name, chunk.path, train_expectations(params, group.direction, min_rows), notes)
