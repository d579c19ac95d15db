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
overrides it per language), and must be one of the tokenizer's own codes: a clear error lists them otherwise. A
single-direction OPUS-MT checkpoint has no codes; its tokenizer_config.json names its source_lang and target_lang,
and a direction outside them is refused naming both. One function, checkpoint_codes, makes these checks: the params
check runs it on the checkpoint's files (read here as JSON, nothing loaded), tokenize on the loaded tokenizer.

Where the codes land in the ids (source prefix and suffix, label prefix, the decoder's start) is not written down
here: the tokenize stage asks the tokenizer itself and records the answer per direction
(pipeline/runtime/model_languages.py), so every later stage places them exactly as the family does.

Stdlib only: params checks, the CLI and `mtpipe translate` import it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.runtime.errors import PipelineError
from pipeline.runtime.languages import Directions

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


class DirectionNotTranslated(PipelineError):
    """A direction the checkpoint cannot translate (a single-direction one's languages, a single-target one asked
    for several targets); the message names the direction asked and what the checkpoint translates."""


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


def check_local_checkpoint(directory: Path, where: str | None = None) -> Family:
    """The family of a local checkpoint directory, read without loading it (params checks, before any work);
    `where` names it in errors (default: the directory)."""
    where = where or str(directory)
    model_type, tokenizer_class = checkpoint_kind(directory)
    if model_type is None:
        raise UnsupportedCheckpoint(f"{where}: no config.json with a model_type: not a save_pretrained "
                                    "directory of a seq2seq checkpoint")
    return family_of(model_type, tokenizer_class, where)


def language_codes(family: Family, languages: Iterable[str], vocabulary: Iterable[str],
                   overrides: Mapping[str, str], where: str, directions: Directions | None = None) -> dict[str, str]:
    """{ISO code: the checkpoint's code} for every language; MissingLanguageCode naming the language (and the
    `directions` that need it) and listing the codes the tokenizer has when one is missing (or when an override is
    not among them)."""
    available = family.codes_in(vocabulary)
    codes: dict[str, str] = {}
    for lang in languages:
        code = overrides.get(lang) or family.default_code(lang, available)
        if code is None or code not in available:
            asked = f"model.language_codes.{lang}={code!r} is" if lang in overrides else f"{lang!r} has"
            needed = [str(d) for d in directions.directions if lang in (d.src, d.tgt)] if directions else []
            raise MissingLanguageCode(
                f"{where}{f' (data.directions {needed})' if needed else ''}: {asked} no language code in this "
                f"{family.name} tokenizer; its codes: "
                f"{', '.join(available) or 'none'}"
                + ("" if available else " (a single-direction checkpoint: use one direction, or one with codes)")
                + ". Set model.language_codes to map a language to one of them")
        codes[lang] = code
    return codes


# The files a checkpoint's tokenizer names its tokens in, whichever the family and the transformers version that
# saved it: OPUS-MT keeps its >>xx<< tags in vocab.json; M2M-100 its __xx__ codes in added_tokens.json or the
# special tokens' lists; mBART, mBART-50 and NLLB theirs in tokenizer.json's added tokens, or only in
# tokenizer_config.json / special_tokens_map.json where the repository has no tokenizer.json.
VOCABULARY_FILES = ("vocab.json", "added_tokens.json")
SPECIAL_TOKEN_LISTS = ("additional_special_tokens", "extra_special_tokens")


def _read_json(directory: Path, name: str) -> Any:
    try:
        return json.loads((Path(directory) / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _token(entry: Any) -> str | None:
    """The text of one token entry: a string, an AddedToken dict ({"content": ...}) or a [piece, score] pair."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict):
        return entry.get("content") if isinstance(entry.get("content"), str) else None
    if isinstance(entry, list | tuple) and entry and isinstance(entry[0], str):
        return entry[0]
    return None


def _tokens(entries: Any) -> set[str]:
    """The tokens of a list of entries, or of a {name: entry} mapping's values."""
    values = entries.values() if isinstance(entries, dict) else entries if isinstance(entries, list) else ()
    return {t for t in map(_token, values) if t is not None}


def checkpoint_tokens(directory: Path) -> set[str]:
    """Every token a checkpoint directory's tokenizer files name (vocabulary, added and special tokens), read as
    JSON without loading the tokenizer: the language codes are among them, whichever file the family keeps them in."""
    tokens: set[str] = set()
    for name in VOCABULARY_FILES:
        vocab = _read_json(directory, name)
        tokens.update(vocab if isinstance(vocab, dict) else ())
    fast = _read_json(directory, "tokenizer.json")
    if isinstance(fast, dict):
        tokens |= _tokens(fast.get("added_tokens"))
        vocab = (fast.get("model") or {}).get("vocab")
        # WordPiece/BPE models map token -> id; Unigram ones list [piece, score] pairs.
        tokens.update(vocab if isinstance(vocab, dict) else _tokens(vocab))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        config = _read_json(directory, name)
        if isinstance(config, dict):
            tokens |= _tokens(config.get("added_tokens_decoder"))
            for key in SPECIAL_TOKEN_LISTS:
                tokens |= _tokens(config.get(key))
    return tokens


def declared_languages(directory: Path) -> tuple[str | None, str | None]:
    """(source_lang, target_lang) as the checkpoint's tokenizer_config.json names them (OPUS-MT: "en", "de"), None
    where it names none."""
    config = _read_json(directory, "tokenizer_config.json")
    config = config if isinstance(config, dict) else {}
    source_lang, target_lang = config.get("source_lang"), config.get("target_lang")
    return (source_lang if isinstance(source_lang, str) and source_lang else None,
            target_lang if isinstance(target_lang, str) and target_lang else None)


ISO_639_1 = {iso3: iso1 for iso1, iso3 in ISO_639_3.items()}
_DECLARED_CODE = re.compile(r"([a-z]{2,3})(_[A-Za-z]+)?")


def _iso1(lang: str) -> str:
    return ISO_639_1.get(lang, lang)


def languages_named(declared: str | None) -> set[str] | None:
    """The ISO 639-1 languages a source_lang/target_lang value names ("de", "deu", "fr+fr_BE+es"), or None when it
    cannot be told: nothing declared, a group name (OPUS-MT's ROMANCE, mul) or a code the built-in map lacks. A
    side that cannot be told is not checked, so a checkpoint is never refused on a guess."""
    if not declared:
        return None
    languages = set()
    for part in re.split(r"[+,]", declared):
        match = _DECLARED_CODE.fullmatch(part)
        if match is None or not (match[1] in ISO_639_3 or match[1] in ISO_639_1):
            return None
        languages.add(_iso1(match[1]))
    return languages


def check_declared_direction(directions: Directions, declared: tuple[str | None, str | None], tagged: bool,
                             where: str) -> None:
    """Every direction within the source and target languages a single-direction checkpoint declares;
    DirectionNotTranslated naming the direction and what the checkpoint translates otherwise. The target side of a
    multi-target (`tagged`) checkpoint is its tags' business (language_codes), not its target_lang's."""
    source_lang, target_lang = declared
    sources, targets = languages_named(source_lang), None if tagged else languages_named(target_lang)
    for direction in directions.directions:
        wrong = [f"{lang!r} is not its {side} language" for lang, side, named in
                 ((direction.src, "source", sources), (direction.tgt, "target", targets))
                 if named is not None and _iso1(lang) not in named]
        if wrong:
            translates = (f"{source_lang}-{target_lang}" if sources is not None and targets is not None else
                          f"from {source_lang}" if sources is not None else f"into {target_lang}")
            named = ", ".join(f"{key} {value!r}" for key, value in (("source_lang", source_lang),
                                                                    ("target_lang", target_lang)) if value)
            raise DirectionNotTranslated(
                f"{where} translates {translates} (its tokenizer_config.json: {named}), not {direction} "
                f"(data.directions {directions.names}): {' and '.join(wrong)}. Use a checkpoint trained for "
                f"{direction}, or only directions it translates")


def checkpoint_codes(family: Family, vocabulary: Collection[str], directions: Directions,
                     overrides: Mapping[str, str], where: str,
                     declared: tuple[str | None, str | None] = (None, None)) -> dict[str, str]:
    """{ISO code: the checkpoint's code} of what the tokenizer is told, after checking that the checkpoint
    translates every direction: the one check of a checkpoint's languages, which the params check runs on its files
    and tokenize on the loaded tokenizer. A family that sets languages needs every language's code; Marian only its
    targets' tags, and only when the checkpoint is multi-target (tags in its vocabulary): a single-target one reads
    plain text, translates into its one language, and from and into the languages it declares (`declared`: its
    source_lang and target_lang)."""
    if family.sets_languages:
        return language_codes(family, directions.languages, vocabulary, overrides, where, directions)
    tagged = bool(family.codes_in(vocabulary))
    if not tagged and directions.target_tags:
        raise DirectionNotTranslated(
            f"{where}: data.directions {directions.names} need a target tag in front of every source "
            f"({', '.join(directions.tags)}), which takes a multi-target MarianTokenizer with tags in its "
            f"vocabulary; this checkpoint has a MarianTokenizer without {', '.join(directions.tags)} (no >>xx<< tag "
            "at all: a single-target checkpoint, for one direction)")
    check_declared_direction(directions, declared, tagged, where)
    return language_codes(family, directions.targets, vocabulary, overrides, where, directions) if tagged else {}


def check_checkpoint_languages(directory: Path, directions: Directions, overrides: Mapping[str, str],
                               where: str) -> dict[str, str] | None:
    """checkpoint_codes on a checkpoint directory's files, nothing loaded (the params check, before any work): the
    codes, or None where the files do not hold what the check needs (no vocab.json beside a Marian tokenizer; no
    code of a family that sets languages, whose tokenizer class then adds its built-in codes when it loads), so
    tokenize checks the loaded tokenizer instead."""
    family = check_local_checkpoint(directory, where)
    tokens = checkpoint_tokens(directory)
    readable = family.codes_in(tokens) if family.sets_languages else (Path(directory) / "vocab.json").is_file()
    if not readable:
        return None
    return checkpoint_codes(family, tokens, directions, overrides, where, declared_languages(directory))
