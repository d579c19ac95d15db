"""The training-curves page that works offline: what `mtpipe plots` writes instead of plain `dvc plots show`.

`dvc plots show` writes a page that loads vega, vega-lite and vega-embed from a CDN (blank without network).
Here it is given `assets/web/plots.html` as its `--html-template`, a page that loads the same vega releases from
`static/web/` beside it; `pipeline.offline_pages` then copies them there and checks that the page loads nothing
from another host. The output directory carries a `.gitignore` of `*`: it is a view of `dvclive/`, not a file
to commit.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.offline_pages import make_offline
from pipeline.web_assets import WEB_ASSETS_DIR

PLOTS_TEMPLATE = WEB_ASSETS_DIR / "plots.html"
# Relative to the project; not a DVC output (no stage writes it), so it carries its own .gitignore.
PLOTS_DIR = Path("reports") / "plots"


def write_plots_page(dvc: list[str], project: Path, out_dir: Path, targets: list[str] = ()) -> Path:
    """Run `dvc plots show` in `project` into `out_dir` with the offline template; returns the page's path.

    `dvc` is the command that runs DVC (the environment's own), `targets` optional plot files or directories.
    """
    out_dir = out_dir if out_dir.is_absolute() else project / out_dir
    command = [*dvc, "plots", "show", "--html-template", str(PLOTS_TEMPLATE), "-o", str(out_dir), *targets]
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    out_dir.mkdir(parents=True, exist_ok=True)  # DVC creates only the last directory of the page's path
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    page = out_dir / "index.html"
    if result.returncode != 0 or not page.is_file():
        detail = (result.stderr or result.stdout).strip() or f"no {page} written"
        raise PipelineError(f"`{' '.join(command[len(dvc) - 1:])}` in {project} failed: {detail}")
    make_offline(out_dir)
    (out_dir / ".gitignore").write_text("*\n", encoding="utf-8")
    return page
