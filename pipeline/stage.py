"""The thin `__main__` every stage shares: load params once, run the stage, print one summary line.

`python -m stages.<name>` calls `main(run, "<name>")`. A `PipelineError` or `ParamsError` exits with status 1
and its message (no traceback): these are the user's errors, and the message says what to fix.

`python -m stages.<name> --student` runs the same stage for the distilled student (the `student_*` stages of
dvc.yaml): with `Params.student()` on `Paths(role="student")`. With `distill.enabled: false` it only writes a note
into each of its outputs, so the DAG stays one file that DVC can always reproduce.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, write_json
from pipeline.params import Params, ParamsError, load
from pipeline.runtime.errors import PipelineError

log = logging.getLogger("mtpipe")

StageFn = Callable[[Params, Paths], dict[str, Any]]


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )


STUDENT_FLAG = "--student"
DISABLED_NOTE = "distill.enabled is false in params.yaml: no student is distilled"


def write_disabled(paths: Paths, stage: str) -> dict[str, Any]:
    """Each output of a student stage as a note that distillation is off (DVC needs every declared output)."""
    for path in paths.outputs(stage):
        if path.suffix == ".json":
            write_json(path, {"distill": "disabled"})
            continue
        with atomic_path(path) as tmp:
            tmp.mkdir()
            (tmp / "DISABLED").write_text(DISABLED_NOTE + "\n", encoding="utf-8")
    return {"distill": "disabled"}


def run_stage(run: StageFn, name: str, params: Params, student: bool, root: Path = Path(".")) -> dict[str, Any]:
    """The stage for the run's model, or for its student (write_disabled when distillation is off)."""
    if not student:
        return run(params, Paths(root))
    if not params.distill.enabled:
        return write_disabled(Paths(root).student(), name)
    return run(params.student(), Paths(root).student())


def main(run: StageFn, name: str, argv: list[str] | None = None) -> None:
    setup_logging()
    args = argv if argv is not None else sys.argv[1:]
    student = STUDENT_FLAG in args
    params_file = [a for a in args if a != STUDENT_FLAG] or ["params.yaml"]
    start = time.perf_counter()
    try:
        params = load(params_file[0])
        metrics = run_stage(run, name, params, student)
    except (PipelineError, ParamsError) as err:
        log.error("%s failed: %s", name, err)
        sys.exit(1)
    seconds = time.perf_counter() - start
    summary = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
    name = f"student {name}" if student else name
    log.info("%s done in %.1fs %s", name, seconds, json.dumps(summary, ensure_ascii=False))
