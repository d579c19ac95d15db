"""The modules the export traces, and the batch it traces them on: the model's encoder and decoder as graphs with
plain tensor inputs and outputs. The cached decoder is written over the model's own layers (projections, layer norms,
feed-forward), not over transformers' Cache objects (whose argument was renamed from `past_key_values` to `cache` in
transformers 5): plain tensors export cleanly and do not move with that API; the encoder is the model's own module (it
needs no cache). The three architectures the pipeline fine-tunes differ in their decoders in two places only, each one
small module below, chosen by config.json's model_type (DECODER_ARCHITECTURES); the output projection adds
`final_logits_bias` where the model has one (Marian, mBART; M2M-100 has none). Graph names and the cache layout are
pipeline/runtime/export_format.py's. Importing this module imports torch: only the export stage's torch-side modules
and the tests import it.

    EncoderWithCrossCache  input_ids, attention_mask -> last_hidden_state, cross_key_0, cross_value_0, ...
    CachedDecoder          decoder_input_ids, encoder_attention_mask, cache_rows, self cache, cross cache
                           -> logits, next_log_probs, next_ids, present self cache
    ShortlistedDecoder     the same with each sentence's shortlist and its projection columns after cache_rows
                           -> next_log_probs, next_ids, present self cache
    EncoderForExport,      the legacy, uncached TorchScript graphs
    DecoderForExport
    example_inputs         the batch both exporters trace them on

    model_type  input embedding                                        layers      after the last layer
    marian      tokens x embed_scale + sinusoidal table[position]      post-norm   -
    mbart       layernorm_embedding(tokens + learned[position + 2])    pre-norm    layer_norm
    m2m_100     tokens + sinusoidal table[position + padding_idx + 1]  pre-norm    layer_norm

(mBART's and M2M-100's token embeddings scale themselves: transformers' *ScaledWordEmbedding.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.runtime.decoding import pad_batch
from pipeline.runtime.export_format import candidates_for_beam
from pipeline.runtime.families import UnsupportedCheckpoint
from pipeline.runtime.model_languages import DirectionLayout


def split_heads(states: Any, head_dim: int) -> Any:
    """(batch, length, d_model) -> (batch, heads, length, head_dim)."""
    batch, length, _ = states.shape
    return states.view(batch, length, -1, head_dim).transpose(1, 2)


def attend(attention: Any, hidden: Any, keys: Any, values: Any, bias: Any, head_dim: int) -> Any:
    """The attention module's output for queries from `hidden` over given keys/values, with an additive mask."""
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


def self_attend(attention: Any, hidden: Any, past_keys: Any, past_values: Any, bias: Any, head_dim: int
                ) -> tuple[Any, Any, Any]:
    """Causal self-attention of the new tokens over the cached ones and themselves -> (output, keys, values), the
    keys and values being the cache extended by the new tokens'."""
    keys = torch.cat([past_keys, split_heads(attention.k_proj(hidden), head_dim)], dim=2)
    values = torch.cat([past_values, split_heads(attention.v_proj(hidden), head_dim)], dim=2)
    return attend(attention, hidden, keys, values, bias, head_dim), keys, values


def feed_forward(layer: Any, hidden: Any) -> Any:
    return layer.fc2(layer.activation_fn(layer.fc1(hidden)))


def output_bias(model: Any) -> torch.Tensor | None:
    """A copy of the model's `final_logits_bias` (added to lm_head's output by Marian and mBART), or None."""
    bias = getattr(model, "final_logits_bias", None)
    return None if bias is None else bias.detach().clone()


# --------------------------------------------------------------------------------------------------- embeddings


def _self_scaling_tokens(decoder: Any) -> nn.Module:
    """The decoder's token embedding, which must apply embed_scale itself (transformers' *ScaledWordEmbedding):
    a version where the decoder scales instead would otherwise be exported unscaled."""
    tokens = decoder.embed_tokens
    if not hasattr(tokens, "embed_scale"):
        raise UnsupportedCheckpoint(
            f"{type(decoder).__name__}.embed_tokens is a {type(tokens).__name__} without embed_scale: this "
            "transformers version scales the embeddings elsewhere, which stages/export/wrappers.py does not follow")
    return tokens


class MarianEmbedding(nn.Module):
    """Marian: the token embeddings times the decoder's embed_scale, plus a sinusoidal table indexed by position."""

    def __init__(self, decoder: Any, max_positions: int):
        super().__init__()
        self.embed_tokens = decoder.embed_tokens
        self.embed_scale = decoder.embed_scale
        self.embed_positions = decoder.embed_positions

    def forward(self, decoder_input_ids: Any, positions: Any) -> Any:
        hidden = self.embed_tokens(decoder_input_ids) * self.embed_scale
        return hidden + self.embed_positions.weight[positions]


