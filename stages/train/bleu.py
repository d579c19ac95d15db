"""BLEU during training: greedy translations of a fixed, seeded sample of each direction's valid pairs (rank 0).

Each direction contributes `train.valid_bleu_sentences` pairs (all of them when it has fewer), drawn once with one
seeded generator, direction after direction, and is scored on its own: the call returns one BLEU per direction
(directions.py averages them). The sources are read from the encoded valid arrays the trainer already has (they
hold the direction's source framing: Marian's target tag, mBART's and NLLB's source code), and each translation is
decoded after its direction's decoder prefix (the start id, then the target's code: `</s> de_DE` for mBART-50,
M2M-100 and NLLB), so every direction is generated in its target language, as the evaluate stage generates
(pipeline/prefixed_generate.py); the hypothesis is what follows the prefix. The references are the target ids
without their framing, decoded by the tokenizer in data/tokenized/hf_tokenizer, so the training process needs no
Parquet reader. All directions' sentences are decoded together, in batches by length (the directions of one
model have decoder prefixes of one length, so a batch's rows each get their own).
Scored with sacreBLEU's defaults (13a, cased), as the evaluate stage scores; but the references are the
detokenized SentencePiece pieces (normalised text) and the search is greedy, so the figure is a training
signal that tracks, not equals, the evaluate stage's beam-search BLEU on the original text.
`stages.evaluate.translate`/`score` are not reused: importing that module pulls in the Parquet readers, and
its `translate` re-tokenizes text that is already encoded here. The batching by tokens, the padding and the
output length rule are the shared ones (`pipeline.runtime.decoding`, numpy only; the length rule with the evaluate
stage's default `max_len_a` and `max_len_b`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.runtime.decoding import output_limit, pad_batch, token_batches
from stages.train.batching import Collator

log = logging.getLogger("mtpipe.train")


class ValidBleu:
    """`bleu(model, device, autocast)` -> one greedy-decoded corpus BLEU per direction (`rows`: each direction's
    valid row numbers); `enabled` is False when switched off (0 sentences) or without sacrebleu/the tokenizer."""

    def __init__(self, valid: Collator, rows: list[np.ndarray], tokenizer_dir: Path, sentences: int, seed: int,
                 max_tokens: int, max_len_a: float, max_len_b: int):
        self.enabled = False
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        if sentences == 0:
            return
        try:
            from sacrebleu.metrics import BLEU
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        except (ImportError, OSError, ValueError) as err:
            log.warning("valid BLEU is off: %s", err)
            return
        self.bleu = BLEU()
        rng = np.random.default_rng(seed)
        picks = [r[rng.choice(len(r), size=min(sentences, len(r)), replace=False)] for r in rows]
        bounds = np.cumsum([0] + [len(p) for p in picks]).tolist()
        self.groups = [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]  # each direction's
        pick = np.concatenate(picks)
        self.sources = valid.sources(pick)
        direction_of_pick = [d for d, p in enumerate(picks) for _ in range(len(p))]
        self.prefixes = [valid.decoder_prefix(d) for d in direction_of_pick]
        self.refs = self.tokenizer.batch_decode(
            [plain_target(valid, i, d) for i, d in zip(pick.tolist(), direction_of_pick, strict=True)],
            skip_special_tokens=True)
        self.pad_id, self.eos_id, self.max_tokens = valid.pad_id, self.tokenizer.eos_token_id, max_tokens
        self.enabled = True

    def __call__(self, model: Any, device: Any, autocast: Callable[[], AbstractContextManager]) -> list[float]:
        hyps = self.translate(model, device, autocast)
        return [float(self.bleu.corpus_score([hyps[i] for i in group], [[self.refs[i] for i in group]]).score)
                for group in self.groups]

    def translate(self, model: Any, device: Any, autocast: Callable[[], AbstractContextManager]) -> list[str]:
        """Greedy translations of every sampled source, each after its direction's decoder prefix, in sample
        order."""
        import torch

        from pipeline.prefixed_generate import generate_from_prefix

        hyps = [""] * len(self.sources)
        was_training = model.training
        model.eval()
        max_positions = model.config.max_position_embeddings
        for batch in self.batches():
            ids, mask = pad_batch([self.sources[i] for i in batch], self.pad_id)
            prefixes = [self.prefixes[i] for i in batch]
            # generate_from_prefix cuts the limit to the decoder positions a longer prefix leaves.
            limit = output_limit(ids.shape[1], self.max_len_a, self.max_len_b, max_positions)
            with torch.inference_mode(), autocast():
                out = generate_from_prefix(model, torch.from_numpy(ids).to(device),
                                           torch.from_numpy(mask).to(device), prefixes, limit,
                                           eos_id=self.eos_id, pad_id=self.pad_id, num_beams=1)
            for i, text in zip(batch, self.tokenizer.batch_decode(out, skip_special_tokens=True), strict=True):
                hyps[i] = text
        model.train(was_training)
        return hyps

    def batches(self) -> list[list[int]]:
        """The samples in batches by length, each batch of one decoder-prefix length (generate takes one)."""
        by_length: dict[int, list[int]] = {}
        for i, prefix in enumerate(self.prefixes):
            by_length.setdefault(len(prefix), []).append(i)
        return [[members[j] for j in batch] for members in by_length.values()
                for batch in token_batches([len(self.sources[i]) for i in members], self.max_tokens)]


def plain_target(valid: Collator, row: int, direction: int) -> list[int]:
    """A reference's ids without its direction's framing (the target code, </s>): the text's pieces."""
    ids = valid.tgt[row].tolist()
    if not valid.layouts:
        return ids
    layout = valid.layouts[direction]
    return ids[len(layout.target_prefix) : len(ids) - len(layout.target_suffix)]
