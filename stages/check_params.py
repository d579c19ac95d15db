"""check_params: the DAG's first stage. The whole params file is validated against the schema before any stage works.

DVC reads only the params each stage declares, so without this stage an unknown section (`trian:` for `train:`) is
never seen by `dvc repro`, and a misspelt key inside a section (`train.lrr`) is found only when its own stage starts,
after DVC has already removed that stage's outputs from the workspace (a trained model gone until `dvc checkout`).
This stage depends on the whole of params.yaml and on the schema (pipeline/params.py), so it reruns on any change
to either, and a params file the schema rejects stops `dvc repro` here, with every bad key named as a dotted path.

What it writes does not depend on the values (one fixed line): after a valid change, the stages downstream see the
same dependency as before, so only the stages whose own params changed rerun.
"""

from __future__ import annotations

from typing import Any

from pipeline.artifacts import Paths, atomic_path
from pipeline.params import Params

VALID = "params.yaml is valid against pipeline/params.py\n"


def run(params: Params, paths: Paths) -> dict[str, Any]:
    # `params` arrives validated: pipeline.stage.main loads it and exits 1 naming each bad key, before this runs.
    with atomic_path(paths.params_checked) as tmp:
        tmp.write_text(VALID, encoding="utf-8")
    return {"sections": len(type(params).model_fields)}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "check_params")