class MBartEmbedding(nn.Module):
    """mBART: the (self-scaling) token embeddings plus learned positions, which its table keeps `offset` (2) rows
    down, then layernorm_embedding."""

    def __init__(self, decoder: Any, max_positions: int):
        super().__init__()
        self.embed_tokens = _self_scaling_tokens(decoder)
        self.embed_positions = decoder.embed_positions
        self.offset = int(decoder.embed_positions.offset)
        self.layernorm_embedding = decoder.layernorm_embedding

    def forward(self, decoder_input_ids: Any, positions: Any) -> Any:
        hidden = self.embed_tokens(decoder_input_ids) + self.embed_positions.weight[positions + self.offset]
        return self.layernorm_embedding(hidden)


class M2M100Embedding(nn.Module):
    """M2M-100 and NLLB: the (self-scaling) token embeddings plus fairseq's sinusoidal positions, which number
    tokens from padding_idx + 1 (the table's row padding_idx, zero, is what transformers gives <pad> tokens).

    Decoder inputs here never hold <pad> before a real token (batches are right-padded, and decoding never emits
    it), so a token's position is its index: the cumulative count of non-pad tokens transformers computes is the
    same number.
    """

    def __init__(self, decoder: Any, max_positions: int):
        super().__init__()
        self.embed_tokens = _self_scaling_tokens(decoder)
        positions = decoder.embed_positions
        self.first_position = int(positions.padding_idx) + 1
        rows = self.first_position + max_positions
        # The model's table (a non-persistent buffer, rebuilt at load) covers max_positions + 2 rows; transformers
        # grows it on the fly for a longer input, which a graph cannot, so it is built as long as needed here.
        table = positions.weights
        if table.shape[0] < rows:
            table = positions.get_embedding(rows, positions.embedding_dim, positions.padding_idx)
        self.register_buffer("position_table", table.detach().clone())

    def forward(self, decoder_input_ids: Any, positions: Any) -> Any:
        return self.embed_tokens(decoder_input_ids) + self.position_table[positions + self.first_position]


# --------------------------------------------------------------------------------------------------- layers


class DecoderLayer(nn.Module):
    """One of the model's decoder layers, run over plain tensors; its subclasses order the norms."""

    def __init__(self, layer: Any, head_dim: int):
        super().__init__()
        self.layer = layer
        self.head_dim = head_dim


class PostNormLayer(DecoderLayer):
    """A Marian decoder layer: each sub-layer's residual sum, then its layer norm."""

    def forward(self, hidden: Any, past_keys: Any, past_values: Any, self_bias: Any, cross_keys: Any,
                cross_values: Any, cross_bias: Any) -> tuple[Any, Any, Any]:
        layer = self.layer
        out, keys, values = self_attend(layer.self_attn, hidden, past_keys, past_values, self_bias, self.head_dim)
        hidden = layer.self_attn_layer_norm(hidden + out)
        hidden = layer.encoder_attn_layer_norm(
            hidden + attend_by_sentence(layer.encoder_attn, hidden, cross_keys, cross_values, cross_bias,
                                        self.head_dim)
        )
        hidden = layer.final_layer_norm(hidden + feed_forward(layer, hidden))
        return hidden, keys, values


class PreNormLayer(DecoderLayer):
    """An mBART or M2M-100 decoder layer: each sub-layer reads its layer norm's output and adds to the residual."""

    def forward(self, hidden: Any, past_keys: Any, past_values: Any, self_bias: Any, cross_keys: Any,
                cross_values: Any, cross_bias: Any) -> tuple[Any, Any, Any]:
        layer = self.layer
        out, keys, values = self_attend(layer.self_attn, layer.self_attn_layer_norm(hidden), past_keys, past_values,
                                        self_bias, self.head_dim)
        hidden = hidden + out
        hidden = hidden + attend_by_sentence(layer.encoder_attn, layer.encoder_attn_layer_norm(hidden), cross_keys,
                                             cross_values, cross_bias, self.head_dim)
        hidden = hidden + feed_forward(layer, layer.final_layer_norm(hidden))
        return hidden, keys, values


def no_final_norm(decoder: Any) -> nn.Module:
    return nn.Identity()


def final_layer_norm(decoder: Any) -> nn.Module:
    """The layer norm a pre-norm decoder applies after its last layer."""
    return decoder.layer_norm


@dataclass(frozen=True)
class DecoderArchitecture:
    """Where a family's decoder differs from the others: its input embedding (built from the decoder and the
    model's max positions), its layers' norm placement, and what follows the last layer."""

    embedding: Callable[[Any, int], nn.Module]
    layer: Callable[[Any, int], nn.Module]
    final_norm: Callable[[Any], nn.Module]


