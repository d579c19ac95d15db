"""Each sentence's own output length limit inside `generate`, so a translation does not depend on its batch.

transformers' `max_length` is one limit for the whole batch, which would make a sentence's translation depend on the
longest sentence batched with it. This logits processor applies the per-sentence limit the way transformers'
forced-EOS processor applies max_length (only </s>, log p 0, at the limit), so the batch-wide limit never binds.
Importing this module imports torch and transformers: the stage imports it when it translates.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor


class ForceEosAtSentenceLimit(LogitsProcessor):
    """Rows are sentence * beam + b, as generate expands them; `limits` are per sentence, counted in tokens."""

    def __init__(self, limits: list[int], beam: int, eos_id: int, device: torch.device):
        self.limits = torch.tensor(limits, device=device).repeat_interleave(beam)
        self.eos_id = eos_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # input_ids holds the start token and the tokens so far: this step makes token number input_ids.shape[1].
        at_limit = self.limits <= input_ids.shape[1]
        if not bool(at_limit.any()):
            return scores
        scores = scores.clone()
        scores[at_limit] = -float("inf")
        scores[at_limit, self.eos_id] = 0.0
        return scores
