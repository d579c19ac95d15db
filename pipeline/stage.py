"""The thin `__main__` every stage shares: load params once, run the stage, print one summary line.

`python -m stages.<name>` calls `main(run, "<name>")`. A `PipelineError` or `ParamsError` exits with status 1
and its message (no traceback): these are the user's errors, and the message says what to fix.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from pipeline.artifacts import Paths
from pipeline.params import Params, ParamsError, load
from pipeline.runtime.errors import PipelineError

log = logging.getLogger("mtpipe")

StageFn = Callable[[Params, Paths], dict[str, Any]]


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )


def main(run: StageFn, name: str, argv: list[str] | None = None) -> None:
    setup_logging()
    params_file = (argv if argv is not None else sys.argv[1:]) or ["params.yaml"]
    start = time.perf_counter()
    try:
        params = load(params_file[0])
        metrics = run(params, Paths())
    except (PipelineError, ParamsError) as err:
        log.error("%s failed: %s", name, err)
        sys.exit(1)
    seconds = time.perf_counter() - start
    summary = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
    log.info("%s done in %.1fs %s", name, seconds, json.dumps(summary, ensure_ascii=False))