DECODER_ARCHITECTURES = {
    "marian": DecoderArchitecture(MarianEmbedding, PostNormLayer, no_final_norm),
    "mbart": DecoderArchitecture(MBartEmbedding, PreNormLayer, final_layer_norm),
    "m2m_100": DecoderArchitecture(M2M100Embedding, PreNormLayer, final_layer_norm),
}


def decoder_architecture(model_config: Any) -> DecoderArchitecture:
    """The architecture of a transformers model config's decoder; UnsupportedCheckpoint naming the ones the
    export writes graphs for otherwise."""
    model_type = getattr(model_config, "model_type", None)
    if model_type not in DECODER_ARCHITECTURES:
        raise UnsupportedCheckpoint(f"model_type {model_type!r}: the export writes cached decoders for "
                                    f"{', '.join(DECODER_ARCHITECTURES)} only")
    return DECODER_ARCHITECTURES[model_type]


# --------------------------------------------------------------------------------------------------- the graphs


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
        # Marian and mBART add a bias buffer outside lm_head, as their forward does.
        self.register_buffer("final_logits_bias", output_bias(model))

    def forward(self, decoder_input_ids: Any, encoder_hidden_states: Any, encoder_attention_mask: Any) -> Any:
        hidden = self.decoder(
            input_ids=decoder_input_ids,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            use_cache=False,
        ).last_hidden_state
        logits = self.lm_head(hidden)
        return logits if self.final_logits_bias is None else logits + self.final_logits_bias


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

    The model's decoder written out over its own modules, in its family's architecture (DECODER_ARCHITECTURES):
    the input embedding at positions past_len ..., then per layer self-attention over cache + new tokens
    (causal), cross-attention over the precomputed encoder keys/values (source padding masked) and feed-forward,
    then the output projection. Equal to the transformers decoder within float rounding (the parity gate checks
    it). The first call of a search may feed a whole decoder prefix (</s> de_DE) with an empty cache.

    Rows are sentences x group: decoder_input_ids and the self cache have a row per hypothesis (sentence s,
    beam b at row s * group + b), encoder_attention_mask and the cross cache a row per sentence; group is
    rows / sentences (1 without beams).
    """

    def __init__(self, model: Any, candidates: int):
        super().__init__()
        model_config = model.config
        architecture = decoder_architecture(model_config)
        decoder = model.get_decoder()
        self.candidates = min(candidates, model_config.vocab_size)
        head_dim = model_config.d_model // model_config.decoder_attention_heads
        self.embedding = architecture.embedding(decoder, model_config.max_position_embeddings)
        self.layers = nn.ModuleList(architecture.layer(layer, head_dim) for layer in decoder.layers)
        self.final_norm = architecture.final_norm(decoder)
        # The output projection as its own (d_model, vocab) weight, not the embedding matrix it is tied to:
        # a weight used by Gather and, transposed, by MatMul is not quantised for the MatMul (the int8 graph
        # would dequantise the whole matrix at every step), and the MatMul gets it in the layout it reads.
        self.output_projection = nn.Parameter(model.lm_head.weight.detach().t().contiguous(), requires_grad=False)
        self.register_buffer("final_logits_bias", output_bias(model))

    def hidden_states(self, decoder_input_ids: Any, encoder_attention_mask: Any, cache_rows: Any,
                      self_cache: list[Any], cross_cache: list[Any]) -> tuple[Any, list[Any]]:
        """The last layer's (normed) states of the new tokens, and the extended self cache."""
        past_len, new_len = self_cache[0].shape[2], decoder_input_ids.shape[1]
        positions = torch.arange(new_len, device=decoder_input_ids.device) + past_len
        hidden = self.embedding(decoder_input_ids, positions)
        lowest = torch.finfo(hidden.dtype).min
        # New token i (at position past_len + i) sees cached and new tokens up to its own position.
        key_positions = torch.arange(past_len + new_len, device=decoder_input_ids.device)
        future = key_positions[None, :] > positions[:, None]
        self_bias = torch.zeros(future.shape, dtype=hidden.dtype, device=hidden.device).masked_fill(future, lowest)
        cross_bias = (1.0 - encoder_attention_mask[:, None, None, :].to(hidden.dtype)) * lowest

        present = []
        for i, layer in enumerate(self.layers):
            past_keys, past_values = (self_cache[2 * i + j].index_select(0, cache_rows) for j in (0, 1))
            hidden, keys, values = layer(hidden, past_keys, past_values, self_bias, cross_cache[2 * i],
                                         cross_cache[2 * i + 1], cross_bias)
            present += [keys, values]
        return self.final_norm(hidden), present

    def project(self, hidden: Any) -> Any:
        """The logits over the whole vocabulary."""
        logits = torch.matmul(hidden, self.output_projection)
        return logits if self.final_logits_bias is None else logits + self.final_logits_bias

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
        hidden, present = self.hidden_states(decoder_input_ids, encoder_attention_mask, cache_rows, self_cache,
                                             cross_cache)
        logits = self.project(hidden)
        # The scores transformers' beam search uses: log-softmax over the whole vocabulary (<pad> included).
        # Ranked at every position and the last one's kept: a search step feeds one position, and picking it
        # out of the logits first would copy them (ONNX Gather) at every step.
        next_log_probs, next_ids = torch.topk(torch.log_softmax(logits, dim=-1), self.candidates, dim=-1)
        next_log_probs, next_ids = next_log_probs[:, -1], next_ids[:, -1]
        return (logits, next_log_probs, next_ids, *present)


