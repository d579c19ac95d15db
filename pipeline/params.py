"""The params schema: `params.yaml` is read once, here, into typed sections.

An unknown key, a wrong type or an out-of-range value fails before any work is done, with a message that
names the key (as a dotted path) and the bad value. Stages receive the typed `Params` object, never the raw
mapping. This module imports only pydantic, yaml and the stdlib-only pipeline.runtime.languages, so every stage and the
CLI start fast.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.runtime.languages import DIRECTION_PATTERN, MAX_DIRECTIONS, SCRIPTS, Direction, Directions

PARAMS_FILE = "params.yaml"
# The export stage's directory, as params.yaml names it: distill.teacher's default, this run's own model.
OWN_EXPORT = "models/export"


class ParamsError(ValueError):
    """params.yaml is missing, unreadable or invalid; the message names every bad key and value."""


def _parse_directions(names: Any) -> Directions:
    """data.directions as written (a non-empty list of distinct source-target names), parsed."""
    if isinstance(names, Directions):
        return names
    if not isinstance(names, list) or not names:
        raise ValueError("write a non-empty list of source-target directions, e.g. [en-de]")
    if len(names) > MAX_DIRECTIONS:
        raise ValueError(f"{len(names)} directions, more than the {MAX_DIRECTIONS} a tokenized corpus can tell apart")
    for i, name in enumerate(names):
        Direction.parse(name)
        if name in names[:i]:
            raise ValueError(f"{name} is listed twice")
    return Directions.of(names)


# data.directions: the YAML list of names in, a Directions out (dumped back as the list of names).
DirectionList = Annotated[Directions, BeforeValidator(_parse_directions),
                          PlainSerializer(lambda directions: directions.names, return_type=list[str])]


def _count_or_auto(value: int | str) -> int | str:
    """A process or thread count: a positive int, or 'auto'."""
    if isinstance(value, int) and value < 1:
        raise ValueError("must be at least 1 or 'auto'")
    return value


class _Section(BaseModel):
    # extra="forbid": a misspelt key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", frozen=True)


class SplitFiles(_Section):
    """Two aligned files, one sentence a line (plain or .gz): line n of src translates line n of tgt."""

    src: str = Field(min_length=1)
    tgt: str = Field(min_length=1)
    # The direction the pair of files is in; required when data.directions lists more than one.
    direction: str | None = Field(None, pattern=DIRECTION_PATTERN)


class TsvFile(_Section):
    """One file (plain or .gz), one pair a line as two tab-separated columns."""

    tsv: str = Field(min_length=1)
    # Languages of the first and second column; null means the one direction's [source, target] (required when
    # data.directions lists more than one). The file serves every direction between its two languages, either way.
    columns: tuple[str, str] | None = None


class MosesDir(_Section):
    """A directory of Moses-style files NAME.<lang> (each plain or .gz): for every direction, NAME.<src> and
    NAME.<tgt> are paired by NAME and concatenated in NAME order; `prefix` keeps only the NAMEs that start with it.
    A direction none of whose languages' files are there takes nothing from it."""

    dir: str = Field(min_length=1)
    prefix: str = ""


class LanguageFiles(_Section):
    """One file per language, line-aligned across all of them (a multi-way corpus such as Multi30k): `pattern` is
    a path with `{lang}` in it, and every direction pairs the files of its two languages."""

    pattern: str = Field(min_length=1)

    @field_validator("pattern")
    @classmethod
    def _has_placeholder(cls, pattern: str) -> str:
        if "{lang}" not in pattern:
            raise ValueError(f"{pattern!r} has no {{lang}} placeholder (e.g. corpus/train.{{lang}}.gz)")
        return pattern


def _entry_kind(entry: Any) -> str:
    # Which shape an entry has is decided by its key, so a typo yields the error of the intended shape only.
    if isinstance(entry, dict):
        for key in ("tsv", "dir", "pattern"):
            if key in entry:
                return key
        return "aligned"
    return {TsvFile: "tsv", MosesDir: "dir", LanguageFiles: "pattern"}.get(type(entry), "aligned")


FileEntry = Annotated[
    Annotated[SplitFiles, Tag("aligned")]
    | Annotated[TsvFile, Tag("tsv")]
    | Annotated[MosesDir, Tag("dir")]
    | Annotated[LanguageFiles, Tag("pattern")],
    Discriminator(_entry_kind),
]

WMT14_PAIRS = {"cs", "de", "fr", "hi", "ru"}


def check_split_name(name: str) -> str:
    """A split name becomes a file name and a metrics key: letters, digits, '-' and '_' only, and not MACRO."""
    if not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"split name {name!r} must be letters, digits, '-' or '_'")
    if name == MACRO:
        raise ValueError(f"split name {MACRO!r} is taken: metrics/eval.json holds the average over test sets there")
    return name


