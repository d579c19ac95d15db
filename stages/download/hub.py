"""The hub source: a Hugging Face dataset that holds translations (data.source: hub, and the wmt14 preset of it),
streamed with `datasets` so memory stays bounded.

The dataset is a hub id, read at one commit (data.hub.revision resolved once, so every split comes from the same
commit and the manifest names it), or a local directory in the hub's layout (script-free Parquet or JSON files per
split; configurations declared in README.md's `configs:` block, else one default), whose data files the manifest
hashes. Each direction of data.directions reads one configuration (data.hub.name, else the one named after its
pair either way round: de-en serves en-de and de-en), and its text from a `translation` column of {lang: text}
dicts (wmt14/16/19, opus-100, opus_books, europarl) or one text column per language (bentrevett/multi30k). Before a
row is written, every direction's configuration, every split and the columns are checked, and a missing one is an
error naming it and listing what the dataset has. With no route to the hub it fails at once and says what to do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import HubUnreachable
from pipeline.params import HubParams
from pipeline.runtime.errors import InputFileError, PipelineError
from pipeline.runtime.languages import Direction
from stages.download.inputs import Pair

# A configuration named after a language pair: de-en, iwslt2017-de-en, opus_de-en.
CONFIG_PAIR = re.compile(r"(?:^|[-_.])([a-z]{2,3})-([a-z]{2,3})$")
TRANSLATION = "translation"


# --- the datasets calls (one place, so each is made with the resolved revision) -----------------------------


def _config_names(path: str, revision: str | None) -> list[str]:
    from datasets import get_dataset_config_names

    return list(get_dataset_config_names(path, revision=revision))


def _builder(path: str, config: str, revision: str | None) -> Any:
    from datasets import load_dataset_builder

    return load_dataset_builder(path, config, revision=revision)


def _stream(path: str, config: str, split: str, revision: str | None) -> Any:
    from datasets import load_dataset

    return load_dataset(path, config, split=split, streaming=True, revision=revision)


# --- reaching the hub -----------------------------------------------------------------------------------------


def _unreachable(hub: HubParams, why: str) -> HubUnreachable:
    splits = ", ".join(f"{ours}: {theirs}" for ours, theirs in hub.splits.items())
    return HubUnreachable(
        f"Hugging Face hub is unreachable ({why}), so {hub.path} cannot be downloaded. Download it where you have "
        f"network access (`hf download {hub.path} --repo-type dataset --local-dir DIR`) and read it from there "
        f"(data.source: hub, data.hub: {{path: DIR, splits: {{{splits}}}}}), or point data.source: files at local "
        "parallel files (data.files.<split>: {src, tgt}, {tsv}, {dir} or {pattern}, plain or .gz)."
    )


def check_hub_reachable(hub: HubParams, timeout: float = 5.0) -> None:
    """Fail at once, not after datasets' retry loop, when the hub cannot be reached."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes", "on"):
            raise _unreachable(hub, f"{var} is set")
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    url = f"{constants.ENDPOINT}/api/datasets/{hub.path}"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except (urllib.error.URLError, OSError) as err:
        if isinstance(err, urllib.error.HTTPError) and err.code < 500:
            return  # the hub answered (e.g. 401/404 from a gated endpoint): reachable
        raise _unreachable(hub, f"{url}: {getattr(err, 'reason', err)}") from None


