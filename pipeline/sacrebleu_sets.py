"""sacreBLEU's test sets as test splits (`evaluate.sacrebleu_test_sets`): which sets exist and which language pairs
they hold (sacreBLEU's own DATASETS table, known without the network, so check_params refuses an unknown set or a
missing pair before any work), the split each becomes (its name with '/' and '.' written '_': wmt14,
wmt20_robust_set1, multi30k_2016), and its sources and references fetched through sacreBLEU's own downloader into
its own cache (the SACREBLEU directory, default ~/.sacrebleu), so the text scored is the text `sacrebleu -t NAME
-l PAIR` scores. The fetch runs sacreBLEU in a child process: it reads SACREBLEU when imported and exits the
process on a bad download, and a child keeps both out of the stage. A set with several references gives its
first, as `sacrebleu --echo ref` does.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import CorpusMisaligned
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.languages import Direction, Directions

PARAM = "evaluate.sacrebleu_test_sets"

# Run in the child: the source file and the first reference file of one set and pair, fetched if not cached.
FETCH = """
import json, sys
from sacrebleu.dataset import DATASETS
from sacrebleu.utils import SACREBLEU_DIR
dataset, pair = DATASETS[sys.argv[1]], sys.argv[2]
fields, files = dataset.fieldnames(pair), dataset.get_files(pair)
ref = "ref" if "ref" in fields else min(f for f in fields if f.startswith("ref"))
print(json.dumps({"src": files[fields.index("src")], "ref": files[fields.index(ref)], "cache": SACREBLEU_DIR}))
"""


def split_name(test_set: str) -> str:
    """The split a test set becomes: its name with '/' and '.' written '_' (split names are file names)."""
    return re.sub(r"[/.]", "_", test_set)


def cache_dir() -> Path:
    """Where sacreBLEU keeps its test sets: $SACREBLEU, else ~/.sacrebleu (sacreBLEU's own rule)."""
    return Path(os.environ.get("SACREBLEU", os.path.join(os.path.expanduser("~"), ".sacrebleu")))


def language_pairs() -> dict[str, list[str]]:
    """Every test set sacreBLEU knows -> its language pairs, from its DATASETS table (nothing is downloaded)."""
    from sacrebleu.dataset import DATASETS

    return {name: list(dataset.langpairs) for name, dataset in DATASETS.items()}


def check_test_sets(names: Iterable[str], directions: Directions, other_splits: Iterable[str] = ()) -> None:
    """Every listed set must be one sacreBLEU knows, hold every direction, and become a split of its own."""
    if not (names := list(names)):
        return  # nothing to look up: sacreBLEU is not even imported
    known, taken = language_pairs(), set(other_splits)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise PipelineError(f"{PARAM}: sacreBLEU has no test set {name!r}{hint}; it has {', '.join(sorted(known))}")
        if missing := [str(d) for d in directions.directions if str(d) not in known[name]]:
            raise PipelineError(
                f"{PARAM}: sacreBLEU's {name} has no references for {', '.join(missing)}; its language pairs are "
                f"{', '.join(sorted(known[name]))}"
            )
        if split_name(name) in taken:
            raise PipelineError(f"{PARAM}: {name} becomes split {split_name(name)!r}, which the data already has")
        taken.add(split_name(name))


@dataclass
class TestSetText:
    """One direction of one test set, as sacreBLEU gives it."""

    origin: str  # sacrebleu:<set>:<pair>, every row's origin: the same on every machine, wherever the cache is
    sources: list[str]
    references: list[str]
    files: dict[str, str]  # field (src, ref) -> the file in sacreBLEU's cache it was read from


def fetch(name: str, direction: Direction) -> TestSetText:
    """The sources and first references of `name` for `direction`, through sacreBLEU's downloader and cache."""
    pair = str(direction)
    child = subprocess.run([sys.executable, "-c", FETCH, name, pair], capture_output=True, text=True)
    if child.returncode:
        reason = (child.stderr.strip().splitlines() or ["no message"])[-1]
        raise PipelineError(
            f"{PARAM}: sacreBLEU could not fetch {name} {pair} into its cache {cache_dir()}: {reason}. Where there is "
            f"network, `python -m sacrebleu -t {name} -l {pair} --echo src` fills the cache; copy its "
            f"{name.split('/')[0]}/ folder into {cache_dir()} (or point SACREBLEU at such a cache)"
        )
    files = json.loads(child.stdout.strip().splitlines()[-1])
    sources, references = (_lines(Path(files[field])) for field in ("src", "ref"))
    if len(sources) != len(references):
        raise CorpusMisaligned(files["src"], files["ref"], len(sources), len(references), pair)
    return TestSetText(f"sacrebleu:{name}:{pair}", sources, references, {"src": files["src"], "ref": files["ref"]})


def _lines(path: Path) -> list[str]:
    # As `sacrebleu --echo` reads and prints them: lines end at "\n" only, trailing whitespace removed.
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip() for line in f]


def sha256_of(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