class HubParams(_Section):
    """A Hugging Face dataset that holds translations (data.source: hub): a hub id, or a local directory in the
    hub's layout (Parquet or JSON files per split, configurations declared in README.md or one default)."""

    path: str = Field(min_length=1)
    # The configuration: one name for every direction, {direction: name} for each, or null: for each direction
    # the configuration named after its pair either way round (de-en, or iwslt2017-de-en, serves en-de and
    # de-en), else the dataset's only one.
    name: str | dict[str, str] | None = None
    # Branch, tag or commit of a hub dataset; the manifest records the commit read.
    revision: str | None = None
    # Split name here -> the dataset's split. train and valid are required; every other split is a test set.
    splits: dict[str, str] = Field(
        default_factory=lambda: {"train": "train", "valid": "validation", "test": "test"}
    )
    # Where the text is: the name of a column of {lang: text} dicts, or {lang: column} for one text column per
    # language; null: a `translation` column when there is one, else a column named after each language.
    columns: str | dict[str, str] | None = None

    @field_validator("splits")
    @classmethod
    def _train_valid_and_a_test_split(cls, splits: dict[str, str]) -> dict[str, str]:
        for name in splits:
            check_split_name(name)
        if missing := [s for s in ("train", "valid") if s not in splits]:
            raise ValueError(f"needs {missing[0]} (train and valid are required): e.g. {{valid: validation}}")
        if len(splits) < 3:
            raise ValueError("needs at least one test split besides train and valid: e.g. {test: test}")
        return splits


# data.source presets: named datasets read through the hub source (data.revision is the preset's revision).
HUB_PRESETS = {
    "wmt14": dict(path="wmt/wmt14", columns="translation",
                  splits={"train": "train", "valid": "validation", "newstest2014": "test"}),
}


SAMPLE_DIRECTIONS = {"en-de", "de-en"}
SAMPLE_SPLITS = ("train", "valid", "test")
# metrics/eval.json's key for the average over every test set and direction.
MACRO = "macro"


