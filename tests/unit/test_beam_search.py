"""pipeline/runtime/beam_search.py on a scripted fake model whose next-token probabilities are a table: greedy and
beam search stop at </s>, never emit <pad>, force </s> at each sentence's own limit and score it as transformers
does, follow each hypothesis' cache when beams change places, and let the length penalty decide between a short
and a long hypothesis. (The search against transformers' `generate` on a real export is tests/e2e/test_translate.py's.)
"""

from __future__ import annotations

import numpy as np

from pipeline.runtime.beam_search import DecoderStep, beam_search
from pipeline.runtime.decoding import SpecialIds

EOS, PAD = 0, 6
IDS = SpecialIds(start=PAD, eos=EOS, pad=PAD)
VOCAB = 7


class ScriptedModel:
    """A fake OnnxSeq2Seq: next-token probabilities come from `table(sentence, prefix)`.

    The one-layer self cache holds the tokens fed so far and the cross cache (a row per sentence) the sentence's
    number (its first source id), so the fake reads each row's prefix and sentence back from its caches: reordering
    or dropping rows wrongly changes the outcome.
    """

    def __init__(self, table):
        self.table = table

    def encode(self, input_ids, attention_mask):
        sentence = input_ids[:, :1, None, None].astype(np.float32)  # (sentences, 1, 1, 1)
        return np.zeros((*input_ids.shape, 1)), [sentence, sentence.copy()]

    def empty_cache(self, rows):
        return [np.zeros((rows, 1, 0, 1), dtype=np.float32) for _ in range(2)]

    def decode(self, decoder_input_ids, encoder_attention_mask, self_cache, cross_cache, logits=True,
               cache_rows=None):
        # As the graph does: row r continues from row cache_rows[r] of the cache it is given.
        past = self_cache[0] if cache_rows is None else self_cache[0][cache_rows]
        fed = np.concatenate([past, decoder_input_ids[:, None, :, None].astype(np.float32)], axis=2)
        rows, group = len(decoder_input_ids), len(decoder_input_ids) // len(cross_cache[0])
        scores = np.full((rows, 1, VOCAB), -30.0, dtype=np.float32)
        for row in range(rows):
            prefix = tuple(int(t) for t in fed[row, 0, 1:, 0])  # without the start token
            for token, p in self.table(int(cross_cache[0][row // group, 0, 0, 0]), prefix).items():
                scores[row, 0, token] = np.log(p)
        return DecoderStep(scores, [fed, fed.copy()])  # no candidates: the search takes them from the logits


def search(table, sentences: list[int], beam: int, limits: list[int], length_penalty: float = 1.0):
    ids = np.array([[s, EOS] for s in sentences], dtype=np.int64)
    return beam_search(ScriptedModel(table), ids, np.ones_like(ids), beam=beam, max_new_tokens=limits, ids=IDS,
                       length_penalty=length_penalty)


def test_greedy_stops_at_eos_never_emits_pad_and_forces_eos_at_each_sentences_own_limit():
    scripts = {
        1: {(): {3: 0.9}, (3,): {EOS: 0.9}},  # ends by itself after one word
        2: {(): {2: 0.9}, (2,): {PAD: 0.6, 4: 0.3}, (2, 4): {EOS: 0.9}},  # "wants" <pad>, gets its second choice
        3: {},  # never ends: </s> only at its limit
    }

    def table(sentence, prefix):
        return scripts[sentence].get(prefix, {5: 0.9})

    assert search(table, [1, 2, 3], beam=1, limits=[6, 6, 3]) == [[3, EOS], [2, 4, EOS], [5, 5, EOS]]
    # The limit is per sentence: sentence 3's does not cut the others.
    assert search(table, [3, 1], beam=1, limits=[2, 9]) == [[5, EOS], [3, EOS]]


def test_beam_search_follows_each_hypothesis_cache_when_beams_change_places():
    # "1" is the better first word, but what follows it is weak; "2 3 </s>" wins. Between steps the beam holding
    # "2" moves from second place to first, so a row that kept its old cache would read the other prefix's
    # probabilities (and "2 3 4 ..." would overtake).
    table = {
        (): {1: 0.5, 2: 0.4, 3: 0.05, 4: 0.05},
        (1,): {3: 0.32, 4: 0.29, 5: 0.29, EOS: 0.1},
        (2,): {3: 0.9, 4: 0.1},
        (1, 3): {EOS: 0.1, 4: 0.9},
        (2, 3): {EOS: 0.9, 5: 0.1},
    }

    def lookup(sentence, prefix):
        return table.get(prefix, {EOS: 0.6, 5: 0.4})

    assert search(lookup, [1], beam=1, limits=[8]) == [[1, 3, 4, EOS]]
    assert search(lookup, [1], beam=2, limits=[8]) == [[2, 3, EOS]]


def test_the_forced_eos_at_the_limit_scores_zero_as_in_transformers():
    # At the limit "2 2" must end: its </s> is scored log p = 0 (not its model log p of -4.6), so "2 2 </s>"
    # (-0.90 / 3) beats "1 </s>", which ended by itself (-0.80 / 2).
    table = {
        (): {1: 0.5, 2: 0.45, 3: 0.05},
        (1,): {EOS: 0.9, 3: 0.05, 4: 0.05},
        (2,): {2: 0.9, EOS: 0.05, 5: 0.05},
        (2, 2): {5: 0.99, EOS: 0.01},
    }

    def lookup(sentence, prefix):
        return table.get(prefix, {EOS: 0.6, 5: 0.4})

    assert search(lookup, [1], beam=2, limits=[3]) == [[2, 2, EOS]]
    assert search(lookup, [1], beam=1, limits=[3]) == [[1, EOS]]


def test_the_length_penalty_decides_between_a_short_and_a_long_hypothesis():
    # "</s>" has log p -0.80; "1 1 </s>" has -1.04 in all, -0.35 per token.
    table = {
        (): {EOS: 0.45, 1: 0.55},
        (1,): {1: 0.8, 2: 0.15, EOS: 0.05},
        (1, 1): {EOS: 0.8, 3: 0.2},
        (1, 2): {EOS: 0.9, 3: 0.1},
    }

    def lookup(sentence, prefix):
        return table.get(prefix, {EOS: 0.5, 4: 0.5})

    assert search(lookup, [1], beam=2, limits=[8], length_penalty=0.0) == [[EOS]]
    assert search(lookup, [1], beam=2, limits=[8], length_penalty=1.0) == [[1, 1, EOS]]
