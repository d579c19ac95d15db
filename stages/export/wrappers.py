"""The modules the export traces: the model's encoder and decoder as graphs with plain tensor inputs and outputs.

    EncoderWithCrossCache  input_ids, attention_mask -> last_hidden_state, cross_key_0, cross_value_0, ...
    CachedDecoder          decoder_input_ids, encoder_attention_mask, cache_rows, self cache, cross cache
                           -> logits, next_log_probs, next_ids, present self cache
    EncoderForExport,      the legacy, uncached TorchScript graphs
    DecoderForExport

The cached decoder is written here over the model's own layers (projections, layer norms, feed-forward), not over
transformers' Cache objects (whose argument was renamed from `past_key_values` to `cache` in transformers 5): its
inputs and outputs are plain tensors, which exports cleanly and does not move with that API. Graph names and the
cache layout are pipeline/export_format.py's.

Importing this module imports torch: only the export stage's torch-side modules and the tests import it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipeline.export_format import candidates_for_beam


def split_heads(states: Any, head_dim: int) -> Any:
    """(batch, length, d_model) -> (batch, heads, length, head_dim)."""
    batch, length, _ = states.shape
    return states.view(batch, length, -1, head_dim).transpose(1, 2)


def attend(attention: Any, hidden: Any, keys: Any, values: Any, bias: Any, head_dim: int) -> Any:
    """MarianAttention's output for queries from `hidden` over given keys/values, with an additive mask."""
    query = split_heads(attention.q_proj(hidden), head_dim)
    weights = torch.softmax(torch.matmul(query, keys.transpose(2, 3)) * attention.scaling + bias, dim=-1)
    out = torch.matmul(weights, values).transpose(1, 2)
    return attention.out_proj(out.reshape(out.shape[0], out.shape[1], -1))


def attend_by_sentence(attention: Any, hidden: Any, keys: Any, values: Any, bias: Any, head_dim: int) -> Any:
    """Cross-attention for rows that come in groups per sentence (its beams) over per-sentence keys/values.

    hidden: (sentences * group, new_len, d_model); keys, values: (sentences, heads, src_len, head_dim); bias:
    (sentences, 1, 1, src_len). A sentence's beams share its encoder keys and values, so they are kept once
    per sentence and each sentence's group x new_len queries attend in one matmul: `group` times less cache
    memory and traffic than repeating the keys per beam.
    """
    rows, new_len, _ = hidden.shape
    sentences, heads = keys.shape[0], keys.shape[1]
    query = split_heads(attention.q_proj(hidden), head_dim)  # (rows, heads, new_len, head_dim)
    query = query.reshape(sentences, -1, heads, new_len, head_dim).transpose(1, 2)
    query = query.reshape(sentences, heads, -1, head_dim)  # (sentences, heads, group * new_len, head_dim)
    weights = torch.softmax(torch.matmul(query, keys.transpose(2, 3)) * attention.scaling + bias, dim=-1)
    out = torch.matmul(weights, values).reshape(sentences, heads, -1, new_len, head_dim)
    out = out.permute(0, 2, 3, 1, 4).reshape(rows, new_len, heads * head_dim)
    return attention.out_proj(out)


class EncoderForExport(nn.Module):
    """input_ids, attention_mask -> last_hidden_state (the legacy TorchScript encoder)."""

    def __init__(self, model: Any):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids: Any, attention_mask: Any) -> Any:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class DecoderForExport(nn.Module):
    """decoder_input_ids, encoder_hidden_states, encoder_attention_mask -> logits (no cache; legacy)."""

    def __init__(self, model: Any):
        super().__init__()
        self.decoder = model.get_decoder()
        self.lm_head = model.lm_head
        # Marian adds a bias buffer outside lm_head; MarianMTModel.forward does the same sum.
        self.register_buffer("final_logits_bias", model.final_logits_bias.detach().clone())

    def forward(self, decoder_input_ids: Any, encoder_hidden_states: Any, encoder_attention_mask: Any) -> Any:
        hidden = self.decoder(
            input_ids=decoder_input_ids,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            use_cache=False,
        ).last_hidden_state
        return self.lm_head(hidden) + self.final_logits_bias


class EncoderWithCrossCache(nn.Module):
    """input_ids, attention_mask -> last_hidden_state, cross_key_0, cross_value_0, cross_key_1, ...

    The cross-attention keys and values depend only on the encoder states, so they are computed here, once
    per sentence, instead of at every decoding step.
    """

    def __init__(self, model: Any):
        super().__init__()
        self.encoder = model.get_encoder()
        self.decoder_layers = model.get_decoder().layers
        self.head_dim = model.config.d_model // model.config.decoder_attention_heads

    def forward(self, input_ids: Any, attention_mask: Any) -> tuple[Any, ...]:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        cross_cache = []
        for layer in self.decoder_layers:
            cross_cache.append(split_heads(layer.encoder_attn.k_proj(hidden), self.head_dim))
            cross_cache.append(split_heads(layer.encoder_attn.v_proj(hidden), self.head_dim))
        return (hidden, *cross_cache)