class DataParams(_Section):
    source: Literal["sample", "files", "hub", "wmt14"] = "sample"
    # The directions one model learns, source-target; one is the plain bilingual case. A multilingual model with
    # more than one target language reads the target's tag (>>de<<) in front of every source sentence.
    directions: DirectionList = Field(default_factory=lambda: Directions.of(["en-de"]))
    # split name -> one entry or a list of entries, concatenated in order ({src, tgt, direction} | {tsv, columns} |
    # {dir, prefix} | {pattern}); "train" and "valid" are required and must hold every direction, every other split
    # is a test set (of any of the directions).
    files: dict[str, list[FileEntry]] = Field(default_factory=dict)
    # Cap on training pairs per direction; null keeps them all. `subsample` says which: "spread" takes N pairs
    # evenly spaced over the whole split (WMT14 train is Europarl, then Common Crawl, then News Commentary: a prefix
    # would be Europarl only), "head" the first N. Both are deterministic.
    max_train_pairs: Annotated[int, Field(gt=0)] | None = None
    subsample: Literal["spread", "head"] = "spread"
    # wmt14 only: the dataset repository revision (branch, tag or commit); the manifest records the commit used.
    revision: str | None = None
    # source hub: the dataset, its configurations, splits and columns (HubParams).
    hub: HubParams | None = None

    @field_validator("files", mode="before")
    @classmethod
    def _one_entry_is_a_list_of_one(cls, files: Any) -> Any:
        if isinstance(files, dict):
            return {name: entry if isinstance(entry, list) else [entry] for name, entry in files.items()}
        return files

    @field_validator("files")
    @classmethod
    def _split_names_are_safe(cls, files: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, entries in files.items():
            check_split_name(name)
            if not entries:
                raise ValueError(f"split {name!r} has an empty list of files")
        return files

    def hub_dataset(self) -> HubParams | None:
        """The hub dataset this source reads: data.hub, a preset's (wmt14, at data.revision), or None."""
        if self.source in HUB_PRESETS:
            return HubParams(**HUB_PRESETS[self.source], revision=self.revision)
        return self.hub if self.source == "hub" else None

    def split_names(self) -> list[str]:
        """The splits the source gives (evaluate.sacrebleu_test_sets adds its own)."""
        hub = self.hub_dataset()
        if hub is not None:
            return list(hub.splits)
        return list(SAMPLE_SPLITS) if self.source == "sample" else list(self.files)

    @model_validator(mode="after")
    def _source_is_complete(self) -> DataParams:
        if self.source == "files":
            missing = [s for s in ("train", "valid") if s not in self.files]
            if missing:
                raise ValueError(f"source 'files' needs data.files.{missing[0]} (train and valid are required)")
            if len(self.files) < 3:
                raise ValueError("source 'files' needs at least one test split besides train and valid")
            for split, entries in self.files.items():
                for entry in entries:
                    self._check_entry(split, entry)
        if self.source == "sample" and set(self.directions.names) - SAMPLE_DIRECTIONS:
            raise ValueError(
                f"the embedded sample is English-German: data.directions {self.directions.names} must be en-de or de-en"
            )
        if self.source == "wmt14":
            for d in self.directions.directions:
                pair = {d.src, d.tgt}
                if "en" not in pair or not (pair - {"en"}) <= WMT14_PAIRS:
                    raise ValueError(
                        f"data.directions: WMT14 has no {d} pair; it pairs en with one of {sorted(WMT14_PAIRS)}"
                    )
        if self.source == "hub":
            self._check_hub()
        return self

    def _check_hub(self) -> None:
        """What can be known of data.hub without its files: configurations and columns named for every direction
        and language. Whether the dataset has them is known once its files are reachable (the download stage)."""
        if self.hub is None:
            raise ValueError("source 'hub' needs data.hub: {path: <hub id or directory>, splits: {...}}")
        if self.revision is not None:
            raise ValueError("data.revision is the wmt14 preset's: with source 'hub' set data.hub.revision")
        named = self.hub.name if isinstance(self.hub.name, dict) else None
        missing = [d for d in self.directions.names if d not in named] if named is not None else []
        if missing:
            raise ValueError(f"data.hub.name names no configuration for {missing} (it maps {sorted(self.hub.name)})")
        columns = self.hub.columns
        if isinstance(columns, dict) and (missing := [x for x in self.directions.languages if x not in columns]):
            raise ValueError(f"data.hub.columns names no column for {missing} (it maps {sorted(columns)})")

    def _check_entry(self, split: str, entry: Any) -> None:
        several = len(self.directions.directions) > 1
        where = f"data.files.{split}"
        if isinstance(entry, SplitFiles):
            if entry.direction is None and several:
                raise ValueError(
                    f"{where}: {{src: {entry.src}, tgt: {entry.tgt}}} needs `direction:` (one of "
                    f"{', '.join(self.directions.names)}) when data.directions lists more than one"
                )
            if entry.direction is not None and entry.direction not in self.directions.names:
                raise ValueError(
                    f"{where}: {entry.src} has direction {entry.direction}, which is not in data.directions "
                    f"{self.directions.names}"
                )
        if isinstance(entry, TsvFile):
            if entry.columns is None:
                if several:
                    raise ValueError(
                        f"{where}: {entry.tsv} needs `columns:` (the languages of its two columns) when "
                        "data.directions lists more than one"
                    )
                return
            if not any(set(entry.columns) == {d.src, d.tgt} for d in self.directions.directions):
                raise ValueError(
                    f"{where}: {entry.tsv} has columns {list(entry.columns)}, which no direction in "
                    f"data.directions {self.directions.names} pairs"
                )


class CleanParams(_Section):
    # Normalisation, applied to every split.
    unicode_form: Literal["NFC", "NFKC"] = "NFC"
    strip_html: bool = True  # unescape HTML entities, then remove tags
    moses_punct: bool = True  # sacremoses' MosesPunctNormalizer, with each side's language

    # Filters, applied to the training split only; each has its own reject reason (in brackets).
    min_chars: int = Field(1, ge=1)  # [too_short_chars] either side shorter, in characters
    max_chars: int = Field(1000, ge=1)  # [too_long_chars]
    min_words: int = Field(1, ge=1)  # [too_short_words] either side with fewer words
    max_words: int = Field(250, ge=1)  # [too_long_words]
    max_length_ratio: float = Field(3.0, gt=1.0)  # [length_ratio] longer/shorter side in characters
    # The ratio filter is unreliable on very short segments ("Yes." / "Ja, gerne."), so it only applies above this.
    ratio_min_chars: int = Field(10, ge=0)
    reject_copies: bool = True  # [source_equals_target]
    # [garbled] either side whose letters are below this share of its non-space characters; 0 switches it off.
    min_letter_share: float = Field(0.5, ge=0.0, le=1.0)
    # [wrong_script] either side whose letters are below this share in its language's script (Latin for en/de,
    # Cyrillic for ru, ...); 0 switches it off. Languages without a known script are not checked.
    min_script_share: float = Field(0.9, ge=0.0, le=1.0)
    remove_eval_overlap: bool = True  # [overlaps_eval] the pair also occurs in a valid or test split
    deduplicate: bool = True  # [duplicate] an earlier training pair is identical (after normalisation)
    # [wrong_language] py3langid (its model ships in the wheel) on each side; off by default for its cost.
    language_id: bool = False
    # Sides shorter than this are not language-checked: on a few words a detector mostly guesses.
    language_id_min_chars: int = Field(20, ge=1)
    # The languages the detector chooses among, besides src_lang and tgt_lang (fewer is faster).
    language_id_candidates: list[str] = Field(
        default_factory=lambda: ["cs", "de", "en", "es", "fr", "hi", "it", "nl", "pl", "pt", "ru", "tr", "zh"]
    )

    @model_validator(mode="after")
    def _bounds(self) -> CleanParams:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) is larger than max_chars ({self.max_chars})")
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) is larger than max_words ({self.max_words})")
        return self


class ValidateParams(_Section):
    # Fewer training rows than this fail the suite (a truncated download, a filter gone wrong).
    min_rows: int = Field(100, ge=1)
    # Share of rows allowed outside the soft bounds (lengths, ratio, letter and script shares) before the suite fails.
    mostly: float = Field(1.0, ge=0.0, le=1.0)
    # Language check: py3langid on a seeded sample of this many training rows (0 switches it off); the suite fails
    # when fewer than `min_language_match` of the sampled sides are in the expected language (swapped columns,
    # a corpus in the wrong language). Sides shorter than clean.language_id_min_chars are not sampled.
    language_sample: int = Field(2000, ge=0)
    min_language_match: float = Field(0.9, ge=0.0, le=1.0)
    seed: int = Field(1, ge=0)
    # Training rows per GX batch: the suite runs over every row, one chunk at a time, so memory is bounded by this
    # and not by the corpus. `mostly` applies within each chunk.
    chunk_rows: int = Field(250_000, ge=1000)


