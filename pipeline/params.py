"""The params schema: `params.yaml` is read once, here, into typed sections.

An unknown key, a wrong type or an out-of-range value fails before any work is done, with a message that
names the key (as a dotted path) and the bad value. Stages receive the typed `Params` object, never the raw
mapping. This module imports only pydantic and yaml so every stage and the CLI start fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

PARAMS_FILE = "params.yaml"


class ParamsError(ValueError):
    """params.yaml is missing, unreadable or invalid; the message names every bad key and value."""


class _Section(BaseModel):
    # extra="forbid": a misspelt key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", frozen=True)


class SplitFiles(_Section):
    src: str = Field(min_length=1)
    tgt: str = Field(min_length=1)


WMT14_PAIRS = {"cs", "de", "fr", "hi", "ru"}


class DataParams(_Section):
    source: Literal["sample", "files", "wmt14"] = "sample"
    src_lang: str = Field("en", pattern=r"^[a-z]{2,3}$")
    tgt_lang: str = Field("de", pattern=r"^[a-z]{2,3}$")
    # split name -> files; "train" and "valid" are required, every other split is a test set.
    files: dict[str, SplitFiles] = Field(default_factory=dict)
    # Deterministic cap on training pairs (the first N); null keeps them all.
    max_train_pairs: Annotated[int, Field(gt=0)] | None = None

    @field_validator("files")
    @classmethod
    def _split_names_are_safe(cls, files: dict[str, SplitFiles]) -> dict[str, SplitFiles]:
        for name in files:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"split name {name!r} must be letters, digits, '-' or '_'")
        return files

    @model_validator(mode="after")
    def _source_is_complete(self) -> DataParams:
        if self.src_lang == self.tgt_lang:
            raise ValueError(f"src_lang and tgt_lang are both {self.src_lang!r}")
        if self.source == "files":
            missing = [s for s in ("train", "valid") if s not in self.files]
            if missing:
                raise ValueError(f"source 'files' needs data.files.{missing[0]} (train and valid are required)")
            if len(self.files) < 3:
                raise ValueError("source 'files' needs at least one test split besides train and valid")
        if self.source == "wmt14":
            pair = {self.src_lang, self.tgt_lang}
            if "en" not in pair or not (pair - {"en"}) <= WMT14_PAIRS:
                raise ValueError(
                    f"WMT14 has no {self.src_lang}-{self.tgt_lang} pair; it pairs en with one of "
                    f"{sorted(WMT14_PAIRS)}"
                )
        return self


class CleanParams(_Section):
    unicode_form: Literal["NFC", "NFKC"] = "NFC"
    min_chars: int = Field(1, ge=1)
    max_chars: int = Field(1000, ge=1)
    max_words: int = Field(250, ge=1)
    max_length_ratio: float = Field(3.0, gt=1.0)
    # The ratio filter is unreliable on very short segments ("Yes." / "Ja, gerne."), so it only applies above this.
    ratio_min_chars: int = Field(10, ge=0)
    deduplicate: bool = True

    @model_validator(mode="after")
    def _bounds(self) -> CleanParams:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) is larger than max_chars ({self.max_chars})")
        return self


class ValidateParams(_Section):
    min_rows: int = Field(1, ge=1)
    # Share of rows allowed outside the soft bounds before the suite fails.
    mostly: float = Field(1.0, ge=0.0, le=1.0)


class TokenizeParams(_Section):
    model_type: Literal["unigram", "bpe"] = "unigram"
    vocab_size: int = Field(8000, ge=100, le=65000)
    character_coverage: float = Field(1.0, gt=0.9, le=1.0)
    byte_fallback: bool = True
    input_sentence_size: int = Field(2_000_000, ge=1000)
    threads: int | Literal["auto"] = 2
    seed: int = Field(1, ge=0)


# Architecture presets. cpu-ref is the reference model for 2-core CPUs; base and big are Vaswani et al. 2017.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=64, encoder_layers=2, decoder_layers=2, attention_heads=4, ffn_dim=256, dropout=0.1),
    "cpu-ref": dict(d_model=256, encoder_layers=3, decoder_layers=3, attention_heads=4, ffn_dim=1024, dropout=0.1),
    "base": dict(d_model=512, encoder_layers=6, decoder_layers=6, attention_heads=8, ffn_dim=2048, dropout=0.1),
    "big": dict(d_model=1024, encoder_layers=6, decoder_layers=6, attention_heads=16, ffn_dim=4096, dropout=0.3),
}


class ModelParams(_Section):
    preset: Literal["tiny", "cpu-ref", "base", "big"] = "tiny"
    init: Literal["scratch", "pretrained"] = "scratch"
    # A local directory or hub name of a transformers seq2seq model, used when init is "pretrained".
    name_or_path: str | None = None
    # Individual fields override the preset; null means "as the preset says".
    d_model: Annotated[int, Field(ge=8)] | None = None
    encoder_layers: Annotated[int, Field(ge=1)] | None = None
    decoder_layers: Annotated[int, Field(ge=1)] | None = None
    attention_heads: Annotated[int, Field(ge=1)] | None = None
    ffn_dim: Annotated[int, Field(ge=8)] | None = None
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    tie_embeddings: bool = True
    max_positions: int = Field(512, ge=16)

    @model_validator(mode="after")
    def _consistent(self) -> ModelParams:
        if self.init == "pretrained" and not self.name_or_path:
            raise ValueError("init 'pretrained' needs model.name_or_path")
        arch = self.architecture()
        if arch["d_model"] % arch["attention_heads"]:
            raise ValueError(f"d_model ({arch['d_model']}) must be divisible by attention_heads ({arch['attention_heads']})")
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
    max_steps: int = Field(1000, ge=1)
    max_epochs: int | None = Field(None, ge=1)
    max_minutes: float | None = Field(None, gt=0)
    lr: float = Field(7e-4, gt=0, le=1.0)
    warmup_steps: int = Field(400, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0)
    clip_norm: float = Field(1.0, ge=0)
    max_tokens: int = Field(4096, ge=16)
    # Longest sequence (tokens, incl. </s>) fed to the model; longer pairs are truncated and counted.
    max_len: int = Field(256, ge=8)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    nproc: int | Literal["auto"] = Field(1)
    threads: int | None = Field(None, ge=1)
    seed: int = Field(1, ge=0)
    log_every: int = Field(10, ge=1)
    valid_every: int = Field(200, ge=1)

    @field_validator("nproc")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1 or 'auto'")
        return v


class EvaluateParams(_Section):
    beam: int = Field(4, ge=1, le=64)
    length_penalty: float = Field(1.0, ge=0.0)
    # Maximum output length = max_len_a * source_length + max_len_b (fairseq convention).
    max_len_a: float = Field(1.2, ge=0)
    max_len_b: int = Field(10, ge=1)
    max_tokens: int = Field(2000, ge=16)


class ExportParams(_Section):
    onnx: bool = True
    torchscript: bool = True
    opset: int = Field(18, ge=14)
    parity_sentences: int = Field(64, ge=1)
    max_logit_diff: float = Field(1e-4, gt=0)
    min_identical: float = Field(0.99, ge=0, le=1)


class Params(_Section):
    data: DataParams = Field(default_factory=DataParams)
    clean: CleanParams = Field(default_factory=CleanParams)
    validate_: ValidateParams = Field(default_factory=ValidateParams, alias="validate")
    tokenize: TokenizeParams = Field(default_factory=TokenizeParams)
    model: ModelParams = Field(default_factory=ModelParams)
    train: TrainParams = Field(default_factory=TrainParams)
    evaluate: EvaluateParams = Field(default_factory=EvaluateParams)
    export: ExportParams = Field(default_factory=ExportParams)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"{source}: {err.error_count()} invalid parameter(s):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key (value {e['input']!r}); check the spelling against params.yaml")
        elif e["type"] == "missing":
            lines.append(f"  {key}: required")
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
