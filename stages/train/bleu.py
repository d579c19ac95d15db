"""BLEU during training: greedy translations of a fixed, seeded sample of each direction's valid pairs (rank 0).

Each direction contributes `train.valid_bleu_sentences` pairs (all of them when it has fewer), drawn once with one
seeded generator, direction after direction, and is scored on its own: the call returns one BLEU per direction
(directions.py averages them). The sources are read from the encoded valid arrays the trainer already has (with
target tags they already start with the target language's tag, so the model knows what to produce), and the
references are the target ids decoded by the tokenizer in data/tokenized/hf_tokenizer, so the training process
needs no Parquet reader. All directions' sentences are decoded together, in batches by length.
Scored with sacreBLEU's defaults (13a, cased), as the evaluate stage scores; but the references are the
detokenized SentencePiece pieces (normalised text) and the search is greedy, so the figure is a training
signal that tracks, not equals, the evaluate stage's beam-search BLEU on the original text.
`stages.evaluate.translate`/`score` are not reused: importing that module pulls in the Parquet readers, and
its `translate` re-tokenizes text that is already encoded here. The batching by tokens, the padding and the
output length rule are the shared ones (`pipeline.decoding`, numpy only; the length rule with the evaluate
stage's default `max_len_a` and `max_len_b`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.decoding import output_limit, pad_batch, token_batches
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
        self.sources = [valid.clip(valid.src[i]) for i in pick]
        self.refs = self.tokenizer.batch_decode([valid.tgt[i].tolist() for i in pick], skip_special_tokens=True)
        self.pad_id, self.max_tokens = valid.pad_id, max_tokens
        self.enabled = True

    def __call__(self, model: Any, device: Any, autocast: Callable[[], AbstractContextManager]) -> list[float]:
        hyps = self.translate(model, device, autocast)
        return [float(self.bleu.corpus_score([hyps[i] for i in group], [[self.refs[i] for i in group]]).score)
                for group in self.groups]

    def translate(self, model: Any, device: Any, autocast: Callable[[], AbstractContextManager]) -> list[str]:
        """Greedy translations of every sampled source, in sample order."""
        import torch

        hyps = [""] * len(self.sources)
        was_training = model.training
        model.eval()
        max_positions = model.config.max_position_embeddings
        for batch in token_batches([len(s) for s in self.sources], self.max_tokens):
            ids, mask = pad_batch([self.sources[i] for i in batch], self.pad_id)
            # max_length counts the decoder's start token besides the output_limit tokens.
            max_length = output_limit(ids.shape[1], self.max_len_a, self.max_len_b, max_positions) + 1
            with torch.inference_mode(), autocast():
                out = model.generate(
                    input_ids=torch.from_numpy(ids).to(device),
                    attention_mask=torch.from_numpy(mask).to(device),
                    num_beams=1,
                    do_sample=False,
                    max_length=max_length,
                )
            for i, text in zip(batch, self.tokenizer.batch_decode(out, skip_special_tokens=True), strict=True):
                hyps[i] = text
        model.train(was_training)
        return hyps
