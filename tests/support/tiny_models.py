"""Tiny models of the real transformers classes, in memory, for tests of the code that wraps them (the training
objective, the exported decoders)."""

from __future__ import annotations

import torch
from transformers import MarianConfig, MarianMTModel

MARIAN_VOCAB, MARIAN_PAD, MARIAN_EOS = 61, 60, 0


def tiny_marian(bias: bool, decoder_layers: int = 1) -> MarianMTModel:
    """A seeded Marian model of 61 pieces (<pad> 60, the decoder's start; </s> 0), d_model 16, one encoder layer;
    with `bias`, a random `final_logits_bias`, as OPUS-MT checkpoints carry Marian's output-layer bias."""
    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(vocab_size=MARIAN_VOCAB, d_model=16, encoder_layers=1,
                                       decoder_layers=decoder_layers, encoder_attention_heads=2,
                                       decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                                       pad_token_id=MARIAN_PAD, decoder_start_token_id=MARIAN_PAD,
                                       eos_token_id=MARIAN_EOS, dropout=0.0))
    if bias:
        model.final_logits_bias.copy_(torch.randn(1, MARIAN_VOCAB))
    return model
