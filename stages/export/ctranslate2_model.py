"""The CTranslate2 model directory (`export.ctranslate2`, the optional `ct2` dependencies): converting the trained
model with CTranslate2's TransformersConverter (Marian, mBART, M2M-100/NLLB), and decoding with it the way the other
runtimes' outputs are compared. Decoding starts from the direction's decoder prefix
(pipeline/runtime/model_languages.py), as every runtime's does: CTranslate2 puts its own start token in front of
`target_prefix` when its config names one, so it is given the target's prefix (mBART-50, M2M-100, NLLB: the target's
code; Marian: nothing, its `>>fr<<` tag is a source token); when its config names none (mBART-cc25), it is given the
whole prefix. Its hypotheses begin with the prefix it was given, which is dropped, so they compare with the others'
(what follows the prefix).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.artifacts import read_json
from pipeline.errors import OptionalDependencyMissing
from pipeline.runtime.families import checkpoint_kind
from pipeline.runtime.model_languages import DirectionLayout
from pipeline.runtime.text_pieces import TARGET_VOCAB, TOKENIZER_CONFIG

log = logging.getLogger("mtpipe.export")


def _missing() -> OptionalDependencyMissing:
    return OptionalDependencyMissing("ctranslate2", "export.ctranslate2 is true", "pip install 'mtpipe[ct2]'")


def require_ctranslate2() -> None:
    """Raise OptionalDependencyMissing, naming the extra, unless ctranslate2 is installed (checked without
    importing it, so the stage fails before minutes of export, not after)."""
    if importlib.util.find_spec("ctranslate2") is None:
        raise _missing()


def _stated_converter(final_model: Path) -> Any:
    """A TransformersConverter of `final_model` that first writes onto the loaded model's config what its
    loaders read from the config and transformers 5 no longer keeps there: that mBART's layers are pre-norm with a
    layernorm_embedding (transformers 5 dropped `normalize_before`/`normalize_embedding` from MBartConfig), and
    which tokenizer the checkpoint has (config `tokenizer_class`, unset in a checkpoint saved by save_pretrained), by
    which it tells mBART-cc25, decoded from the target's code, from mBART-50, decoded from </s>."""
    from ctranslate2.converters import TransformersConverter

    _, tokenizer_class = checkpoint_kind(final_model)

    class _StatedConverter(TransformersConverter):
        bos_token_id: int | None = None

        def load_model(self, model_class: Any, model_name_or_path: str, **kwargs: Any) -> Any:
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            config = model.config
            if config.model_type == "mbart":
                decoder = model.get_decoder()
                config.normalize_before = True  # MBartDecoderLayer normalises before each sub-layer
                config.normalize_embedding = hasattr(decoder, "layernorm_embedding")
            if getattr(config, "tokenizer_class", None) is None:
                config.tokenizer_class = tokenizer_class
            self.bos_token_id = config.bos_token_id
            return model

        def load_tokenizer(self, tokenizer_class: Any, model_name_or_path: str, **kwargs: Any) -> Any:
            tokenizer = super().load_tokenizer(tokenizer_class, model_name_or_path, **kwargs)
            # CTranslate2 cannot load a model whose config's bos_token is null, and transformers 5's
            # MBart50Tokenizer has none: name fairseq's <s>, the model config's bos or else the tokenizer's cls
            # (which CTranslate2 uses only to add it to sources, which it does not here).
            if tokenizer.bos_token is None:
                bos = self.bos_token_id
                tokenizer.bos_token = tokenizer.cls_token if bos is None else tokenizer.convert_ids_to_tokens(bos)
            return tokenizer

    return _StatedConverter(str(final_model))


def convert_ctranslate2(final_model: Path, out: Path, quantization: str) -> float:
    """A CTranslate2 model directory `out` converted from the save_pretrained directory; returns seconds."""
    try:
        converter = _stated_converter(final_model)
    except ImportError:
        raise _missing() from None
    log.info("converting to CTranslate2 (%s)", quantization)
    start = time.perf_counter()
    converter.convert(str(out), quantization=quantization)
    split_vocabularies(final_model, out)
    return round(time.perf_counter() - start, 2)


def split_vocabularies(final_model: Path, out: Path) -> None:
    """Give a converted Marian model with separate vocabularies (`separate_vocabs`, as `tokenize.joint: false`
    saves it: vocab.json the source side's, target_vocab.json the target side's) CTranslate2's
    source_vocabulary.json and target_vocabulary.json: its converter registers the tokenizer's get_vocab() (the
    source side) as both, so the decoder's outputs would read as the source pieces at the target ids. Marian's
    <pad> (the last id) is left out, as the converter leaves it out."""
    if not read_json(final_model / TOKENIZER_CONFIG).get("separate_vocabs"):
        return
    shared = out / "shared_vocabulary.json"
    size = len(read_json(shared))
    for side, name in (("source", "vocab.json"), ("target", TARGET_VOCAB)):
        vocab = read_json(final_model / name)
        tokens = sorted(vocab, key=vocab.__getitem__)[:size]
        (out / f"{side}_vocabulary.json").write_text(json.dumps(tokens, ensure_ascii=False, indent=2),
                                                     encoding="utf-8")
    shared.unlink()


