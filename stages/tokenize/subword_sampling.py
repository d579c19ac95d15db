"""Subword regularization (Kudo 2018) as extra training rows: `tokenize.sampled_copies` more encodings of every
training pair, each with a segmentation drawn from the unigram model, written after the one-best rows.

A model that sees one sentence cut into pieces in several ways learns what the pieces mean rather than one fixed
cut, which Kudo found to help most where the corpus is small. The draw is Kudo's l-best sampling: SentencePiece's
`sampling_nbest` most likely segmentations of a sentence, one picked with probability ∝ P(x) ** `sampling_alpha`,
where P(x) is the product of its pieces' unigram probabilities (a piece's score in the model is its
log-probability). Evaluation and translation keep the one best.

The pick is numpy's (Gumbel-max, from a generator seeded by `tokenize.seed`, the copy and the side), so the stage
writes the same arrays on every run, as a DVC stage must for the same inputs. SentencePiece's own sampler
(`enable_sampling`) is not repeatable across processes: the same `set_random_generator_seed` gave different
segmentations of the same sentences in two processes (sentencepiece 0.2).

The copies are fixed, not redrawn every epoch as Kudo (or Marian's --sentencepiece-alphas) do: the trainer reads
numpy arrays and needs no SentencePiece. The price is K more copies of the training arrays, and an epoch of the
trainer is a pass over all of them; it suits the small corpora subword regularization is for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.token_arrays import flatten

# (texts) -> each text's ids, its segmentation drawn from the n-best (no </s>, no tag: the caller frames them).
Segmenter = Callable[[list[str]], tuple[np.ndarray, np.ndarray]]


def piece_log_probabilities(sp: Any) -> np.ndarray:
    """Each id's score in a SentencePieceProcessor: its log-probability under the unigram model (0 for control,
    unknown and byte pieces)."""
    return np.array([sp.get_score(i) for i in range(sp.get_piece_size())], dtype=np.float64)


def draw(candidates: list[list[int]], log_probs: np.ndarray, alpha: float, rng: np.random.Generator) -> list[int]:
    """One of a sentence's n-best segmentations, with probability ∝ exp(alpha · log P(x)): the Gumbel-max trick
    (the argmax of alpha · log P(x) plus one Gumbel draw per candidate), log P(x) being the sum of its pieces'
    log-probabilities."""
    flat, lengths = flatten(candidates)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    scores = np.zeros(len(candidates))
    nonempty = lengths > 0
    scores[nonempty] = np.add.reduceat(log_probs[flat], starts[nonempty]) if len(flat) else 0.0
    return candidates[int(np.argmax(alpha * scores + rng.gumbel(size=len(candidates))))]


def nbest_segmenter(model_file: Path, nbest: int, alpha: float, seed: list[int]) -> Segmenter:
    """A Segmenter drawing from `model_file`'s n-best; `seed` seeds its generator (one stream per copy and side,
    consumed in row order)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    log_probs = piece_log_probabilities(sp)
    rng = np.random.default_rng(seed)

    def segment(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        nbests = sp.nbest_encode(texts, nbest_size=nbest)  # one thread: sentencepiece's n-best takes no thread count
        return flatten([draw(candidates, log_probs, alpha, rng) for candidates in nbests])

    return segment
