"""The example inputs the graphs are traced and exported with."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.decoding import SpecialIds, pad_batch


def example_inputs(sources: list[list[int]], targets: list[list[int]], special_ids: SpecialIds
                   ) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and decoder_input_ids: batch 2, lengths >= 2 and padding in every row.

    torch.export specialises dimensions of size 0 or 1, and jit.trace records whichever mask branch the example
    takes, so the example must have a masked position to keep the padding mask in the traced graph.
    """
    src = [sources[i % len(sources)] for i in range(2)]
    tgt = [targets[i % len(targets)] for i in range(2)]
    ids, mask = pad_batch(src, special_ids.pad)
    # One more padded column, so that both rows have a masked position.
    ids = np.pad(ids, ((0, 0), (0, 1)), constant_values=special_ids.pad)
    mask = np.pad(mask, ((0, 0), (0, 1)))
    decoder_ids, _ = pad_batch([[special_ids.start, *t[:2]] for t in tgt], special_ids.pad)
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask),
        "decoder_input_ids": torch.from_numpy(decoder_ids),
    }
