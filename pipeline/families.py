"""The families of published checkpoints the pipeline fine-tunes, and how each one names its languages.

    family   model_type  tokenizer         codes                 where the tokenizer puts them
    marian   marian      MarianTokenizer   >>de<< or >>deu<<     multi-target checkpoints only: the target's tag
                                                                 in front of the source text (OPUS-MT)
    mbart    mbart       MBartTokenizer    en_XX, de_DE          source X </s> en_XX; labels X </s> de_DE
                                                                 (mBART-cc25: decoding starts from de_DE)
    mbart50  mbart       MBart50Tokenizer  en_XX, de_DE          source en_XX X </s>; labels de_DE X </s>
    m2m100   m2m_100     M2M100Tokenizer   __en__, __de__        as mbart50
    nllb     m2m_100     NllbTokenizer     eng_Latn, deu_Latn    as mbart50

A family is what the tokenizer class says (config.json's model_type alone does not tell mBART-50 from mBART, or
NLLB from M2M-100); the architecture (model_type) must be one of the three the export writes graphs for. The
code of each language comes from the directions' ISO 639-1 codes through a built-in map (`model.language_codes`
overrides it per language), and must be one of the tokenizer's own codes: a clear error lists them otherwise.

Where the codes land in the ids (source prefix and suffix, label prefix, the decoder's start) is not written down
here: the tokenize stage asks the tokenizer itself and records the answer per direction
(pipeline/sequence_layout.py), so every later stage places them exactly as the family does.

Stdlib only: params checks, the CLI and `mtpipe translate` import it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError

# ISO 639-1 -> 639-3 (the three-letter codes of NLLB and of the newer OPUS-MT multi-target tags, >>deu<<).
ISO_639_3 = {
    "af": "afr", "ar": "ara", "be": "bel", "bg": "bul", "bn": "ben", "br": "bre", "ca": "cat", "cs": "ces",
    "cy": "cym", "da": "dan", "de": "deu", "el": "ell", "en": "eng", "eo": "epo", "es": "spa", "et": "est",
    "eu": "eus", "fa": "fas", "fi": "fin", "fr": "fra", "ga": "gle", "gl": "glg", "gu": "guj", "he": "heb",
    "hi": "hin", "hr": "hrv", "hu": "hun", "hy": "hye", "id": "ind", "is": "isl", "it": "ita", "ja": "jpn",
    "ka": "kat", "kk": "kaz", "km": "khm", "ko": "kor", "lt": "lit", "lv": "lav", "mk": "mkd", "ml": "mal",
    "mn": "mon", "mr": "mar", "ms": "msa", "mt": "mlt", "my": "mya", "ne": "nep", "nl": "nld", "no": "nor",
    "pl": "pol", "ps": "pus", "pt": "por", "ro": "ron", "ru": "rus", "si": "sin", "sk": "slk", "sl": "slv",
    "sq": "sqi", "sv": "swe", "sw": "swa", "ta": "tam", "te": "tel", "th": "tha", "tl": "tgl", "tr": "tur",
    "uk": "ukr", "ur": "urd", "vi": "vie", "xh": "xho", "zh": "zho",
}
# NLLB names a macrolanguage by one of its members, and some languages in one script of several.
NLLB_CODES = {
    "ar": "arb_Arab", "et": "est_Latn", "fa": "pes_Arab", "lv": "lvs_Latn", "mn": "khk_Cyrl", "ms": "zsm_Latn",
    "ne": "npi_Deva", "no": "nob_Latn", "ps": "pbt_Arab", "sq": "als_Latn", "sw": "swh_Latn", "zh": "zho_Hans",
}


class UnsupportedCheckpoint(PipelineError):
    """A checkpoint outside the supported families; the message names them."""


class MissingLanguageCode(PipelineError):
    """A direction's language has no code in the checkpoint's tokenizer; the message lists the codes it has."""


@dataclass(frozen=True)
class Family:
    name: str
    model_type: str                 # config.json's model_type (the architecture the export writes graphs for)
    tokenizer_classes: tuple[str, ...]
    code_pattern: str               # a whole token that is one of this family's language codes
    # True: the tokenizer places the codes itself once told src_lang/tgt_lang; False: the target's code is text
    # put in front of the source (Marian's tags).
    sets_languages: bool
    examples: str

    def codes_in(self, tokens: Iterable[str]) -> list[str]:
        """The tokens of a vocabulary that are this family's language codes, sorted."""
        pattern = re.compile(self.code_pattern)
        return sorted(t for t in tokens if pattern.fullmatch(t))

    def default_code(self, lang: str, available: Iterable[str]) -> str | None:
        """The code of ISO 639-1 `lang` among `available`, or None."""
        available = list(available)
        iso3 = ISO_639_3.get(lang, lang)
        if self.name == "marian":
            candidates = [f">>{lang}<<", f">>{iso3}<<"]
        elif self.name in ("mbart", "mbart50"):
            candidates = [c for c in available if c.split("_")[0] == lang]
        elif self.name == "m2m100":
            candidates = [f"__{lang}__"]
        else:  # nllb
            candidates = [NLLB_CODES[lang]] if lang in NLLB_CODES else [c for c in available if c[:4] == f"{iso3}_"]
        return next((c for c in candidates if c in available), None)


