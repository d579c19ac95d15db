"""The training-curves page that works offline: what `mtpipe plots` writes instead of plain `dvc plots show`.

`dvc plots show` writes a page that loads vega, vega-lite and vega-embed from a CDN (blank without network).
Here it is given `assets/web/plots.html` as its `--html-template`, a page that loads the same vega releases from
`static/web/` beside it; `pipeline.offline_pages` then copies them there and checks that the page loads nothing
from another host. Each chart is titled by its metric (DVC titles it by its file's path), and a page of one
revision has no revision legend. The output directory carries a `.gitignore` of `*`: it is a view of `dvclive/`,
not a file to commit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from pipeline.offline_pages import make_offline
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.web_assets import WEB_ASSETS_DIR

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
    page.write_text(tidy_charts(page.read_text(encoding="utf-8")), encoding="utf-8")
    make_offline(out_dir)
    (out_dir / ".gitignore").write_text("*\n", encoding="utf-8")
    return page


# One vega-lite spec per chart, on its own line of DVC's page: `var spec = {...};`.
_SPEC_LINE = re.compile(r"^(\s*var spec = )(\{.*\});$", re.MULTILINE)
_METRICS_DIR = "plots/metrics/"


def chart_title(path: str) -> str:
    """`dvclive/plots/metrics/train/loss.tsv` -> `train: loss`; `.../system/cpu_percent.tsv` -> `system: cpu
    percent`."""
    name = path.split(_METRICS_DIR, 1)[-1].removesuffix(".tsv")
    group, _, metric = name.rpartition("/")
    return f"{group}: {metric.replace('_', ' ')}" if group else metric.replace("_", " ")


def _hide_revision_legend(node: Any) -> None:
    """`legend: null` on every colour encoding by revision: one revision needs no key."""
    if isinstance(node, dict):
        if node.get("field") == "rev" and "legend" not in node:
            node["legend"] = None
        for value in node.values():
            _hide_revision_legend(value)
    elif isinstance(node, list):
        for value in node:
            _hide_revision_legend(value)


def tidy_charts(html: str) -> str:
    """DVC's page, each chart titled by its metric rather than its file path, and without the revision legend when
    the page shows a single revision (the workspace, as `mtpipe plots` draws it)."""

    def tidy(match: re.Match[str]) -> str:
        spec = json.loads(match[2])
        title = spec.get("title")
        if isinstance(title, dict) and isinstance(title.get("text"), str):
            title["text"] = chart_title(title["text"])
        revisions = {row.get("rev") for row in spec.get("data", {}).get("values", []) if isinstance(row, dict)}
        if len(revisions) <= 1:
            for key in ("encoding", "layer"):
                _hide_revision_legend(spec.get(key))
        return f"{match[1]}{json.dumps(spec)};"

    return _SPEC_LINE.sub(tidy, html)
