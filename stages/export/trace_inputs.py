"""The example inputs the graphs are traced and exported with."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.runtime.decoding import pad_batch
from pipeline.runtime.model_languages import DirectionLayout


def example_inputs(sources: list[list[int]], targets: list[list[int]], layout: DirectionLayout, pad_id: int
                   ) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and decoder_input_ids: batch 2, lengths >= 2 and padding in every row.

    The decoder's inputs are teacher-forced ones of a direction (`layout`): its decoder start, then the first
    labels, which begin with the target's prefix (so a row starts with the decoder prefix a translation is
    decoded after: `<pad>` for Marian, `</s> de_DE` for mBART-50).

    torch.export specialises dimensions of size 0 or 1, and jit.trace records whichever mask branch the example
    takes, so the example must have a masked position to keep the padding mask in the traced graph.
    """
    src = [sources[i % len(sources)] for i in range(2)]
    tgt = [targets[i % len(targets)] for i in range(2)]
    ids, mask = pad_batch(src, pad_id)
    # One more padded column, so that both rows have a masked position.
    ids = np.pad(ids, ((0, 0), (0, 1)), constant_values=pad_id)
    mask = np.pad(mask, ((0, 0), (0, 1)))
    decoder_ids, _ = pad_batch([[layout.decoder_start, *t[:2]] for t in tgt], pad_id)
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask),
        "decoder_input_ids": torch.from_numpy(decoder_ids),
    }
