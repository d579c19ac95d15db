"""A model's languages, recorded once: `languages.json`, which the tokenize stage writes beside the tokenizer and
which travels with it into `models/final` and `models/export`. `ModelLanguages.read` is its one reader: every stage,
the export, `mtpipe translate`, the service and the card read a model's directions, family and codes through it.

    {"directions": ["en-de", "en-fr"], "family": "marian", "codes": {"de": ">>de<<", "fr": ">>fr<<"},
     "layouts": {"en-de": {"source_prefix": [2], "source_suffix": [0], ...}, ...}}

`<split>.dir.npy` indexes `directions` (pipeline/token_arrays.py). Each direction's layout says where its special
ids go around a source's pieces, around a target's, and what decoding starts from:

    family          source ids                 labels                    decoder starts from
    marian          [>>de<<] X </s>            X </s>                    <pad>
    mbart (cc25)    X </s> en_XX               X </s> de_DE              de_DE (mBART's wrap-around shift)
    mbart50, m2m100, nllb
                    en_XX X </s>               de_DE X </s>              </s> de_DE (the target code forced)

`decoder_prefix` = [decoder_start] + target_prefix: the tokens a translation is decoded after (transformers'
`forced_bos_token_id` is the second of them; ONNX, PyTorch and CTranslate2 all get the whole prefix). The tokenize
stage measures a checkpoint's layout on its tokenizer (stages/tokenize/checkpoint_tokenizer.py), so it is the
family's own placement. Stdlib only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.runtime.errors import PipelineError
from pipeline.runtime.families import FAMILIES, Family, check_local_checkpoint
from pipeline.runtime.languages import Directions

LANGUAGES_FILE = "languages.json"


class LanguagesFileError(PipelineError):
    """A languages.json that is missing, malformed, or of another family than the checkpoint beside it."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}; the tokenize stage writes it and it travels with the model: rerun the "
                         "pipeline from tokenize (`dvc repro`)")
        self.path = path


@dataclass(frozen=True)
class DirectionLayout:
    source_prefix: tuple[int, ...]
    source_suffix: tuple[int, ...]
    target_prefix: tuple[int, ...]
    target_suffix: tuple[int, ...]
    decoder_start: int

    @property
    def decoder_prefix(self) -> tuple[int, ...]:
        """What decoding starts from: the start token, then the target's prefix (its language code)."""
        return (self.decoder_start, *self.target_prefix)

    def source(self, pieces: Sequence[int]) -> list[int]:
        """A source's ids from its pieces' ids."""
        return [*self.source_prefix, *pieces, *self.source_suffix]

    def special_ids(self) -> set[int]:
        return {*self.source_prefix, *self.source_suffix, *self.target_prefix, *self.target_suffix,
                self.decoder_start}

    def to_json(self) -> dict[str, Any]:
        return {"source_prefix": list(self.source_prefix), "source_suffix": list(self.source_suffix),
                "target_prefix": list(self.target_prefix), "target_suffix": list(self.target_suffix),
                "decoder_start": self.decoder_start}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DirectionLayout:
        ids = {key: tuple(int(i) for i in data[key])
               for key in ("source_prefix", "source_suffix", "target_prefix", "target_suffix")}
        return cls(**ids, decoder_start=int(data["decoder_start"]))


def split_framing(full: Sequence[int], pieces: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefix, suffix) of `full` around `pieces` (the tokenizer's ids of a text with and without its special
    tokens); ValueError when `pieces` is not one contiguous run inside `full`."""
    full, pieces = list(full), list(pieces)
    for start in range(len(full) - len(pieces) + 1):
        if full[start : start + len(pieces)] == pieces:
            return tuple(full[:start]), tuple(full[start + len(pieces) :])
    raise ValueError(f"the ids {full} do not contain the text's pieces {pieces} in one run")


def family_named(name: str) -> Family:
    """The family called `name`; ValueError listing the families otherwise."""
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"family {name!r} is not one of {', '.join(f.name for f in FAMILIES)}")


@dataclass(frozen=True)
class ModelLanguages:
    """Everything `languages.json` records: the directions (in the order `dir.npy` indexes them), the checkpoint
    family, each language's code in the tokenizer ({} for a model that needs none) and each direction's layout."""

    directions: Directions
    family: Family
    codes: Mapping[str, str]
    layouts: Mapping[str, DirectionLayout]

    def layout(self, direction: object) -> DirectionLayout:
        return self.layouts[str(direction)]

    @property
    def target_tags(self) -> bool:
        """True when a Marian model's sources start with a token of their own, the target's tag (a multi-target
        model); other families' language codes are not tags."""
        return self.family.name == "marian" and any(layout.source_prefix for layout in self.layouts.values())

    @property
    def special_ids(self) -> set[int]:
        """Every id a layout places (codes, tags, the decoder's start): none of them belongs in a translation's text."""
        return {i for layout in self.layouts.values() for i in layout.special_ids()}

    def to_json(self) -> dict[str, Any]:
        return {"directions": self.directions.names, "family": self.family.name, "codes": dict(self.codes),
                "layouts": {name: self.layouts[name].to_json() for name in self.directions.names}}

    def write(self, directory: Path) -> Path:
        path = Path(directory) / LANGUAGES_FILE
        path.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, directory: Path) -> ModelLanguages:
        """The languages of the model in `directory`. LanguagesFileError naming the file when it is missing or
        malformed, lacks a direction's layout, or names another family than the checkpoint files beside it
        (config.json and tokenizer_config.json, where the directory holds a checkpoint)."""
        path = Path(directory) / LANGUAGES_FILE
        # A checkpoint of no supported family is refused as such (UnsupportedCheckpoint), whatever the file says.
        checkpoint = check_local_checkpoint(directory) if (Path(directory) / "config.json").is_file() else None
        try:
            recorded = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise LanguagesFileError(path, "not found (a model directory records its languages there)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise LanguagesFileError(path, f"not JSON ({err})") from None
        try:
            directions = Directions.of(recorded["directions"])
            if not directions.directions:
                raise ValueError("it lists no directions")
            if len(set(directions.names)) != len(directions.names):
                twice = next(n for i, n in enumerate(directions.names) if n in directions.names[:i])
                raise ValueError(f"{twice} is listed twice")
            languages = cls(directions, family_named(recorded["family"]), dict(recorded.get("codes", {})),
                            {name: DirectionLayout.from_json(recorded["layouts"][name]) for name in directions.names})
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            problem = f"no {err} field" if isinstance(err, KeyError) else str(err)
            raise LanguagesFileError(path, "not a languages record with every direction's layout "
                                           f"({problem})") from None
        if checkpoint is not None and checkpoint != languages.family:
            raise LanguagesFileError(path, f"family {languages.family.name!r}, but the checkpoint beside it is a "
                                           f"{checkpoint.name} one")
        return languages