class TokenizeParams(_Section):
    model_type: Literal["unigram", "bpe"] = "unigram"
    # One SentencePiece model and vocabulary for both languages (shared, tied embeddings), or one per side.
    joint: bool = True
    # Sized for the embedded sample (SentencePiece stops lower on a small corpus); 8000-32000 for real corpora.
    vocab_size: int = Field(1000, ge=100, le=65000)
    character_coverage: float = Field(1.0, gt=0.9, le=1.0)
    byte_fallback: bool = True
    input_sentence_size: int = Field(2_000_000, ge=1000)
    threads: int | Literal["auto"] = 2
    seed: int = Field(1, ge=0)
    # Training pairs with a side longer than train.max_len tokens: truncated by the trainer, or left out here.
    overlong: Literal["truncate", "drop"] = "truncate"
    # Several languages: SentencePiece trains on a sample of input_sentence_size sentences drawn per language in
    # shares p ∝ n ** (1 / T) (seeded), so a small language still gets its pieces; 1 = in proportion to the data.
    temperature: float = Field(5.0, ge=1.0)
    # Subword regularization (Kudo 2018) for small corpora: the training pairs are written again this many times
    # after their one-best encoding, each copy in segmentations drawn from the unigram model's sampling_nbest best
    # with probability ∝ P(x) ** sampling_alpha (stages/tokenize/subword_sampling.py); 0 = off. An epoch of the
    # trainer is a pass over every copy.
    sampled_copies: int = Field(0, ge=0, le=100)
    sampling_nbest: int = Field(64, ge=2, le=1024)
    sampling_alpha: float = Field(0.1, gt=0.0, le=10.0)

    @model_validator(mode="after")
    def _sampling_needs_unigram(self) -> TokenizeParams:
        if self.sampled_copies and self.model_type != "unigram":
            raise ValueError("tokenize.sampled_copies draws from a unigram model's n-best segmentations: set "
                             "tokenize.model_type: unigram, or tokenize.sampled_copies: 0")
        return self


def _preset(**shape: Any) -> dict[str, Any]:
    """A preset: its shape and dropout; no preset drops attention weights or FFN activations, and every one computes
    the FFN with ReLU (Vaswani et al.)."""
    return {**shape, "attention_dropout": 0.0, "activation_dropout": 0.0, "activation": "relu"}


# Architecture presets. cpu-ref is the reference model for 2-core CPUs; base and big are Vaswani et al. 2017;
# student is a distillation student (distill.model) shaped for int8 CPU decoding: the encoder, run once per
# sentence, deeper than the one narrow decoder layer, run once per token and beam (the browsermt/Firefox students'
# shape). Three encoder layers, not six: post-norm Marian with six did not train at the teacher's lr (bench/README.md).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _preset(d_model=64, encoder_layers=2, decoder_layers=2, attention_heads=4, ffn_dim=256, dropout=0.1),
    "cpu-ref": _preset(d_model=256, encoder_layers=3, decoder_layers=3, attention_heads=4, ffn_dim=1024, dropout=0.1),
    "base": _preset(d_model=512, encoder_layers=6, decoder_layers=6, attention_heads=8, ffn_dim=2048, dropout=0.1),
    "big": _preset(d_model=1024, encoder_layers=6, decoder_layers=6, attention_heads=16, ffn_dim=4096, dropout=0.3),
    "student": _preset(d_model=192, encoder_layers=3, decoder_layers=1, attention_heads=4, ffn_dim=768, dropout=0.1),
}


def transformer_parameters(arch: dict[str, Any], vocab_size: int, tie_embeddings: bool = True) -> int:
    """The weights of an encoder-decoder Transformer of this shape (embeddings, attention, FFN, output projection;
    biases and norms left out, a few per mille): what "larger than the teacher" compares."""
    d, ffn = arch["d_model"], arch["ffn_dim"]
    encoder = arch["encoder_layers"] * (4 * d * d + 2 * d * ffn)
    decoder = arch["decoder_layers"] * (8 * d * d + 2 * d * ffn)  # self- and cross-attention
    embeddings = vocab_size * d * (1 if tie_embeddings else 2)
    return encoder + decoder + embeddings


