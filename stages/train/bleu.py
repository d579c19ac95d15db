"""BLEU during training: greedy translations of a fixed, seeded sample of the valid pairs (rank 0).

The sample is read from the encoded valid arrays the trainer already has, and the references are those ids
decoded by the tokenizer in data/tokenized/hf_tokenizer, so the training process needs no Parquet reader.
Scored with sacreBLEU's defaults (13a, cased), as the evaluate stage scores; but the references are the
detokenized SentencePiece pieces (normalised text) and the search is greedy, so the figure is a training
signal that tracks, not equals, the evaluate stage's beam-search BLEU on the original text.
`stages.evaluate.translate`/`score` are not reused: importing that module pulls in the Parquet readers, and
its `translate` re-tokenizes text that is already encoded here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

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
        sources = [valid.clip(valid.src[i]) for i in pick]
        # Sorted by length: batches of similar lengths decode with little padding.
        order = np.argsort([len(s) for s in sources], kind="stable")
        self.sources = [sources[i] for i in order]
        self.refs = self.tokenizer.batch_decode([valid.tgt[pick[i]].tolist() for i in order],
                                                skip_special_tokens=True)
        self.pad_id, self.max_tokens = valid.pad_id, max_tokens
        self.enabled = True

    def __call__(self, model: Any, device: Any, autocast: Callable[[], AbstractContextManager]) -> float:
        import torch

        hyps: list[str] = []
        start = 0
        was_training = model.training
        model.eval()
        while start < len(self.sources):
            # Grow the batch while (rows x longest source) stays within max_tokens.
            end = start + 1
            while end < len(self.sources) and (end + 1 - start) * len(self.sources[end]) <= self.max_tokens:
                end += 1
            rows = self.sources[start:end]
            longest = max(len(r) for r in rows)
            ids = np.full((len(rows), longest), self.pad_id, dtype=np.int64)
            for i, r in enumerate(rows):
                ids[i, : len(r)] = r
            input_ids = torch.from_numpy(ids).to(device)
            with torch.inference_mode(), autocast():
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=(input_ids != self.pad_id).long(),
                    num_beams=1,
                    do_sample=False,
                    # The evaluate stage's default length limit (1.2 x source + 10), + 1 for the start token.
                    max_length=int(1.2 * longest + 10) + 1,
                )
            hyps += self.tokenizer.batch_decode(out, skip_special_tokens=True)
            start = end
        model.train(was_training)
        return float(self.bleu.corpus_score(hyps, [self.refs]).score)
