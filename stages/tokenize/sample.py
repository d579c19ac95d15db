"""The tokenize stage's view of rows by language: each row's direction, and the language-balanced sample a joint
SentencePiece model over several languages is trained on.

Trained on the raw stream, a joint model would spend its vocabulary on the biggest language, and on English
most of all where a multi-way corpus repeats it once per direction. So, as XLM and mBART do, the sample is drawn
per language. Language L's sentences are the source side of the rows whose src_lang is L and the target side of
those whose tgt_lang is L, each distinct sentence counted once (n_L of them). L gets the share
p_L ∝ (n_L / N) ** (1 / T) (`tokenize.temperature`) of a sample of min(`tokenize.input_sentence_size`, N)
sentences, N = Σ n_L. A language whose share is within its sentences is drawn without replacement; one whose share
exceeds them has every sentence k times and the remainder drawn once more, so repeats are spread evenly (the
only replacement there is). The draw is seeded (`tokenize.seed`).

Two passes over the training file keep memory to 16 bytes a sentence: the first keeps a 64-bit hash and a
position (row, side) of each sentence, not its text; the second yields the drawn sentences in file order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline.corpus import direction_column, iter_pair_batches
from pipeline.runtime.errors import InputFileError
from pipeline.runtime.languages import Directions, temperature_shares

SIDES = ("src", "tgt")
DIRECTION_COLUMNS = ["src_lang", "tgt_lang"]


def row_directions(batch, names: list[str], path: Path, first_row: int) -> np.ndarray:
    """Each row's index into `names` (uint8). A row of a direction not in `names` is an InputFileError naming the
    file, the row (counted from 0 over the whole file) and its direction."""
    import pyarrow as pa
    import pyarrow.compute as pc

    joined = direction_column(batch)
    index = pc.index_in(joined, value_set=pa.array(names, pa.string()))
    if index.null_count:
        row = int(np.flatnonzero(index.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputFileError(path, f"row {first_row + row} is a {joined[row].as_py()!r} pair, not one of "
                                   f"data.directions {names} (clean it again for these directions)")
    return index.to_numpy(zero_copy_only=False).astype(np.uint8)


def language_quotas(sizes: dict[str, int], total: int, temperature: float) -> dict[str, int]:
    """Sentences to draw per language: temperature shares of `total`, rounded by largest remainder so they add
    up to `total` exactly (ties go to the language listed first)."""
    shares = temperature_shares(sizes, temperature)
    exact = {lang: shares[lang] * total for lang in sizes}
    quotas = {lang: int(q) for lang, q in exact.items()}
    # Largest fraction first (a stable sort: listed order on ties); an empty language never gets a sentence.
    by_remainder = sorted((lang for lang in sizes if sizes[lang]), key=lambda lang: quotas[lang] - exact[lang])
    for lang in by_remainder[: total - sum(quotas.values())]:
        quotas[lang] += 1
    return quotas


def draw_times(sentences: int, quota: int, rng: np.random.Generator) -> np.ndarray:
    """How often each of `sentences` sentences is drawn for a quota: every one quota // sentences times, and
    quota % sentences of them, chosen without replacement, once more."""
    repeats, rest = divmod(quota, sentences)
    times = np.full(sentences, repeats, dtype=np.int64)
    times[rng.choice(sentences, size=rest, replace=False)] += 1
    return times


def _sentence_positions(train_file: Path, directions: Directions) -> dict[str, np.ndarray]:
    """Each language's distinct non-empty sentences, as sorted positions 2 * row + side (side 0 src, 1 tgt)."""
    import pyarrow.compute as pc
    from pandas.util import hash_array  # vectorised, and the same hash in every process (str hashes are salted)

    languages = directions.languages
    language_of = {side: np.array([languages.index(getattr(d, side)) for d in directions.directions])
                   for side in SIDES}
    hashes: dict[str, list[np.ndarray]] = {lang: [] for lang in languages}
    positions: dict[str, list[np.ndarray]] = {lang: [] for lang in languages}
    first_row = 0
    for batch in iter_pair_batches(train_file, [*SIDES, *DIRECTION_COLUMNS]):
        row_language = {side: language_of[side][row_directions(batch, directions.names, train_file, first_row)]
                        for side in SIDES}
        for side_number, side in enumerate(SIDES):
            column = batch.column(side)
            nonempty = pc.fill_null(pc.greater(pc.utf8_length(column), 0), False).to_numpy(zero_copy_only=False)
            # categorize=False: most sentences are distinct, so factorizing them first costs more than it saves.
            side_hashes = hash_array(column.to_numpy(zero_copy_only=False), categorize=False)
            for number, lang in enumerate(languages):
                rows = np.flatnonzero((row_language[side] == number) & nonempty)
                if len(rows):
                    hashes[lang].append(side_hashes[rows])
                    positions[lang].append((first_row + rows) * 2 + side_number)
        first_row += len(batch)
    distinct = {}
    for lang in languages:
        if not hashes[lang]:
            distinct[lang] = np.zeros(0, dtype=np.int64)
            continue
        _, first = np.unique(np.concatenate(hashes[lang]), return_index=True)
        distinct[lang] = np.sort(np.concatenate(positions[lang])[first])
    return distinct


def _sentences_at(train_file: Path, positions: np.ndarray, times: np.ndarray) -> Iterator[str]:
    """The sentences at sorted `positions` (2 * row + side), each `times` over, in file order."""
    start = first_row = 0
    for batch in iter_pair_batches(train_file, list(SIDES)):
        end = int(np.searchsorted(positions, 2 * (first_row + len(batch))))
        local = positions[start:end] - 2 * first_row
        for side_number, side in enumerate(SIDES):
            on_side = local % 2 == side_number
            texts = batch.column(side).take(local[on_side] // 2).to_pylist()
            for text, n in zip(texts, times[start:end][on_side].tolist(), strict=True):
                yield from itertools.repeat(text, n)
        start, first_row = end, first_row + len(batch)


def balanced_sample(
    train_file: Path, directions: Directions, size_limit: int, temperature: float, seed: int
) -> tuple[Iterator[str], dict[str, dict[str, float]]]:
    """The language-balanced training sample (see the module docstring): the sentences (lazily, second pass) and,
    per language, its distinct sentences, its share and the sentences drawn."""
    positions = _sentence_positions(train_file, directions)
    sizes = {lang: len(p) for lang, p in positions.items()}
    if not sum(sizes.values()):
        raise InputFileError(train_file, "no non-empty sentence to train SentencePiece on")
    total = min(size_limit, sum(sizes.values()))
    quotas = language_quotas(sizes, total, temperature)
    shares = temperature_shares(sizes, temperature)
    rng = np.random.default_rng(seed)
    drawn_positions, drawn_times = [], []
    for lang, quota in quotas.items():
        if quota:
            times = draw_times(sizes[lang], quota, rng)
            drawn_positions.append(positions[lang][times > 0])
            drawn_times.append(times[times > 0])
    all_positions = np.concatenate(drawn_positions)
    order = np.argsort(all_positions, kind="stable")
    summary = {lang: {"sentences": sizes[lang], "share": round(shares[lang], 4), "drawn": quotas[lang]}
               for lang in sizes}
    return _sentences_at(train_file, all_positions[order], np.concatenate(drawn_times)[order]), summary
