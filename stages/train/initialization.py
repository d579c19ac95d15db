"""The Transformer's own weight initialisation for a model trained from scratch (`model.weight_init: xavier`).

transformers draws every matrix of a Marian model from N(0, 0.02), BERT's choice. Vaswani et al. 2017 and fairseq,
whose recipes the Multi30k and IWSLT figures come from, draw projections from Xavier-uniform (the query, key and
value projections at gain 1/sqrt(2), as fairseq's MultiheadAttention) and embeddings from N(0, d_model ** -0.5),
so that once Marian multiplies them by sqrt(d_model) a token's embedding has unit variance per dimension, level with
the sinusoidal positions it is added to; with N(0, 0.02) it starts at a fifth of their variance at d_model 256.
Biases start at zero, layer norms at one and zero (transformers' own), the sinusoidal positions are left as they
are, and a tied output projection is the embedding matrix, drawn once."""

from __future__ import annotations

from typing import Any

_QKV = ("q_proj", "k_proj", "v_proj")


def xavier_init(model: Any) -> None:
    """Redraw the trainable embeddings and linear projections of a freshly built seq2seq model in place, from the
    current torch random state."""
    import torch
    from torch import nn

    d_model = model.config.d_model
    output = model.get_output_embeddings()
    embeddings = {id(module.weight): module for module in model.modules()
                  if isinstance(module, nn.Embedding) and module.weight.requires_grad}
    with torch.no_grad():
        for module in embeddings.values():
            nn.init.normal_(module.weight, mean=0.0, std=d_model ** -0.5)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        for name, module in model.named_modules():
            if not isinstance(module, nn.Linear) or id(module.weight) in embeddings:
                continue  # a tied output projection was drawn as the embedding it is
            if module is output:  # untied: fairseq draws the output embedding as the input one
                nn.init.normal_(module.weight, mean=0.0, std=d_model ** -0.5)
            else:
                gain = 2 ** -0.5 if name.rsplit(".", 1)[-1] in _QKV else 1.0
                nn.init.xavier_uniform_(module.weight, gain=gain)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