class CachedDecoder(nn.Module):
    """One decoder pass over `new_len` tokens that follow `past_len` cached ones -> logits and extended cache.

    The Marian decoder layer, post-norm, written out over the model's modules: self-attention over
    cache + new tokens (causal), cross-attention over the precomputed encoder keys/values (source padding
    masked), feed-forward. Equal to MarianMTModel's decoder within float rounding (the parity gate checks it).

    Rows are sentences x group: decoder_input_ids and the self cache have a row per hypothesis (sentence s,
    beam b at row s * group + b), encoder_attention_mask and the cross cache a row per sentence; group is
    rows / sentences (1 without beams).
    """

    def __init__(self, model: Any, candidates: int):
        super().__init__()
        decoder = model.get_decoder()
        self.candidates = min(candidates, model.config.vocab_size)
        self.embed_tokens = decoder.embed_tokens
        self.embed_scale = decoder.embed_scale
        self.embed_positions = decoder.embed_positions
        self.layers = decoder.layers
        # The output projection as its own (d_model, vocab) weight, not the embedding matrix it is tied to:
        # a weight used by Gather and, transposed, by MatMul is not quantised for the MatMul (the int8 graph
        # would dequantise the whole matrix at every step), and the MatMul gets it in the layout it reads.
        self.output_projection = nn.Parameter(model.lm_head.weight.detach().t().contiguous(), requires_grad=False)
        self.register_buffer("final_logits_bias", model.final_logits_bias.detach().clone())
        self.head_dim = model.config.d_model // model.config.decoder_attention_heads

    def forward(
        self,
        decoder_input_ids: Any,
        encoder_attention_mask: Any,
        cache_rows: Any,
        self_cache: list[Any],
        cross_cache: list[Any],
    ) -> tuple[Any, ...]:
        """cache_rows: (rows,) the row of self_cache each row continues from (a beam search's reordering);
        self_cache/cross_cache: [key_0, value_0, key_1, ...] -> logits, next_log_probs, next_ids, *present."""
        past_len, new_len = self_cache[0].shape[2], decoder_input_ids.shape[1]
        positions = torch.arange(new_len, device=decoder_input_ids.device) + past_len
        hidden = self.embed_tokens(decoder_input_ids) * self.embed_scale
        hidden = hidden + self.embed_positions.weight[positions]
        lowest = torch.finfo(hidden.dtype).min
        # New token i (at position past_len + i) sees cached and new tokens up to its own position.
        key_positions = torch.arange(past_len + new_len, device=decoder_input_ids.device)
        future = key_positions[None, :] > positions[:, None]
        self_bias = torch.zeros(future.shape, dtype=hidden.dtype, device=hidden.device).masked_fill(future, lowest)
        cross_bias = (1.0 - encoder_attention_mask[:, None, None, :].to(hidden.dtype)) * lowest

        present = []
        for i, layer in enumerate(self.layers):
            attention = layer.self_attn
            past_keys, past_values = (self_cache[2 * i + j].index_select(0, cache_rows) for j in (0, 1))
            keys = torch.cat([past_keys, split_heads(attention.k_proj(hidden), self.head_dim)], dim=2)
            values = torch.cat([past_values, split_heads(attention.v_proj(hidden), self.head_dim)], dim=2)
            present += [keys, values]
            hidden = layer.self_attn_layer_norm(
                hidden + attend(attention, hidden, keys, values, self_bias, self.head_dim)
            )
            hidden = layer.encoder_attn_layer_norm(
                hidden + attend_by_sentence(layer.encoder_attn, hidden, cross_cache[2 * i],
                                            cross_cache[2 * i + 1], cross_bias, self.head_dim)
            )
            hidden = layer.final_layer_norm(hidden + layer.fc2(layer.activation_fn(layer.fc1(hidden))))
        logits = torch.matmul(hidden, self.output_projection) + self.final_logits_bias
        # The scores transformers' beam search uses: log-softmax over the whole vocabulary (<pad> included).
        # Ranked at every position and the last one's kept: a search step feeds one position, and picking it
        # out of the logits first would copy them (ONNX Gather) at every step.
        next_log_probs, next_ids = torch.topk(torch.log_softmax(logits, dim=-1), self.candidates, dim=-1)
        next_log_probs, next_ids = next_log_probs[:, -1], next_ids[:, -1]
        return (logits, next_log_probs, next_ids, *present)


def export_wrappers(model: Any, beam: int = 4) -> tuple[EncoderWithCrossCache, CachedDecoder]:
    """(EncoderWithCrossCache, CachedDecoder) around a loaded model, in eval mode: the ONNX graphs' modules.

    The decoder returns the next-token candidates a beam of width `beam` needs."""
    return EncoderWithCrossCache(model).eval(), CachedDecoder(model, candidates_for_beam(beam)).eval()


def legacy_wrappers(model: Any) -> tuple[EncoderForExport, DecoderForExport]:
    """(EncoderForExport, DecoderForExport): the uncached modules traced to TorchScript."""
    return EncoderForExport(model).eval(), DecoderForExport(model).eval()


def empty_cache(model: Any, rows: int) -> list[torch.Tensor]:
    """Per-layer (rows, heads, 0, head_dim) keys and values: what the first decoding step is given."""
    model_config = model.config
    heads = model_config.decoder_attention_heads
    return [torch.zeros(rows, heads, 0, model_config.d_model // heads) for _ in range(2 * model_config.decoder_layers)]