class ModelParams(_Section):
    preset: Literal["tiny", "cpu-ref", "base", "big", "student"] = "tiny"
    init: Literal["scratch", "pretrained"] = "scratch"
    # A local directory or hub name of a transformers seq2seq model, used when init is "pretrained".
    name_or_path: str | None = None
    # Individual fields override the preset; null means "as the preset says".
    d_model: Annotated[int, Field(ge=8)] | None = None
    encoder_layers: Annotated[int, Field(ge=1)] | None = None
    decoder_layers: Annotated[int, Field(ge=1)] | None = None
    attention_heads: Annotated[int, Field(ge=1)] | None = None
    ffn_dim: Annotated[int, Field(ge=8)] | None = None
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None  # residual and embedding outputs
    # Dropout on the attention weights (after the softmax) and on the FFN's hidden activations (fairseq's
    # --attention-dropout and --activation-dropout); 0 in every preset, as in Vaswani et al.
    attention_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    activation_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    # The FFN's nonlinearity (transformers' names): relu in every preset, as in Vaswani et al. and fairseq; the
    # OPUS-MT models use swish (SiLU), BERT-era models gelu.
    activation: Literal["relu", "gelu", "swish"] | None = None
    tie_embeddings: bool = True
    # How a scratch model's weights are drawn: normal is transformers' N(0, 0.02) for every matrix; xavier is
    # Vaswani et al.'s and fairseq's (stages/train/initialization.py): Xavier-uniform projections, embeddings
    # N(0, d_model ** -0.5), so that after Marian's sqrt(d_model) scaling tokens weigh as much as positions.
    weight_init: Literal["normal", "xavier"] = "normal"
    max_positions: int = Field(512, ge=16)
    # init: pretrained: ISO code -> the checkpoint's own language code, where the built-in map
    # (pipeline/runtime/families.py) picks another or none: {zh: zho_Hant} for NLLB, {en: ">>eng<<"} for OPUS-MT.
    language_codes: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> ModelParams:
        if self.init == "pretrained" and not self.name_or_path:
            raise ValueError("init 'pretrained' needs model.name_or_path")
        if self.init == "pretrained" and self.weight_init != "normal":
            raise ValueError(f"weight_init '{self.weight_init}' draws a model trained from scratch; a pretrained one "
                             "keeps its weights (set weight_init: normal, or init: scratch)")
        if self.init == "pretrained" and self.activation is not None:
            raise ValueError(f"activation '{self.activation}' shapes a model trained from scratch; a pretrained one "
                             "computes its own (set activation: null, or init: scratch)")
        bad = [lang for lang in self.language_codes if not re.fullmatch(r"[a-z]{2,3}", lang)]
        if bad:
            raise ValueError(f"language_codes: keys are the directions' ISO codes (e.g. en), not {bad}")
        arch = self.architecture()
        if arch["d_model"] % arch["attention_heads"]:
            raise ValueError(
                f"d_model ({arch['d_model']}) must be divisible by attention_heads ({arch['attention_heads']})"
            )
        return self

    def architecture(self) -> dict[str, Any]:
        """The preset with every explicitly set field applied on top."""
        arch = dict(PRESETS[self.preset])
        for key in arch:
            value = getattr(self, key)
            if value is not None:
                arch[key] = value
        return arch


