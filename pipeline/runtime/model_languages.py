"""Where the special ids of each direction go: around a source's pieces, around a target's, and what decoding
starts from. Recorded by the tokenize stage in `languages.json` (beside `directions`), read by every stage after.

    family          source ids                 labels                    decoder starts from
    marian          [>>de<<] X </s>            X </s>                    <pad>
    mbart (cc25)    X </s> en_XX               X </s> de_DE              de_DE (mBART's wrap-around shift)
    mbart50, m2m100, nllb
                    en_XX X </s>               de_DE X </s>              </s> de_DE (the target code forced)

`decoder_prefix` = [decoder_start] + target_prefix: the tokens a translation is decoded after (transformers'
`forced_bos_token_id` is the second of them; ONNX, PyTorch and CTranslate2 all get the whole prefix, so every
direction is generated in its own language). A hypothesis is what follows the prefix.

The tokenize stage measures the layout on the tokenizer itself (`tokenizer(probe)` against the probe's plain
pieces), so it is the family's own placement, whatever the family; the train stage shifts labels with
`decoder_start` per row, as the family's model does.

Stdlib only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.runtime.languages import LANGUAGES_FILE, Directions


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


@dataclass(frozen=True)
class ModelLanguages:
    """Everything `languages.json` records: the directions, the checkpoint family and language codes, and each
    direction's layout."""

    directions: Directions
    family: str
    codes: Mapping[str, str]
    layouts: Mapping[str, DirectionLayout]

    def layout(self, direction: object) -> DirectionLayout:
        return self.layouts[str(direction)]

    def to_json(self) -> dict[str, Any]:
        return {**self.directions.to_json(), "family": self.family, "codes": dict(self.codes),
                "layouts": {name: self.layouts[name].to_json() for name in self.directions.names}}

    def write(self, directory: Path) -> Path:
        path = Path(directory) / LANGUAGES_FILE
        path.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, directory: Path) -> ModelLanguages:
        """The languages file of `directory`; ValueError naming the file when it lacks a direction's layout
        (written before layouts were recorded: rerun from tokenize)."""
        directions = Directions.read(directory)
        path = Path(directory) / LANGUAGES_FILE
        recorded = json.loads(path.read_text(encoding="utf-8"))
        try:
            layouts = {name: DirectionLayout.from_json(recorded["layouts"][name]) for name in directions.names}
            return cls(directions, str(recorded["family"]), dict(recorded.get("codes", {})), layouts)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: no layout of the directions' special ids ({err!r} missing or malformed): "
                             "it was written by an older version") from None
