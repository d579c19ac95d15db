"""BLEU during training: greedy translations of a fixed, seeded sample of the valid pairs (rank 0).

The sample is read from the encoded valid arrays the trainer already has, and the references are those ids
decoded by the tokenizer in data/tokenized/hf_tokenizer, so the training process needs no Parquet reader.
Scored with sacreBLEU's defaults (13a, cased), as the evaluate stage scores; but the references are the
detokenized SentencePiece pieces (normalised text) and the search is greedy, so the figure is a training
signal that tracks, not equals, the evaluate stage's beam-search BLEU on the original text.
`stages.evaluate.translate`/`score` are not reused: importing that module pulls in the Parquet readers, and
its `translate` re-tokenizes text that is already encoded here; the batching by tokens is the shared one
(`pipeline.translate`, numpy only).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.translate import pad_batch, token_batches
from stages.train.batching import Collator

log = logging.getLogger("mtpipe.train")


class ValidBleu:
    def __init__(self, valid: Collator, tokenizer_dir: Path, sentences: int, seed: int, max_tokens: int):
        self.enabled = False
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
        n = len(valid.src)
        pick = np.random.default_rng(seed).choice(n, size=min(sentences, n), replace=False)
        self.sources = [valid.clip(valid.src[i]) for i in pick]
        self.refs = self.tokenizer.batch_decode([valid.tgt[i].tolist() for i in pick], skip_special_tokens=True)
        self.pad_id, self.max_tokens = valid.pad_id, max_tokens
        self.enabled = True

    def __call__(self, model: Any, device: Any, autocast: Callable[[], AbstractContextManager]) -> float:
        import torch

        hyps = [""] * len(self.sources)
        was_training = model.training
        model.eval()
        for batch in token_batches([len(s) for s in self.sources], self.max_tokens):
            ids, mask = pad_batch([self.sources[i] for i in batch], self.pad_id)
            with torch.inference_mode(), autocast():
                out = model.generate(
                    input_ids=torch.from_numpy(ids).to(device),
                    attention_mask=torch.from_numpy(mask).to(device),
                    num_beams=1,
                    do_sample=False,
                    # The evaluate stage's default length limit (1.2 x source + 10), + 1 for the start token.
                    max_length=int(1.2 * ids.shape[1] + 10) + 1,
                )
            for i, text in zip(batch, self.tokenizer.batch_decode(out, skip_special_tokens=True), strict=True):
                hyps[i] = text
        model.train(was_training)
        return float(self.bleu.corpus_score(hyps, [self.refs]).score)
