"""Word dropout: while training, each source token and each decoder-input token becomes <unk> with probability p.

Sennrich and Zhang (2019, "Revisiting Low-Resource Neural Machine Translation") drop whole words on both sides as
one of the regularizers a small corpus needs; Marian's --dropout-src / --dropout-trg zero the dropped words'
embeddings. Replacing the id with <unk> instead (the "token drop" of Zhang et al. 2020) gives the model one learned
vector for a missing word, goes through every family's own embedding unchanged, and leaves the labels alone: the
decoder still predicts the real next token from a history with holes in it.

Ids that carry structure are never dropped: <pad>, </s>, <unk> itself and every direction's special ids (target
tags, language codes, the decoder's start), so the model always sees where a sentence ends and what to write.
The masks come from torch's generator, which each rank seeds apart and checkpoints save: a resumed run draws the
masks the uninterrupted one would have. p = 0 draws nothing, so a run without it is the run it was before.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pipeline.runtime.errors import PipelineError

DROPPED_INPUTS = ("input_ids", "decoder_input_ids")  # never the labels: the loss stays on the real tokens


class WordDropout:
    def __init__(self, p: float, unk_id: int | None, kept_ids: Iterable[int], device: torch.device):
        if p > 0 and unk_id is None:
            raise PipelineError(f"train.word_dropout is {p}, but the tokenizer has no <unk> token to drop words to "
                                "(data/tokenized/meta.json unk_id is null): set train.word_dropout to 0")
        self.p, self.unk_id = p, unk_id
        self.kept = torch.tensor(sorted({i for i in (unk_id, *kept_ids) if i is not None}), dtype=torch.int64,
                                 device=device)

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model's inputs with tokens replaced (new tensors); `inputs` itself is not changed."""
        if self.p == 0:
            return inputs
        dropped = dict(inputs)
        for name in DROPPED_INPUTS:
            ids = inputs[name]
            drop = (torch.rand(ids.shape, device=ids.device) < self.p) & ~torch.isin(ids, self.kept)
            dropped[name] = ids.masked_fill(drop, self.unk_id)
        return dropped