class TrainParams(_Section):
    # The defaults of the schedule and the batch are the embedded sample's, chosen on its valid split (params.yaml
    # says so too); configs/ holds complete files for real corpora and GPUs.
    # Limits: training stops at whichever comes first. max_steps is the one that makes a run repeatable; a time
    # limit makes the result depend on the machine's speed, so it is off unless set (it counts training time across
    # resumes, and a run it stops says so in the summary, the evaluation page and the model card).
    max_steps: int = Field(2400, ge=1)  # optimizer updates (a skipped non-finite update does not count)
    max_epochs: int | None = Field(None, ge=1)
    max_minutes: float | None = Field(None, gt=0)
    lr: float = Field(3e-3, gt=0, le=1.0)
    warmup_steps: int = Field(200, ge=0)
    # inverse_sqrt: warmup, then 1/sqrt(step), open-ended; linear | cosine: warmup, then down to 0 at max_steps
    # (the better model for a step-bound run; stages/train/schedule.py).
    lr_schedule: Literal["inverse_sqrt", "linear", "cosine"] = "inverse_sqrt"
    weight_decay: float = Field(0.0, ge=0)  # AdamW's, decoupled; on weight matrices, not biases or LayerNorm gains
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0)
    # Each source and decoder-input token replaced by <unk> with this probability while training (Sennrich and
    # Zhang 2019's word dropout for small corpora; stages/train/word_dropout.py). 0 = off.
    word_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    clip_norm: float = Field(1.0, ge=0)
    max_tokens: int = Field(2048, ge=16)
    # Micro-batches of max_tokens accumulated per process into one update (gradient accumulation): an update sees
    # nproc x update_freq batches; DDP all-reduces the gradients once, after the last micro-batch.
    update_freq: int = Field(1, ge=1)
    # Longest sequence (tokens, incl. </s>) fed to the model; longer pairs are truncated and counted.
    max_len: int = Field(256, ge=8)
    # auto: bf16 autocast where the device computes bf16 natively (stages/train/precision.py), else fp32.
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # Updates with a non-finite gradient are skipped and counted; this many in a row stop training with an error.
    max_bad_steps: int = Field(16, ge=1)
    nproc: int | Literal["auto"] = Field(1)
    threads: int | None = Field(None, ge=1)
    seed: int = Field(1, ge=0)
    log_every: int = Field(10, ge=1)
    valid_every: int = Field(200, ge=1)
    # Greedy-decoded BLEU on a seeded sample of this many valid pairs per direction at every validation (0 switches
    # it off). With several directions, valid loss and BLEU are each direction's and their mean.
    valid_bleu_sentences: int = Field(100, ge=0)
    # Early stopping: stop after this many validations in a row without a lower valid loss (the mean over
    # directions, as for best.pt); null never stops early.
    patience: int | None = Field(None, ge=1)
    # models/checkpoints/last.pt (everything needed to resume exactly) is rewritten every save_every updates.
    save_every: int = Field(250, ge=1)
    # models/final: 1 = the weights with the best valid loss; K > 1 = the average of the last K checkpoints
    # (one every save_every updates, plus the final update's).
    average_last: int = Field(1, ge=1)
    # Deterministic GPU kernels (torch.use_deterministic_algorithms): a CUDA run then repeats bitwise, slower, and an
    # op without a deterministic kernel raises. CPU runs are exact either way.
    deterministic: bool = False
    # Several directions: each epoch draws every direction's pairs in shares p ∝ n ** (1 / T) (seeded; fairseq's
    # translation_multi_simple_epoch), then batches them by length, so batches mix directions. 1 = in proportion
    # to the data; larger flattens towards equal shares.
    temperature: float = Field(1.5, ge=1.0)
    # Several directions: a weight per direction (source-target) multiplying its temperature share before the shares
    # are normalised again (fairseq's sampling weights); a direction left out weighs 1. {en-de: 2} with two other
    # directions of equal size trains en-de on half of every epoch's pairs and each of the others on a quarter.
    direction_weights: dict[str, float] = Field(default_factory=dict)
    # Large checkpoints on small GPUs: recompute activations in the backward pass (about a third slower, much less
    # activation memory), and keep some weights fixed (embeddings: the shared token embeddings, and the output
    # projection tied to them; encoder: the whole encoder).
    gradient_checkpointing: bool = False
    freeze: list[Literal["embeddings", "encoder"]] = Field(default_factory=list)

    _nproc_positive = field_validator("nproc")(classmethod(lambda cls, v: _count_or_auto(v)))

    @field_validator("direction_weights")
    @classmethod
    def _weights_positive(cls, weights: dict[str, float]) -> dict[str, float]:
        if bad := {name: w for name, w in weights.items() if not w > 0 or w == float("inf")}:
            raise ValueError(f"weights must be positive and finite, got {bad}")
        return weights

    @model_validator(mode="after")
    def _decay_ends_at_max_steps(self) -> TrainParams:
        if self.lr_schedule != "inverse_sqrt":
            for limit in ("max_minutes", "max_epochs"):
                if getattr(self, limit) is not None:
                    raise ValueError(
                        f"train.lr_schedule {self.lr_schedule} decays to 0 at train.max_steps, but train.{limit} "
                        f"may stop the run before that, with the learning rate still high: set train.{limit} to "
                        "null, or use lr_schedule inverse_sqrt")
        return self


class EvaluateParams(_Section):
    beam: int = Field(4, ge=1, le=64)
    # Finished hypotheses are ranked by sum(log p) / length ** length_penalty (transformers' convention).
    length_penalty: float = Field(1.0, ge=0.0)
    # Maximum output length = max_len_a * source_length + max_len_b (fairseq convention).
    max_len_a: float = Field(1.2, ge=0)
    max_len_b: int = Field(10, ge=1)
    max_tokens: int = Field(2000, ge=16)
    # Sentences listed in reports/eval/report.md at each end of the sentence-BLEU ranking, per test set.
    report_sentences: int = Field(5, ge=0, le=1000)
    # sacreBLEU's test sets (wmt14, wmt20, multi30k/2016, ...) evaluated as test splits besides the data's own,
    # each named as the set with '/' and '.' written '_' (pipeline/sacrebleu_sets.py); download fetches them.
    sacrebleu_test_sets: list[str] = Field(default_factory=list)

    @field_validator("sacrebleu_test_sets")
    @classmethod
    def _listed_once(cls, names: list[str]) -> list[str]:
        if twice := sorted({name for i, name in enumerate(names) if name in names[:i]}):
            raise ValueError(f"{twice} listed twice")
        return names


class ExportParams(_Section):
    onnx: bool = True
    # int8 copies of the ONNX graphs (onnxruntime dynamic quantisation); reported by the parity check, not gated.
    int8: bool = True
    # Legacy format: torch deprecates TorchScript.
    torchscript: bool = True
    # A CTranslate2 model directory as well (needs the optional `ct2` dependencies).
    ctranslate2: bool = False
    ctranslate2_quantization: Literal[
        "float32", "int8", "int8_float32", "int16", "float16", "int8_float16", "bfloat16", "int8_bfloat16"
    ] = "int8"
    opset: int = Field(18, ge=14)
    parity_sentences: int = Field(64, ge=1)
    max_logit_diff: float = Field(1e-4, gt=0)
    min_identical: float = Field(0.99, ge=0, le=1)
    max_bleu_delta: float = Field(0.1, ge=0)
    # The CTranslate2 model's gate, per direction: greedy outputs identical to PyTorch's for at least this share,
    # corpus BLEU within this of PyTorch's. Looser than the ONNX graphs' own: the default int8 quantisation changes
    # some outputs (a float32 conversion can be held to min_identical / max_bleu_delta).
    ctranslate2_min_identical: float = Field(0.8, ge=0, le=1)
    ctranslate2_max_bleu_delta: float = Field(1.0, ge=0)
    # A lexical shortlist from the training pairs and a decoder graph that projects each sentence's next token onto
    # its shortlist only and ranks it there (pipeline/runtime/shortlist.py): `mtpipe translate` decodes with it
    # unless --no-shortlist.
    # Its BLEU against the full decoder is reported in metrics/export.json (`shortlist`), not gated.
    shortlist: bool = False
    # Target ids each source id may bring into its sentence's shortlist, likeliest first (IBM Model 1).
    shortlist_per_source: int = Field(20, ge=1)
    # The most frequent target ids, which every sentence's shortlist holds (with </s>).
    shortlist_frequent: int = Field(100, ge=1)

    @model_validator(mode="after")
    def _int8_needs_onnx(self) -> ExportParams:
        if self.int8 and not self.onnx:
            raise ValueError("int8 quantises the ONNX graphs: it needs onnx: true")
        if self.shortlist and not self.onnx:
            raise ValueError("shortlist adds a decoder to the ONNX graphs: it needs onnx: true")
        return self


