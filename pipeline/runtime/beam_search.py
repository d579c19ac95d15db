"""Beam search (beam 1: greedy) over a KV-cached encoder-decoder called with numpy arrays (pipeline.runtime.translate's
OnnxSeq2Seq, or any object with its `encode`, `empty_cache` and `decode`).

Search follows transformers' `generate` given the prefix as `decoder_input_ids`, so ONNX and PyTorch decode the
same way: decoding starts from the direction's decoder prefix (pipeline.runtime.model_languages: Marian's <pad>;
mBART-50, M2M-100 and NLLB's </s> and the target's code; mBART's target code), whose tokens the first decoder call feeds
together into an empty cache; a hypothesis is what follows the prefix, and its length (for the limit and the
length penalty) counts only those tokens, as transformers counts only tokens after the decoder prompt. <pad> is
never emitted, </s> is forced at the length limit (scored log p = 0, as transformers' forced-EOS
processor does), and beam search keeps the 2 x beam best continuations, finishes a hypothesis when one of the
`beam` best ends in </s>, scores finished hypotheses by sum(log p) / length ** length_penalty (length counting </s>)
and stops a sentence once it has `beam` finished hypotheses (`early_stopping=True`). The length limit
(pipeline.runtime.decoding.output_limit) is per sentence, so a translation does not depend on which other sentences
share its batch.

The search never copies a cache: it passes the previous step's self cache back as it came out, with `cache_rows`
saying which row each hypothesis continues from (beams reordered, finished sentences dropped), and the decoder
gathers them on the way in. It needs only each row's candidates_for_beam(beam) best next tokens, which the decoder
returns for the beam it was exported for; a wider beam takes its candidates from the logits, with the same result.

One step is one function (`_best_continuations`, `_collect_finished`, `_continue_best`, `_retire_done`) over an
explicit `_SearchState`; `beam_search_nbest` is the loop, and gives each sentence's kept finished hypotheses (its
n-best list: the service's `alternatives`); `beam_search` the best of them. Imports numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pipeline.runtime.decoding import SpecialIds
from pipeline.runtime.export_format import candidates_for_beam

# A cache is a list of per-layer arrays in graph order: [key_0, value_0, key_1, value_1, ...].
Cache = list[np.ndarray]
# Finished hypotheses of one sentence: (normalised score, ids up to and including </s>).
Finished = list[tuple[float, list[int]]]


@dataclass(frozen=True)
class DecoderStep:
    """The decoder's outputs. `logits` is None unless asked for; a runtime without next-token candidates (None)
    leaves the search to pick them from the logits."""

    logits: np.ndarray | None
    self_cache: Cache
    next_log_probs: np.ndarray | None = None
    next_ids: np.ndarray | None = None


@dataclass(frozen=True)
class _SearchState:
    """The sentences still being searched, `live` hypotheses each (1 at the first step, then `beam`).

    The cross cache and encoder mask have a row per sentence; the self cache a row per hypothesis of the step
    before, and `cache_rows` names the one each hypothesis (row sentence * live + b) continues from.
    """

    sentence: np.ndarray  # (active,) the input sentence each slot holds
    limit: np.ndarray  # (active,) its most tokens after the prefix, </s> included
    scores: np.ndarray  # (active, live) accumulated log-probabilities
    tokens: np.ndarray  # (active, live, step) tokens so far, after the prefix
    inputs: np.ndarray  # (active * live, new_len) the next decoder input: the prefix, then each hypothesis' last token
    encoder_mask: np.ndarray  # (active, src_len)
    cross_cache: Cache
    self_cache: Cache
    cache_rows: np.ndarray  # (active * live,)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _next_token_candidates(out: DecoderStep, count: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """At least `count` next tokens per row that hold the row's `count` best (log-probs, ids), as new arrays;
    <pad> has log-prob -inf.

    From the decoder's own top-k when it has one more than `count` (<pad> may take a place: see
    candidates_for_beam); otherwise from the logits: log-softmax over the whole vocabulary, then <pad> removed, as
    transformers does. Same result, slower.
    """
    if out.next_ids is not None and out.next_ids.shape[1] >= count + 1:
        log_probs = out.next_log_probs[:, : count + 1].astype(np.float32)
        token_ids = out.next_ids[:, : count + 1].astype(np.int64)
        log_probs[token_ids == pad_id] = -np.inf
        return log_probs, token_ids
    if out.logits is None:
        raise ValueError(f"the decoder returned fewer than {count + 1} candidates and no logits")
    log_probs = _log_softmax(out.logits[:, -1, :].astype(np.float32))
    log_probs[:, pad_id] = -np.inf
    top = np.argpartition(-log_probs, count - 1, axis=1)[:, :count]
    return np.take_along_axis(log_probs, top, axis=1), top


def _start(model: Any, input_ids: np.ndarray, attention_mask: np.ndarray,
           max_new_tokens: Sequence[int] | np.ndarray, prefix: Sequence[int]) -> _SearchState:
    """The state before the first step, which decodes one row per sentence, the whole prefix at once: its beams
    would all start alike. (transformers decodes `beam` copies and scores all but the first -1e9, which never lets
    them win: the same search.)"""
    batch = input_ids.shape[0]
    _, cross_cache = model.encode(input_ids, attention_mask)
    return _SearchState(
        sentence=np.arange(batch),
        limit=np.asarray(max_new_tokens, dtype=np.int64).reshape(batch),
        scores=np.zeros((batch, 1), dtype=np.float32),
        tokens=np.zeros((batch, 1, 0), dtype=np.int64),
        inputs=np.tile(np.asarray(prefix, dtype=np.int64), (batch, 1)),
        encoder_mask=attention_mask,
        cross_cache=cross_cache,
        self_cache=model.empty_cache(batch),
        cache_rows=np.arange(batch, dtype=np.int64),
    )


def _best_continuations(out: DecoderStep, state: _SearchState, forced: np.ndarray, keep: int, ids: SpecialIds
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each sentence's best `keep` (hypothesis, token) continuations by accumulated log-probability, as
    (scores, from_beam, token), each (active, keep). A sentence at its limit (`forced`) may only end."""
    active, live = state.scores.shape
    log_probs, token_ids = _next_token_candidates(out, keep, ids.pad)
    if forced.any():
        # As transformers' ForcedEOSTokenLogitsProcessor: </s> gets log-probability 0, everything else -inf.
        rows = np.repeat(forced, live)
        log_probs[rows] = -np.inf
        log_probs[rows, 0] = 0.0
        token_ids[rows, 0] = ids.eos
    width = log_probs.shape[1]
    total = (state.scores[:, :, None] + log_probs.reshape(active, live, width)).reshape(active, live * width)
    top = np.argsort(-total, axis=1, kind="stable")[:, :keep]
    token = np.take_along_axis(token_ids.reshape(active, live * width), top, axis=1)
    return np.take_along_axis(total, top, axis=1), top // width, token


