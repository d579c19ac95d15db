"""transformers `generate` started from a direction's decoder prefix: the one torch-side way the stages translate
(evaluate, train-time BLEU, the export's parity reference), so every family is decoded in its target language.

A direction's `decoder_prefix` (pipeline.runtime.model_languages) is the start token followed by the target's prefix:
`(<pad>,)` for Marian, `(de_DE,)` for mBART cc25, `(</s>, de_DE)` for mBART-50, M2M-100 and NLLB. It goes to
`generate` as `decoder_input_ids`, one copy per row, which for these families is what `forced_bos_token_id` does
(the code is the second decoder input either way), and also covers a prefix of any length. Three of generate's own
rules are set so the prefix is taken as given:
  - `decoder_start_token_id` is the prefix's first token: generate prepends its own start token when a row does
    not begin with it (mBART cc25's start is the target code, not the config's </s>);
  - `forced_bos_token_id` is off: a checkpoint's generation config may force a token at position 1, which is
    inside the prefix (or, for a one-token prefix, would replace the first translated token);
  - the lengths count tokens after the prefix: the batch's `max_length` is the prefix length plus the longest
    limit (with generate's `max_new_tokens` cleared: a checkpoint's own would win over it), and each sentence's
    own limit is applied by ForceEosAtSentenceLimit, so a translation does not depend on its batch. Beam search's
    length penalty also counts from the end of the prefix (generate's `decoder_prompt_len`).
A hypothesis is what follows the prefix, cut after its first </s> (kept) and without padding.

Importing this module imports torch and transformers: callers import it where they translate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from pipeline.runtime.decoding import strip_hypothesis


class ForceEosAtSentenceLimit(LogitsProcessor):
    """Each sentence's own output length limit inside `generate`: only </s> (log p 0) once a sentence has made
    `limit - 1` tokens after the prefix, the way transformers' forced-EOS processor applies max_length.

    transformers' `max_length` is one limit for the whole batch, which would make a sentence's translation depend
    on the longest sentence batched with it; with this processor the batch-wide limit never binds. Rows are
    sentence * beam + b, as generate expands them; `limits` are per sentence, counted in tokens after the prefix.
    """

    def __init__(self, limits: Sequence[int], beam: int, eos_id: int, prefix_length: int, device: torch.device):
        self.limits = torch.tensor(list(limits), device=device).repeat_interleave(beam)
        self.eos_id = eos_id
        self.prefix_length = prefix_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # input_ids holds the prefix and the tokens so far: this step makes the translation's token number
        # input_ids.shape[1] - prefix_length + 1.
        at_limit = self.limits <= input_ids.shape[1] - self.prefix_length + 1
        if not bool(at_limit.any()):
            return scores
        scores = scores.clone()
        scores[at_limit] = -float("inf")
        scores[at_limit, self.eos_id] = 0.0
        return scores


def prefix_rows(prefix: Sequence[int] | Sequence[Sequence[int]], rows: int) -> list[tuple[int, ...]]:
    """One prefix per row: `prefix` repeated, or `prefix` itself when it is already one per row (several
    directions in one batch); ValueError when the rows' prefixes differ in length or count, or one is empty."""
    if not prefix:
        raise ValueError("an empty decoder prefix: a direction's decoder_prefix holds at least its start token")
    if isinstance(prefix[0], Sequence):
        per_row = [tuple(int(t) for t in row) for row in prefix]
    else:
        per_row = [tuple(int(t) for t in prefix)] * rows
    if len(per_row) != rows:
        raise ValueError(f"{len(per_row)} decoder prefixes for {rows} rows")
    if not per_row or not per_row[0] or len({len(p) for p in per_row}) != 1:
        raise ValueError(f"decoder prefixes must be non-empty and of one length, got {sorted(set(per_row))}")
    return per_row


def generate_from_prefix(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prefix: Sequence[int] | Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    *,
    eos_id: int,
    pad_id: int,
    num_beams: int = 1,
    logits_processor: LogitsProcessorList | None = None,
    **generate_kwargs: Any,
) -> list[list[int]]:
    """Each row's translation ids after the decoder prefix, up to and including its first </s>, without padding.

    `prefix`: one direction's decoder_prefix for every row, or one prefix per row (all of one length).
    `max_new_tokens`: the most tokens a translation may have (its </s> included;
    pipeline.runtime.decoding.output_limit), one figure for the batch, or one per row (then each is applied by
    ForceEosAtSentenceLimit, so a row's translation does not depend on its batch); either is cut to the decoder
    positions the prefix leaves.
    `num_beams` is explicit because a checkpoint's generation config may set its own. Other keyword arguments go
    to `generate` (length_penalty, early_stopping, bad_words_ids, ...); sampling is off unless asked for."""
    rows = int(input_ids.shape[0])
    prefixes = prefix_rows(prefix, rows)
    prefix_length = len(prefixes[0])
    processors = LogitsProcessorList(logits_processor or [])
    # The prefix takes decoder positions too: a limit past the last position is cut to it.
    room = model.config.max_position_embeddings - prefix_length
    if isinstance(max_new_tokens, int):
        longest = min(max_new_tokens, room)
    else:
        limits = [min(int(n), room) for n in max_new_tokens]
        if len(limits) != rows:
            raise ValueError(f"{len(limits)} output limits for {rows} rows")
        longest = max(limits)
        processors.append(ForceEosAtSentenceLimit(limits, num_beams, eos_id, prefix_length, input_ids.device))
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=torch.tensor(prefixes, dtype=torch.long, device=input_ids.device),
        # Row 0 starts with it, so generate never prepends its own start token (see the module docstring).
        decoder_start_token_id=prefixes[0][0],
        forced_bos_token_id=None,
        # max_length counts the prefix; max_new_tokens cleared, since a checkpoint's own would win over it.
        max_length=prefix_length + longest,
        max_new_tokens=None,
        num_beams=num_beams,
        logits_processor=processors,
        **{"do_sample": False, **generate_kwargs},
    )
    return [strip_hypothesis(row[prefix_length:], eos_id, pad_id) for row in out.tolist()]
