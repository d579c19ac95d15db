"""check_params: the DAG's first stage. The whole params file is validated against the schema before any stage works.

DVC reads only the params each stage declares, so without this stage an unknown section (`trian:` for `train:`) is
never seen by `dvc repro`, and a misspelt key inside a section (`train.lrr`) is found only when its own stage starts,
after DVC has already removed that stage's outputs from the workspace (a trained model gone until `dvc checkout`).
This stage depends on the whole of params.yaml and on the schema (pipeline/params.py), so it reruns on any change
to either, and a params file the schema rejects stops `dvc repro` here, with every bad key named as a dotted path.

With `model.init: pretrained` the checkpoint is checked here too, from its files alone (pipeline/runtime/families.py:
its family from config.json and tokenizer_config.json, each direction's language codes from its vocabulary and special
tokens, a single-direction OPUS-MT checkpoint's source_lang/target_lang; nothing loaded, no torch), so a checkpoint
the pipeline cannot export, or one that cannot translate data.directions, stops the DAG before download, not after
tokenize. A hub name is checked the same way when its files are in the local Hugging Face cache (looked up offline);
one not downloaded yet is checked by tokenize, which downloads it, right after the files arrive. A missing
directory that is not a hub name (`org/name`) is refused naming the parameter.

`evaluate.sacrebleu_test_sets` is checked against sacreBLEU's own table of test sets and their language pairs
(pipeline/sacrebleu_sets.py, nothing downloaded): an unknown set, a direction a set has no references for, or a set
whose split name the data already uses stops the DAG here, naming it and listing what exists.

With `distill.enabled` and another run's export directory as `distill.teacher`, the teacher is checked from its
files: it must translate every direction of data.directions (its languages.json) and be larger than the student
(`distill.model`, against the teacher's config.json). A teacher that is this run's own model is checked by the
schema, from params alone.

What it writes does not depend on the values (one fixed line): after a valid change, the stages downstream see the
same dependency as before, so only the stages whose own params changed rerun.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, read_json
from pipeline.params import Params, transformer_parameters
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.families import check_checkpoint_languages
from pipeline.runtime.languages import Directions
from pipeline.sacrebleu_sets import check_test_sets

log = logging.getLogger("mtpipe.check_params")

VALID = "params.yaml is valid against pipeline/params.py\n"
# What a hub checkpoint's check reads; with any of them not cached yet, tokenize checks it after downloading it.
HUB_FILES = ("config.json", "tokenizer_config.json")


def not_a_hub_name(name_or_path: str, reason: str = "") -> PipelineError:
    return PipelineError(f"model.name_or_path {name_or_path!r}: no such directory, and not a hub name such as "
                         f"facebook/mbart-large-50{f' ({reason})' if reason else ''}")


def cached_hub_checkpoint(repo_id: str) -> Path | None:
    """The snapshot folder of hub checkpoint `repo_id` in the local Hugging Face cache when its config and
    tokenizer config are there; None when they are not (yet). Offline: the cache is read, nothing is fetched."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = [try_to_load_from_cache(repo_id, name) for name in HUB_FILES]
    except HFValidationError as err:
        raise not_a_hub_name(repo_id, str(err).splitlines()[0]) from None
    # A path when cached; None, or a marker that the hub has no such file, otherwise.
    return Path(found[0]).parent if all(isinstance(f, str) for f in found) else None


def check_checkpoint(name_or_path: str, directions: Directions, language_codes: Mapping[str, str]) -> None:
    """The checkpoint must be of a supported family and translate every direction (its files read, nothing
    loaded); a path that is neither a directory nor a hub name (`org/name` or `name`) is refused naming the
    parameter."""
    if name_or_path.startswith((".", "/", "~")) and not Path(name_or_path).is_dir():
        raise not_a_hub_name(name_or_path)
    directory = Path(name_or_path) if Path(name_or_path).is_dir() else cached_hub_checkpoint(name_or_path)
    if directory is None:
        log.info("model.name_or_path %s is not in the local Hugging Face cache: tokenize checks it once it has "
                 "downloaded it", name_or_path)
        return
    if check_checkpoint_languages(directory, directions, language_codes, f"model.name_or_path {name_or_path}") is None:
        log.info("model.name_or_path %s: its files name no language codes; tokenize checks the loaded tokenizer's",
                 name_or_path)


def check_teacher(params: Params) -> None:
    """An export directory named as distill.teacher translates every direction and is larger than the student."""
    teacher = Path(params.distill.teacher)
    where = f"distill.teacher {teacher}"
    for name in ("export.json", "languages.json", "config.json"):
        if not (teacher / name).is_file():
            raise PipelineError(f"{where}: no {name} there; name an export directory (a run's models/export)")
    languages = read_json(teacher / "languages.json")
    translated = languages.get("directions", [])
    missing = [d for d in params.data.directions.names if d not in translated]
    if missing:
        raise PipelineError(f"{where} does not translate {', '.join(missing)} (it translates "
                            f"{', '.join(translated) or 'nothing'}): every direction of data.directions needs it")
    config = read_json(teacher / "config.json")
    shape = {"d_model": config["d_model"], "ffn_dim": config["encoder_ffn_dim"],
             "encoder_layers": config["encoder_layers"], "decoder_layers": config["decoder_layers"]}
    teacher_size = transformer_parameters(shape, config["vocab_size"])
    if problem := params.distill.not_smaller_than(teacher_size, where):
        raise PipelineError(problem)


def run(params: Params, paths: Paths) -> dict[str, Any]:
    # `params` arrives validated: pipeline.stage.main loads it and exits 1 naming each bad key, before this runs.
    if params.model.init == "pretrained" and params.model.name_or_path:
        check_checkpoint(params.model.name_or_path, params.data.directions, params.model.language_codes)
    if params.distill.enabled and params.distill.external_teacher is not None:
        check_teacher(params)
    check_test_sets(params.evaluate.sacrebleu_test_sets, params.data.directions, params.data.split_names())
    with atomic_path(paths.params_checked) as tmp:
        tmp.write_text(VALID, encoding="utf-8")
    return {"sections": len(type(params).model_fields)}