def _collect_finished(finished: list[Finished], state: _SearchState, scores: np.ndarray, from_beam: np.ndarray,
                      ends: np.ndarray, beam: int, length: int, length_penalty: float, eos_id: int) -> None:
    """Adds to `finished` every hypothesis among its sentence's `beam` best continuations that ends in </s>,
    `length` tokens long with it, scored sum(log p) / length ** length_penalty."""
    normaliser = float(length) ** length_penalty
    for slot, rank in zip(*np.nonzero(ends[:, :beam] & np.isfinite(scores[:, :beam])), strict=True):
        hypothesis = state.tokens[slot, from_beam[slot, rank]].tolist() + [eos_id]
        finished[state.sentence[slot]].append((float(scores[slot, rank]) / normaliser, hypothesis))


def _continue_best(state: _SearchState, out: DecoderStep, scores: np.ndarray, from_beam: np.ndarray,
                   token: np.ndarray, ends: np.ndarray, beam: int) -> _SearchState:
    """The `beam` best continuations that do not end in </s> (a stable sort keeps them in score order), each
    continuing from its parent's cache."""
    active, live = state.scores.shape
    survivors = np.argsort(ends, axis=1, kind="stable")[:, :beam]
    parent = np.take_along_axis(from_beam, survivors, axis=1)
    new_tokens = np.take_along_axis(token, survivors, axis=1)
    return replace(
        state,
        scores=np.take_along_axis(scores, survivors, axis=1),
        tokens=np.concatenate([state.tokens[np.arange(active)[:, None], parent], new_tokens[:, :, None]], axis=2),
        inputs=new_tokens.reshape(-1, 1),
        self_cache=out.self_cache,
        cache_rows=(np.arange(active)[:, None] * live + parent).reshape(-1),
    )