class ShortlistedDecoder(CachedDecoder):
    """The cached decoder ranking each row's next token among its sentence's shortlist only
    (pipeline/runtime/shortlist.py): `shortlist` (sentences, width) holds target ids, <pad> where a sentence's list
    is shorter, which is never ranked; `shortlist_projection` (sentences, d_model, width) the output projection's
    columns of those ids, which the runtime gathers once per batch (fp32 here; int8 in the int8 graph,
    stages/export/shortlist_projection.py).

    A row's logits are its sentence's columns only, and its log-probabilities are normalised over them (<pad>
    left out), as Marian's shortlists and CTranslate2's vocabulary maps normalise over theirs: the whole-vocabulary
    normaliser would need the whole projection, which is most of a small student's step (bench/README.md). The
    columns are the sentence's own, not the batch's union, so a translation does not depend on its batch. Only
    the last position is projected: no `logits` output.
    """

    def __init__(self, model: Any, candidates: int):
        super().__init__(model, candidates)
        del self.output_projection  # an input of this graph, not a weight
        self.pad_id = int(model.config.pad_token_id)
        # (vocab,), gathered per sentence; none where it is zero (the models trained here), which saves two ops.
        bias = None if self.final_logits_bias is None else self.final_logits_bias.reshape(-1)
        self.final_logits_bias = bias if bias is not None and bool(bias.any()) else None

    def forward(self, decoder_input_ids: Any, encoder_attention_mask: Any, cache_rows: Any, shortlist: Any,
                shortlist_projection: Any, self_cache: list[Any], cross_cache: list[Any]) -> tuple[Any, ...]:
        """As CachedDecoder's, with the sentences' shortlists and their projection columns -> next_log_probs,
        next_ids, *present."""
        hidden, present = self.hidden_states(decoder_input_ids, encoder_attention_mask, cache_rows, self_cache,
                                             cross_cache)
        sentences = shortlist.shape[0]
        by_sentence = hidden[:, -1].reshape(sentences, -1, hidden.shape[-1])  # (sentences, group, d_model)
        logits = torch.matmul(by_sentence, shortlist_projection)  # (sentences, group, width)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias[shortlist][:, None, :]
        logits = logits.masked_fill((shortlist == self.pad_id)[:, None, :], torch.finfo(logits.dtype).min)
        next_log_probs, best = torch.topk(torch.log_softmax(logits, dim=-1), self.candidates, dim=-1)
        next_ids = torch.gather(shortlist[:, None, :].expand(-1, best.shape[1], -1), 2, best)
        return (next_log_probs.reshape(-1, self.candidates), next_ids.reshape(-1, self.candidates), *present)


def export_wrappers(model: Any, beam: int = 4) -> tuple[EncoderWithCrossCache, CachedDecoder]:
    """(EncoderWithCrossCache, CachedDecoder) around a loaded model, in eval mode: the ONNX graphs' modules.

    The decoder returns the next-token candidates a beam of width `beam` needs."""
    return EncoderWithCrossCache(model).eval(), CachedDecoder(model, candidates_for_beam(beam)).eval()


def shortlisted_decoder(model: Any, beam: int = 4) -> ShortlistedDecoder:
    """The shortlisted decoder graph's module, in eval mode."""
    return ShortlistedDecoder(model, candidates_for_beam(beam)).eval()


def legacy_wrappers(model: Any) -> tuple[EncoderForExport, DecoderForExport]:
    """(EncoderForExport, DecoderForExport): the uncached modules traced to TorchScript."""
    return EncoderForExport(model).eval(), DecoderForExport(model).eval()


def empty_cache(model: Any, rows: int) -> list[torch.Tensor]:
    """Per-layer (rows, heads, 0, head_dim) keys and values: what the first decoding step is given."""
    model_config = model.config
    heads = model_config.decoder_attention_heads
    return [torch.zeros(rows, heads, 0, model_config.d_model // heads) for _ in range(2 * model_config.decoder_layers)]


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