def resolve_revision(path: str, revision: str | None) -> str | None:
    """The commit of the dataset repository that `revision` (null: the default branch) points to now, so every
    split is read from the same commit and the manifest can name it."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        return HfApi().dataset_info(path, revision=revision).sha or revision
    except GatedRepoError:
        raise PipelineError(f"data.hub.path {path!r}: a gated dataset; accept its terms on the hub and set "
                            "HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise PipelineError(f"data.hub.path {path!r}: no such dataset on the hub, and no such local "
                            "directory") from None
    except RevisionNotFoundError:
        raise PipelineError(f"data.hub.revision {revision!r}: {path} has no such branch, tag or commit") from None
    except HfHubHTTPError as err:
        raise PipelineError(f"{path}: cannot resolve revision {revision or 'main'!r}: {err}") from None


# --- one direction's configuration, splits and columns ------------------------------------------------------


@dataclass(frozen=True)
class TextColumns:
    """Where a direction's two sides are in a row: row[column][lang] for a column of {lang: text} dicts,
    row[column] for one column per language."""

    src: tuple[str, ...]
    tgt: tuple[str, ...]


@dataclass
class DirectionSource:
    """What one direction reads: its configuration, its text, and each split's dataset split and size."""

    direction: Direction
    config: str
    text: TextColumns
    splits: dict[str, tuple[str, int | None]]  # split here -> (the dataset's split, its rows when known)
    files: list[str] = field(default_factory=list)  # a local directory's data files it reads


def choose_config(direction: Direction, configs: list[str], name: str | dict[str, str] | None, where: str) -> str:
    """The configuration that serves `direction`: data.hub.name's, else the one named after the pair either way
    round, else the dataset's only one."""
    wanted = name.get(str(direction)) if isinstance(name, dict) else name
    if wanted is not None:
        if wanted not in configs:
            raise PipelineError(f"{where}: no configuration {wanted!r} (data.hub.name); its configurations are "
                                f"{', '.join(configs)}")
        return wanted
    pair = {direction.src, direction.tgt}
    named = [c for c in configs if (m := CONFIG_PAIR.search(c)) and {m[1], m[2]} == pair]
    if len(named) == 1:
        return named[0]
    if not named and len(configs) == 1:
        return configs[0]
    found = f"several configurations for {direction} ({', '.join(named)})" if named else (
        f"no configuration for {direction} either way round; its configurations are {', '.join(configs)}")
    raise PipelineError(f"{where}: {found}: set data.hub.name")


def _languages(feature: Any) -> list[str] | None:
    """The languages of a column of {lang: text} dicts (a Translation feature, a struct, or a sampled dict)."""
    if hasattr(feature, "languages"):
        return list(feature.languages)
    return list(feature) if isinstance(feature, dict) else None


def text_columns(columns: str | dict[str, str] | None, features: dict[str, Any], direction: Direction,
                 where: str) -> TextColumns:
    """Where `direction`'s text is among a configuration's columns (data.hub.columns, or found by name)."""
    have = ", ".join(features)
    if isinstance(columns, dict):
        src, tgt = columns[direction.src], columns[direction.tgt]
        if missing := [c for c in (src, tgt) if c not in features]:
            raise PipelineError(f"{where}: no column {', '.join(missing)} (data.hub.columns); its columns are {have}")
        return TextColumns((src,), (tgt,))
    column = columns or (TRANSLATION if TRANSLATION in features else None)
    if column is None:
        if direction.src in features and direction.tgt in features:
            return TextColumns((direction.src,), (direction.tgt,))
        raise PipelineError(f"{where}: no {TRANSLATION!r} column and no columns named {direction.src} and "
                            f"{direction.tgt}; its columns are {have}: set data.hub.columns")
    if column not in features:
        raise PipelineError(f"{where}: no column {column!r}; its columns are {have}")
    languages = _languages(features[column])
    if languages is None:
        raise PipelineError(f"{where}: column {column!r} is not a column of {{language: text}} dicts "
                            f"({features[column]}): set data.hub.columns to {{language: column}}")
    if missing := [lang for lang in (direction.src, direction.tgt) if lang not in languages]:
        raise PipelineError(f"{where}: its {column!r} column has no {', '.join(missing)} text; its languages are "
                            f"{', '.join(languages)}")
    return TextColumns((column, direction.src), (column, direction.tgt))


def _data_files(builder: Any) -> dict[str, list[str]]:
    """Split -> its data files, as the builder resolved them (split names as plain strings)."""
    return {str(split): [str(f) for f in files] for split, files in (builder.config.data_files or {}).items()}