def _retire_done(state: _SearchState, finished: list[Finished], best: list[list[list[int]]], forced: np.ndarray,
                 beam: int) -> _SearchState:
    """Keeps each sentence's `beam` best finished hypotheses; a sentence with `beam` of them, or at its limit,
    gets them into `best`, best first, and leaves the search, so it does not keep rows busy."""
    done = forced.copy()
    for slot, s in enumerate(state.sentence):
        if finished[s]:
            finished[s].sort(key=lambda h: -h[0])
            del finished[s][beam:]
            done[slot] |= len(finished[s]) >= beam
    if not done.any():
        return state
    for s in state.sentence[done]:
        best[s] = [hypothesis for _, hypothesis in finished[s]]
    keep = ~done
    keep_rows = np.repeat(keep, beam)
    return replace(
        state,
        sentence=state.sentence[keep],
        limit=state.limit[keep],
        scores=state.scores[keep],
        tokens=state.tokens[keep],
        inputs=state.inputs[keep_rows],
        encoder_mask=state.encoder_mask[keep],
        cross_cache=[c[keep] for c in state.cross_cache],
        cache_rows=state.cache_rows[keep_rows],
    )


def beam_search(model: Any, input_ids: np.ndarray, attention_mask: np.ndarray, **search: Any) -> list[list[int]]:
    """Each sentence's best hypothesis (the ids after the prefix, up to and including </s>): the first of
    `beam_search_nbest`'s, which takes the same arguments."""
    return [hypotheses[0] for hypotheses in beam_search_nbest(model, input_ids, attention_mask, **search)]


def beam_search_nbest(
    model: Any,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    *,
    beam: int,
    max_new_tokens: Sequence[int] | np.ndarray,
    ids: SpecialIds,
    length_penalty: float = 1.0,
    decoder_prefix: Sequence[int] | None = None,
) -> list[list[list[int]]]:
    """Each sentence's n-best list: the finished hypotheses the search kept (the ids after the prefix, up to and
    including </s>), best score first, `beam` of them (fewer only where fewer had a finite score). Batch x beam
    rows are decoded together.

    `decoder_prefix` (every sentence's; default: `ids.start` alone) is what decoding starts from: a direction's
    DirectionLayout.decoder_prefix. `max_new_tokens` is per sentence (pipeline.runtime.decoding.output_limit) and counts
    tokens after the prefix; at that step only </s> is allowed (the caller keeps prefix + limit within the
    decoder's positions). beam=1 is greedy decoding. Sentences leave the batch as soon as they are finished, so a
    long sentence does not keep short ones' rows busy.
    """
    prefix = (ids.start,) if decoder_prefix is None else tuple(decoder_prefix)
    if not prefix:
        raise ValueError("decoder_prefix is empty: decoding needs at least the decoder's start token")
    state = _start(model, input_ids, attention_mask, max_new_tokens, prefix)
    finished: list[Finished] = [[] for _ in range(input_ids.shape[0])]
    best: list[list[list[int]]] = [[] for _ in range(input_ids.shape[0])]
    keep = 2 * beam  # enough that `beam` continuations survive even if `beam` of them end in </s>
    # The logits are copied out only when the graph's own candidates are too few for this beam.
    needs_logits = getattr(model, "candidates", 0) < candidates_for_beam(beam)
    step = 0
    while state.sentence.size:
        out = model.decode(state.inputs, state.encoder_mask, state.self_cache, state.cross_cache,
                           logits=needs_logits, cache_rows=state.cache_rows)
        forced = step + 1 >= state.limit  # this step produces the sentence's last allowed token: only </s>
        scores, from_beam, token = _best_continuations(out, state, forced, keep, ids)
        ends = token == ids.eos
        _collect_finished(finished, state, scores, from_beam, ends, beam, step + 1, length_penalty, ids.eos)
        state = _continue_best(state, out, scores, from_beam, token, ends, beam)
        step += 1
        state = _retire_done(state, finished, best, forced, beam)
    return best