def start_row_norm(model: Any, pad_id: int) -> float | None:
    """The norm of the <pad> embedding row a Marian model's decoder starts from, which CTranslate2 replaces with a
    zero vector (the largest over its decoder and encoder matrices when they are separate); None for the families
    that start from another token (their rows convert as they are).

    CTranslate2's converter drops the last embedding row (<pad>) and its decoder starts from a zero vector where
    transformers' Marian starts from the <pad> embedding; the two agree because that row is zero in converted
    OPUS-MT checkpoints and training keeps it so (stages/train/model.py zero_start_rows). A model whose row is not
    zero fails the parity gate, and this norm lets the failure say why."""
    if model.config.model_type != "marian":
        return None
    matrices = (model.get_input_embeddings().weight, model.get_decoder().embed_tokens.weight)
    return max(float(weight.detach()[pad_id].norm()) for weight in matrices)


def starts_itself(model_dir: Path) -> bool:
    """Whether a CTranslate2 model directory's decoder puts its own start token in front of the target prefix
    (its config.json names a `decoder_start_token`)."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    return config.get("decoder_start_token") is not None


def target_prefix(layout: DirectionLayout, tokenizer: Any, own_start: bool) -> list[str]:
    """The tokens CTranslate2 is given as a direction's target_prefix: its decoder prefix without the start token
    when CTranslate2 adds its own (`own_start`, see starts_itself), the whole prefix otherwise."""
    ids = layout.target_prefix if own_start else layout.decoder_prefix
    return tokenizer.convert_ids_to_tokens(list(ids))


def max_decoding_length(output_limit: int) -> int:
    """CTranslate2's max_decoding_length for a pipeline.runtime.decoding.output_limit: the limit counts a forced </s>,
    CTranslate2 stops after max_decoding_length tokens without one."""
    return max(output_limit - 1, 1)


def prefix_shown(prefix: Sequence[str], own_start: bool) -> int:
    """How many tokens CTranslate2's hypotheses begin with, given `prefix` as target_prefix (target_prefix()): every
    prefix token when it adds its own start token (`own_start`), all but the first otherwise (it decodes from that
    one). They count towards max_decoding_length, and are dropped to compare with the other runtimes' outputs."""
    return len(prefix) if own_start else max(len(prefix) - 1, 0)


def search_options(prefix: Sequence[str], own_start: bool, output_limit: int, sentences: int) -> dict[str, Any]:
    """translate_batch's options that make CTranslate2 search what the runtime (pipeline/runtime/beam_search.py) and
    transformers' generate search, for `sentences` sources decoded after `prefix` with `output_limit`
    (pipeline.runtime.decoding.output_limit): the same length limit, and </s> allowed as the first token, as
    they allow it (CTranslate2's default min_decoding_length is 1: it would give a token where they give an empty
    translation). Its length penalty needs nothing: it scores sum(log p) / length ** length_penalty with the
    length counting </s>, as they do (tests/e2e/test_export_ctranslate2_search.py)."""
    options: dict[str, Any] = {"target_prefix": [list(prefix)] * sentences} if prefix else {}
    shown = prefix_shown(prefix, own_start)
    return {**options, "max_decoding_length": max_decoding_length(output_limit) + shown, "min_decoding_length": 0}


def greedy_ids(translator: Any, tokenizer: Any, sources: list[list[int]], prefix: Sequence[str], own_start: bool,
               output_limit: int, eos_id: int) -> list[list[int]]:
    """CTranslate2 greedy outputs after the decoder prefix, as ids ending in </s>, like the other runtimes'.

    `prefix` is the target_prefix (target_prefix()); the prefix tokens its hypotheses begin with (prefix_shown) are
    dropped here. It returns no end token."""
    source_tokens, target_ids = token_maps(tokenizer)
    tokens = [source_tokens(s) for s in sources]
    shown = prefix_shown(prefix, own_start)
    results = translator.translate_batch(tokens, beam_size=1,
                                         **search_options(prefix, own_start, output_limit, len(tokens)))
    return [target_ids(r.hypotheses[0][shown:]) + [eos_id] for r in results]


def token_maps(tokenizer: Any) -> tuple[Callable[[list[int]], list[str]], Callable[[list[str]], list[int]]]:
    """(source ids -> tokens, target tokens -> ids) of a transformers tokenizer. A Marian tokenizer with separate
    vocabularies maps every id to a target piece and every piece to a source id (outside its target mode), so
    each side is read from its own vocabulary there."""
    if not getattr(tokenizer, "separate_vocabs", False):
        return tokenizer.convert_ids_to_tokens, tokenizer.convert_tokens_to_ids
    source_pieces = {i: piece for piece, i in tokenizer.encoder.items()}
    target, unk = tokenizer.target_encoder, tokenizer.target_encoder[tokenizer.unk_token]
    return (lambda ids: [source_pieces[i] for i in ids]), (lambda tokens: [target.get(t, unk) for t in tokens])