FAMILIES = (
    Family("marian", "marian", ("MarianTokenizer",), r">>[a-z]{2,3}(_[A-Za-z]+)?<<", False,
           "Helsinki-NLP/opus-mt-en-de, Helsinki-NLP/opus-mt-en-ROMANCE"),
    Family("mbart", "mbart", ("MBartTokenizer", "MBartTokenizerFast"), r"[a-z]{2}_[A-Z]{2}", True,
           "facebook/mbart-large-cc25"),
    Family("mbart50", "mbart", ("MBart50Tokenizer", "MBart50TokenizerFast"), r"[a-z]{2}_[A-Z]{2}", True,
           "facebook/mbart-large-50, facebook/mbart-large-50-many-to-many-mmt"),
    Family("m2m100", "m2m_100", ("M2M100Tokenizer",), r"__[a-z]{2,3}__", True, "facebook/m2m100_418M"),
    Family("nllb", "m2m_100", ("NllbTokenizer", "NllbTokenizerFast"), r"[a-z]{3}_[A-Z][a-z]{3}", True,
           "facebook/nllb-200-distilled-600M"),
)
SUPPORTED = ", ".join(f"{f.name} ({f.tokenizer_classes[0]} + model_type {f.model_type}, e.g. {f.examples})"
                      for f in FAMILIES)


def family_of(model_type: str | None, tokenizer_class: str | None, where: str) -> Family:
    """The family of a checkpoint from its model_type and tokenizer class; UnsupportedCheckpoint naming the
    supported families otherwise. `where` names the checkpoint in the message.

    Without a tokenizer class (older OPUS-MT repositories name none) the family is the one whose tokenizer
    AutoTokenizer picks for the model_type: marian, mbart (cc25) or m2m100."""
    if tokenizer_class is None:
        tokenizer_class = {"marian": "MarianTokenizer", "mbart": "MBartTokenizer",
                           "m2m_100": "M2M100Tokenizer"}.get(model_type or "")
    for family in FAMILIES:
        if tokenizer_class in family.tokenizer_classes:
            if model_type != family.model_type:
                raise UnsupportedCheckpoint(
                    f"{where}: a {tokenizer_class} with model_type {model_type!r}; the {family.name} family "
                    f"has model_type {family.model_type!r}. Supported: {SUPPORTED}")
            return family
    raise UnsupportedCheckpoint(
        f"{where}: model_type {model_type!r} with tokenizer {tokenizer_class!r} is not a supported family. "
        f"Supported: {SUPPORTED}")


def checkpoint_kind(directory: Path) -> tuple[str | None, str | None]:
    """(model_type, tokenizer class) of a local save_pretrained directory, from its JSON files (None where a
    file or field is missing)."""
    def field(name: str, key: str) -> str | None:
        try:
            return json.loads((Path(directory) / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            return None

    return field("config.json", "model_type"), field("tokenizer_config.json", "tokenizer_class")


def check_local_checkpoint(directory: Path) -> Family:
    """The family of a local checkpoint directory, read without loading it (params checks, before any work)."""
    model_type, tokenizer_class = checkpoint_kind(directory)
    if model_type is None:
        raise UnsupportedCheckpoint(f"{directory}: no config.json with a model_type: not a save_pretrained "
                                    "directory of a seq2seq checkpoint")
    return family_of(model_type, tokenizer_class, str(directory))


def language_codes(family: Family, languages: Iterable[str], vocabulary: Iterable[str],
                   overrides: Mapping[str, str], where: str) -> dict[str, str]:
    """{ISO code: the checkpoint's code} for every language; MissingLanguageCode naming the language and listing
    the codes the tokenizer has when one is missing (or when an override is not among them)."""
    available = family.codes_in(vocabulary)
    codes: dict[str, str] = {}
    for lang in languages:
        code = overrides.get(lang) or family.default_code(lang, available)
        if code is None or code not in available:
            asked = f"model.language_codes.{lang}={code!r} is" if lang in overrides else f"{lang!r} has"
            raise MissingLanguageCode(
                f"{where}: {asked} no language code in this {family.name} tokenizer; its codes: "
                f"{', '.join(available) or 'none'}"
                + ("" if available else " (a single-direction checkpoint: use one direction, or one with codes)")
                + ". Set model.language_codes to map a language to one of them")
        codes[lang] = code
    return codes