def _rows_known(builder: Any, split: str) -> int | None:
    """A split's size: as the dataset card states it, else counted from a local directory's Parquet footers."""
    info = {str(name): one for name, one in (builder.info.splits or {}).items()}.get(split)
    if info is not None and info.num_examples:
        return int(info.num_examples)
    files = _data_files(builder).get(split, [])
    if files and all(os.path.isfile(f) and f.endswith(".parquet") for f in files):
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return None


# --- the dataset ----------------------------------------------------------------------------------------------


class HubDataset:
    """One dataset, local or on the hub at one resolved commit, and what each direction reads from it."""

    def __init__(self, hub: HubParams, root: Path) -> None:
        self.hub = hub
        local = Path(os.path.expanduser(hub.path))
        local = local if local.is_absolute() else root / local
        self.local = local.is_dir()
        if not self.local and hub.path.startswith((".", "/", "~")):
            raise PipelineError(f"data.hub.path {hub.path!r}: no such directory ({local})")
        if self.local and hub.revision is not None:
            raise PipelineError(f"data.hub.revision {hub.revision!r}: {hub.path} is a local directory, which has "
                                "no revisions: set it to null")
        self.path = str(local) if self.local else hub.path
        self.revision: str | None = None
        if not self.local:
            check_hub_reachable(hub)
            self.revision = resolve_revision(hub.path, hub.revision)

    def configs(self) -> list[str]:
        try:
            return _config_names(self.path, self.revision)
        except FileNotFoundError as err:  # datasets' DatasetNotFoundError, or a directory without data files
            raise PipelineError(f"data.hub.path {self.hub.path!r}: {err}") from None

    def direction_source(self, direction: Direction, configs: list[str]) -> DirectionSource:
        """What `direction` reads, every split and column checked to exist."""
        config = choose_config(direction, configs, self.hub.name, self.hub.path)
        where = f"{self.hub.path} configuration {config}"
        builder = _builder(self.path, config, self.revision)
        data_files = _data_files(builder)
        available = list(data_files) or [str(name) for name in builder.info.splits or {}]
        splits = {}
        for ours, theirs in self.hub.splits.items():
            if theirs not in available:
                raise PipelineError(f"{where}: no split {theirs!r} (data.hub.splits.{ours}); its splits are "
                                    f"{', '.join(available)}")
            splits[ours] = (theirs, _rows_known(builder, theirs))
        text = text_columns(self.hub.columns, self._features(builder, config), direction, where)
        files = [f for theirs, _ in splits.values() for f in data_files.get(theirs, [])]
        return DirectionSource(direction, config, text, splits, files if self.local else [])

    def _features(self, builder: Any, config: str) -> dict[str, Any]:
        """Column name -> feature, from the dataset card, else from the first data file, else from the first row."""
        if builder.info.features:
            return dict(builder.info.features)
        stream = _stream(self.path, config, next(iter(self.hub.splits.values())), self.revision)
        if stream.features:
            return dict(stream.features)
        return dict(next(iter(stream), {}))

    def pairs(self, source: DirectionSource, split: str) -> Iterator[Pair]:
        """One direction's pairs of a split, oriented as the direction says; origin names dataset, config, split."""
        theirs, _ = source.splits[split]
        rows = _stream(self.path, source.config, theirs, self.revision)
        origin = f"{self.hub.path}:{source.config}:{theirs}"
        src_lang, tgt_lang = source.direction.src, source.direction.tgt
        for n, row in enumerate(rows, start=1):
            yield (_text(row, source.text.src, src_lang, origin, n), _text(row, source.text.tgt, tgt_lang, origin, n),
                   origin, n)


def _text(row: dict[str, Any], keys: tuple[str, ...], lang: str, origin: str, line: int) -> str:
    value: Any = row
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, str):
        raise InputFileError(origin, f"row has no {lang} text ({'.'.join(keys)} is {value!r})", line)
    return value