class CardParams(_Section):
    """The model card (`models/release/README.md`, Hugging Face format) the card stage writes."""

    # The license the model may be shared under, as a Hugging Face license id (apache-2.0, mit, cc-by-4.0, ...,
    # "other"); it depends on the training data's terms, so nothing sensible can be assumed: "unknown" until set.
    license: str = Field("unknown", pattern=r"^[a-z0-9][a-z0-9.+-]*$")
    # Hugging Face dataset ids of the training data, for the card's `datasets`. data.source wmt14 adds its own.
    datasets: list[str] = Field(default_factory=list)
    # The model's name in the card's model-index and title; null: mtpipe-<languages>, e.g. mtpipe-en-de.
    name: str | None = Field(None, min_length=1)


class StudentModelParams(ModelParams):
    """distill.model: a model block whose preset, unless set, is the student's."""

    preset: Literal["tiny", "cpu-ref", "base", "big", "student"] = "student"


class StudentExportParams(ExportParams):
    """distill.export: an export block whose shortlist, unless set, is on (the student is shaped for fast CPU
    decoding, and the shortlist is most of its int8 speed-up beyond its shape: bench/README.md)."""

    shortlist: bool = True


class DistillParams(_Section):
    """Sequence-level distillation (Kim & Rush 2016): the teacher translates every training source with beam search,
    and a student trains on its translations with the same stages (stages/distill, `student_*` in dvc.yaml)."""

    enabled: bool = False
    # The teacher: an export directory that translates every direction of data.directions; models/export is this
    # run's own, any other one another run's (e.g. a fine-tuned OPUS-MT or NLLB). A path, not null: dvc.yaml makes
    # it the distill stage's dependency (`${distill.teacher}`), so a changed teacher reruns the distillation.
    teacher: str = Field(OWN_EXPORT, min_length=1)
    # The teacher's graphs that translate the corpus: fp32 ONNX (onnx) or its int8 copies (onnx_int8, faster).
    runtime: Literal["onnx", "onnx_int8"] = "onnx"
    beam: int = Field(4, ge=1, le=64)
    # Share of training pairs whose original reference also joins the student's corpus, beside the teacher's
    # translation of the same source (seeded); 0 is the teacher's translations only.
    original_ratio: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = Field(1, ge=0)
    # ONNX Runtime sessions translating at once (each on one thread); auto: every core. Outputs do not depend on it.
    threads: int | Literal["auto"] = "auto"
    # The student's own blocks, read by the student_* stages as tokenize, model and train are by the teacher's.
    tokenize: TokenizeParams = Field(default_factory=TokenizeParams)
    model: StudentModelParams = Field(default_factory=StudentModelParams)
    train: TrainParams = Field(default_factory=TrainParams)
    # The student's export, apart from the teacher's: a lexical shortlist is the student's speed, while the teacher's
    # own export (what its evaluation page and `mtpipe translate` serve) keeps its whole-vocabulary decoding.
    export: StudentExportParams = Field(default_factory=StudentExportParams)

    _threads_positive = field_validator("threads")(classmethod(lambda cls, v: _count_or_auto(v)))

    @property
    def external_teacher(self) -> str | None:
        """The teacher's directory when it is not this run's own export."""
        return None if Path(self.teacher) == Path(OWN_EXPORT) else self.teacher

    def not_smaller_than(self, teacher_size: int, teacher: str) -> str | None:
        """What is wrong when the student (a model trained from scratch) has no fewer weights than the teacher."""
        if self.model.init != "scratch":
            return None
        size = transformer_parameters(self.model.architecture(), self.tokenize.vocab_size, self.model.tie_embeddings)
        if size < teacher_size:
            return None
        return (f"distill.model (preset {self.model.preset}, {size / 1e6:.1f}M weights with distill.tokenize."
                f"vocab_size {self.tokenize.vocab_size}) is not smaller than {teacher} ({teacher_size / 1e6:.1f}M): "
                "a student is the smaller, faster model; choose a smaller distill.model.preset or fields")


