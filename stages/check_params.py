"""check_params: the DAG's first stage. The whole params file is validated against the schema before any stage works.

DVC reads only the params each stage declares, so without this stage an unknown section (`trian:` for `train:`) is
never seen by `dvc repro`, and a misspelt key inside a section (`train.lrr`) is found only when its own stage starts,
after DVC has already removed that stage's outputs from the workspace (a trained model gone until `dvc checkout`).
This stage depends on the whole of params.yaml and on the schema (pipeline/params.py), so it reruns on any change
to either, and a params file the schema rejects stops `dvc repro` here, with every bad key named as a dotted path.

With `model.init: pretrained` and a local `model.name_or_path`, the checkpoint's family is checked here too
(pipeline/families.py: its config.json and tokenizer_config.json, nothing loaded), so a checkpoint the pipeline
cannot export stops the DAG before download, not after tokenize. A missing directory that is not a hub name
(`org/name`) is refused the same way. Hub names are checked by tokenize, which loads them.

What it writes does not depend on the values (one fixed line): after a valid change, the stages downstream see the
same dependency as before, so only the stages whose own params changed rerun.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path
from pipeline.errors import PipelineError
from pipeline.families import check_local_checkpoint
from pipeline.params import Params

VALID = "params.yaml is valid against pipeline/params.py\n"


def check_checkpoint(name_or_path: str) -> None:
    """A local checkpoint must be of a supported family; a path that is neither a directory nor a hub name
    (`org/name` or `name`) is refused naming the parameter."""
    if Path(name_or_path).is_dir():
        check_local_checkpoint(Path(name_or_path))
    elif name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise PipelineError(f"model.name_or_path {name_or_path!r}: no such directory (and not a hub name "
                            "such as facebook/mbart-large-50)")


def run(params: Params, paths: Paths) -> dict[str, Any]:
    # `params` arrives validated: pipeline.stage.main loads it and exits 1 naming each bad key, before this runs.
    if params.model.init == "pretrained" and params.model.name_or_path:
        check_checkpoint(params.model.name_or_path)
    with atomic_path(paths.params_checked) as tmp:
        tmp.write_text(VALID, encoding="utf-8")
    return {"sections": len(type(params).model_fields)}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "check_params")
