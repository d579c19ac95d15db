"""The published checkpoint a `model.init: pretrained` run fine-tuned, as its card describes it: the family
(pipeline/runtime/families.py, from models/final's config.json and tokenizer_config.json), the architecture its
config.json gives, and the language code each of the run's languages has in its tokenizer (languages.json, which the
tokenize stage wrote and train copied into models/final).

How a user asks such a model for a language differs by family, and the card's usage snippets say it the family's
way:

    family            transformers                                        CTranslate2
    marian            the target's code as text in front of the source    the same, in the source tokens
                      (multi-target checkpoints only)
    mbart50, nllb     tokenizer src_lang=en_XX, generate(forced_bos_token_id=de_DE's id)
                                                                          target_prefix=[["de_DE"]]
    m2m100            as mbart50, but src_lang is the bare code (en), the token is __en__
    mbart (cc25)      decoding starts from the code: generate(decoder_start_token_id=de_DE's id)
                                                                          target_prefix=[["de_DE"]]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.artifacts import read_json
from pipeline.runtime.families import Family
from pipeline.runtime.model_languages import ModelLanguages


@dataclass(frozen=True)
class PretrainedCheckpoint:
    family: Family
    config: dict[str, Any]  # models/final/config.json
    tokenizer_class: str
    codes: dict[str, str]  # ISO code -> the tokenizer's code, for every language of the directions

    @property
    def model_class(self) -> str:
        """The transformers class the weights load as (config.json's architectures)."""
        return (self.config.get("architectures") or [self.family.model_type])[0]

    def architecture(self) -> str:
        """`mbart50 (model_type mbart): d_model 1024, 12+12 layers, 16 heads, FFN 4096, dropout 0.1`; a size that
        differs between encoder and decoder shows as encoder/decoder."""
        c = self.config

        def pair(encoder: str, decoder: str) -> str:
            e, d = c.get(encoder), c.get(decoder)
            return f"{e}" if e == d else f"{e}/{d}"

        return (f"{self.family.name} (model_type {self.family.model_type}): d_model {c.get('d_model')}, "
                f"{c.get('encoder_layers')}+{c.get('decoder_layers')} layers, "
                f"{pair('encoder_attention_heads', 'decoder_attention_heads')} heads, "
                f"FFN {pair('encoder_ffn_dim', 'decoder_ffn_dim')}, dropout {c.get('dropout')}")

    def vocabulary(self) -> str:
        codes = ", ".join(f"{lang} {code}" for lang, code in self.codes.items())
        tied = ", embeddings tied to the output projection" if self.config.get("tie_word_embeddings", True) else ""
        return (f"{self.config.get('vocab_size')} tokens, the checkpoint's own {self.tokenizer_class}{tied}; "
                f"language codes: {codes or 'none (one direction)'}")

    def src_lang(self, lang: str) -> str:
        """The tokenizer's `src_lang` value for `lang` (M2M100Tokenizer takes the bare code, `en` for `__en__`)."""
        code = self.codes[lang]
        return code.strip("_") if self.family.name == "m2m100" else code

    def generate_argument(self) -> str:
        """The `generate` keyword that makes the decoder produce the target language: mBART-cc25 starts decoding
        from the code, the others start from </s> and are forced to the code next."""
        return "decoder_start_token_id" if self.family.name == "mbart" else "forced_bos_token_id"


def read_checkpoint(final_model: Path, languages: ModelLanguages) -> PretrainedCheckpoint:
    """The fine-tuned checkpoint in `final_model`, of the family and codes its languages.json records."""
    tokenizer_class = read_json(final_model / "tokenizer_config.json").get("tokenizer_class")
    return PretrainedCheckpoint(family=languages.family, config=read_json(final_model / "config.json"),
                                tokenizer_class=tokenizer_class, codes=dict(languages.codes))