class Params(_Section):
    data: DataParams = Field(default_factory=DataParams)
    clean: CleanParams = Field(default_factory=CleanParams)
    validate_: ValidateParams = Field(default_factory=ValidateParams, alias="validate")
    tokenize: TokenizeParams = Field(default_factory=TokenizeParams)
    model: ModelParams = Field(default_factory=ModelParams)
    train: TrainParams = Field(default_factory=TrainParams)
    evaluate: EvaluateParams = Field(default_factory=EvaluateParams)
    export: ExportParams = Field(default_factory=ExportParams)
    card: CardParams = Field(default_factory=CardParams)
    distill: DistillParams = Field(default_factory=DistillParams)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def student(self) -> Params:
        """The params the student_* stages run with: distill.tokenize, distill.model, distill.train and distill.export
        in place of the teacher's; every other section is the run's own."""
        distill = self.distill
        return self.model_copy(update={"tokenize": distill.tokenize, "model": distill.model, "train": distill.train,
                                       "export": distill.export})

    @model_validator(mode="after")
    def _student_smaller_than_teacher(self) -> Params:
        teacher = self.model
        # A pretrained or external teacher's size is in its config.json: check_params compares it there.
        if self.distill.enabled and self.distill.external_teacher is None and teacher.init == "scratch":
            size = transformer_parameters(teacher.architecture(), self.tokenize.vocab_size, teacher.tie_embeddings)
            if problem := self.distill.not_smaller_than(size, f"the teacher (model.preset {teacher.preset})"):
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _weights_name_the_directions(self) -> Params:
        for where, train in (("train", self.train), ("distill.train", self.distill.train)):
            if unknown := [name for name in train.direction_weights if name not in self.data.directions.names]:
                raise ValueError(
                    f"{where}.direction_weights: {', '.join(unknown)} is not in data.directions "
                    f"{self.data.directions.names}")
        return self

    @model_validator(mode="after")
    def _one_vocabulary_for_several_directions(self) -> Params:
        if not self.tokenize.joint and len(self.data.directions.directions) > 1 and self.model.init == "scratch":
            raise ValueError(
                "tokenize.joint: false (one SentencePiece model per side) is for one direction; with "
                f"data.directions {self.data.directions.names} languages appear on either side: use "
                "tokenize.joint: true"
            )
        return self

    @model_validator(mode="after")
    def _sampling_needs_a_trained_tokenizer(self) -> Params:
        if self.tokenize.sampled_copies and self.model.init == "pretrained":
            raise ValueError("tokenize.sampled_copies samples the SentencePiece model this pipeline trains; with "
                             "model.init: pretrained the checkpoint's own tokenizer encodes the data: set "
                             "tokenize.sampled_copies: 0")
        return self

    @model_validator(mode="after")
    def _languages_are_checkable(self) -> Params:
        if self.clean.min_script_share > 0:
            unknown = [lang for lang in self.data.directions.languages if lang not in SCRIPTS]
            if unknown:
                raise ValueError(
                    f"data.directions: no script is known for {', '.join(map(repr, unknown))}, so "
                    f"clean.min_script_share cannot check it (known: {' '.join(sorted(SCRIPTS))}); add it to "
                    "pipeline/runtime/languages.py SCRIPTS or set clean.min_script_share: 0"
                )
        return self


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the schema allows beside the last part of `loc` (empty where loc leaves the typed sections)."""
    section: Any = Params
    for part in loc[:-1]:
        fields = {f.alias or name: f for name, f in section.model_fields.items()}
        annotation = fields[part].annotation if part in fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        section = annotation
    return [f.alias or name for name, f in section.model_fields.items()]


# Keys that were replaced: their own message, since "unknown key" would leave the user guessing.
MOVED_KEYS = {
    "data.src_lang": "replaced by data.directions: write `directions: [en-de]` (source-target)",
    "data.tgt_lang": "replaced by data.directions: write `directions: [en-de]` (source-target)",
}


def _unknown_key_message(key: str, loc: tuple[Any, ...], value: Any) -> str:
    if key in MOVED_KEYS:
        return f"  {key}: {MOVED_KEYS[key]}"
    if isinstance(value, dict):
        shown = f"a section of {len(value)} key{'s' if len(value) != 1 else ''}"
    else:
        shown = f"value {value!r}"
    close = difflib.get_close_matches(str(loc[-1]), _known_keys(loc), n=1) if loc else []
    hint = f"did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}?" if close else "check the spelling"
    return f"  {key}: unknown key ({shown}); {hint}"


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"{source}: {err.error_count()} invalid parameter(s):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(_unknown_key_message(key, tuple(e["loc"]), e["input"]))
        elif e["type"] == "missing":
            lines.append(f"  {key}: required")
        elif isinstance(e["input"], dict):  # a check across a section's keys: the message names them
            lines.append(f"  {key}: {e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"  {key} = {e['input']!r}: {e['msg']}")
    return "\n".join(lines)


def parse(raw: dict[str, Any] | None, source: str = PARAMS_FILE) -> Params:
    """Validate an already-loaded mapping; raises ParamsError naming each bad key and value."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: the top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ParamsError(_format_errors(err, source)) from None


def load(path: str | os.PathLike[str] = PARAMS_FILE) -> Params:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: params file not found (run from the project root)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    return parse(raw, str(path))
