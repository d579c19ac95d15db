"""The download stage's inputs: what `data.files` (or the embedded sample) names, resolved into files per direction,
and the readers of those files.

An entry serves directions as follows:
- `{src, tgt, direction}`: its direction (the only one when data.directions lists one);
- `{tsv, columns}`:        every direction between its two column languages, columns swapped as needed (no
                           columns: the only direction, first column the source);
- `{dir, prefix}`:         for every direction, the NAME.<src> / NAME.<tgt> pairs in the directory; a direction with
                           no file of one of its two languages there takes nothing from it, but a NAME with one of a
                           direction's languages and not the other is an error;
- `{pattern}`:             every direction, pairing the files of its two languages (`{lang}` replaced).
After resolving, every file is checked to exist, and every direction to have an input in train, in valid and in at
least one test split, before anything is read. Every file may be plain or .gz, UTF-8.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path, PurePath

from pipeline.artifacts import SAMPLE_DIR
from pipeline.errors import CorpusMisaligned
from pipeline.params import SAMPLE_SPLITS, LanguageFiles, MosesDir, Params, SplitFiles, TsvFile
from pipeline.runtime.errors import InputFileError, PipelineError
from pipeline.runtime.languages import Direction, Directions

Pair = tuple[str, str, str, int]  # src, tgt, origin, line (1-based)
# direction -> its inputs of one split, in data.directions order; a direction the split does not hold has none.
SplitInputs = dict[Direction, list["Input"]]

# NAME.<lang> or NAME.<lang>.gz in a Moses-style directory.
MOSES_FILE = re.compile(r"^(?P<name>.+?)\.(?P<lang>[a-z]{2,3})(?P<gz>\.gz)?$")


# --- reading files ------------------------------------------------------------------------------------------


def _open_binary(path: Path):
    if not path.is_file():
        raise InputFileError(path, "directory, not a file" if path.is_dir() else "file not found")
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_lines(path: Path) -> Iterator[str]:
    """Lines of a plain or gzip UTF-8 file without line ends; CRLF and a leading BOM are handled.

    Invalid UTF-8 or a truncated .gz raise InputFileError naming the file and line.
    """
    number = 0
    try:
        with _open_binary(path) as f:
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise InputFileError(path, f"not valid UTF-8 at byte {err.start} ({err.reason})", number) from None
                if number == 1:
                    line = line.removeprefix("\ufeff")
                yield line.rstrip("\r\n")
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise InputFileError(path, f"corrupt or truncated gzip after {number} lines ({err})") from None


def count_lines(path: Path) -> int:
    """Lines of a plain or gzip file as read_lines yields them (a last line without a line end counts), fast."""
    lines, last = 0, b"\n"
    try:
        with _open_binary(path) as f:
            while block := f.read(1 << 22):
                lines += block.count(b"\n")
                last = block[-1:]
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise InputFileError(path, f"corrupt or truncated gzip after {lines} lines ({err})") from None
    return lines + (last != b"\n")


def read_parallel(
    src_path: Path, tgt_path: Path, origin: str | None = None, direction: str | None = None
) -> Iterator[Pair]:
    """Pairs of two aligned files; a length mismatch raises CorpusMisaligned with both paths and counts (and the
    direction the files were read for, when given)."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    origin = origin or src_path.name
    n = 0
    # Not zip(): it consumes (and loses) the source's extra line before noticing the target has ended.
    for n, (src, tgt) in enumerate(zip_longest(src_lines, tgt_lines), start=1):
        if src is None or tgt is None:
            extra_src, extra_tgt = sum(1 for _ in src_lines), sum(1 for _ in tgt_lines)
            lines_src = n - 1 + (src is not None) + extra_src
            lines_tgt = n - 1 + (tgt is not None) + extra_tgt
            raise CorpusMisaligned(src_path, tgt_path, lines_src, lines_tgt, direction)
        yield src, tgt, origin, n


def read_tsv(path: Path, swap: bool = False, origin: str | None = None) -> Iterator[Pair]:
    """Pairs of a two-column TSV file (second column first when `swap`); a line without exactly one tab is an
    error naming the file and line: a third column or a missing one means the file is not what params.yaml says."""
    origin = origin or path.name
    for n, line in enumerate(read_lines(path), start=1):
        columns = line.split("\t")
        if len(columns) != 2:
            raise InputFileError(path, f"expected 2 tab-separated columns, found {len(columns)} ({_preview(line)})", n)
        first, second = columns
        yield (second, first, origin, n) if swap else (first, second, origin, n)


def _preview(line: str, width: int = 60) -> str:
    return repr(line if len(line) <= width else line[: width - 3] + "...")


# --- inputs: one entry's files for one direction ------------------------------------------------------------


@dataclass
class Input:
    """One input of a split for one direction: the files it reads, how to read its pairs, how to count them cheaply."""

    files: list[Path]
    describe: str  # for messages: the files, as the user named them
    read: Callable[[], Iterator[Pair]]
    count: Callable[[], int]


def _resolve(path: str, root: Path) -> Path:
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else root / p


def _aligned_input(src: Path, tgt: Path, src_origin: str, direction: Direction) -> Input:
    return Input(
        files=[src, tgt],
        describe=f"{src} and {tgt}",
        read=lambda: read_parallel(src, tgt, src_origin, str(direction)),
        count=lambda: count_lines(src),
    )


def _tsv_input(path: Path, swap: bool, origin: str) -> Input:
    return Input(
        files=[path],
        describe=str(path),
        read=lambda: read_tsv(path, swap, origin),
        count=lambda: count_lines(path),
    )


# --- Moses-style directories ----------------------------------------------------------------------------------


def moses_files(directory: Path, prefix: str, languages: Iterable[str]) -> dict[str, dict[str, Path]]:
    """NAME -> {lang: NAME.<lang>} for the files of `languages` in `directory` whose NAME starts with `prefix`."""
    if not directory.is_dir():
        raise InputFileError(directory, "directory not found" if not directory.exists() else "not a directory")
    wanted = set(languages)
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(directory.iterdir()):
        match = MOSES_FILE.match(path.name)
        if not path.is_file() or not match or not match["name"].startswith(prefix) or match["lang"] not in wanted:
            continue
        sides = found.setdefault(match["name"], {})
        if match["lang"] in sides:
            raise InputFileError(directory, f"both {sides[match['lang']].name} and {path.name} exist: keep one")
        sides[match["lang"]] = path
    return found


def moses_pairs(
    directory: Path, found: dict[str, dict[str, Path]], direction: Direction
) -> list[tuple[str, Path, Path]]:
    """(NAME, NAME.<src>, NAME.<tgt>) of `found` for the direction, in NAME order.

    Empty when the directory has no file of one of the direction's languages: it holds nothing for the direction.
    Otherwise a NAME with one of the two languages and not the other is an error (a forgotten or misnamed file
    would drop a corpus silently).
    """
    langs = (direction.src, direction.tgt)
    names = {name: sides for name, sides in sorted(found.items()) if any(lang in sides for lang in langs)}
    if not all(any(lang in sides for sides in names.values()) for lang in langs):
        return []
    pairs = []
    for name, sides in names.items():
        missing = [lang for lang in langs if lang not in sides]
        if missing:
            (present,) = (sides[lang] for lang in langs if lang in sides)
            raise _no_partner(directory, name, present, missing[0])
        pairs.append((name, sides[direction.src], sides[direction.tgt]))
    return pairs


def _no_partner(directory: Path, name: str, present: Path, missing: str) -> InputFileError:
    return InputFileError(present, f"has no partner {name}.{missing} (or .gz) in {directory}")


def _serves_nothing(
    directory: Path, prefix: str, found: dict[str, dict[str, Path]], directions: Directions
) -> InputFileError:
    """The error for a directory that holds no pair for any direction: an orphan file when it has one, else what
    it has instead."""
    if found:
        name, sides = min(found.items())
        lang, present = next(iter(sides.items()))
        direction = next(d for d in directions.directions if lang in (d.src, d.tgt))
        return _no_partner(directory, name, present, direction.tgt if lang == direction.src else direction.src)
    others = sorted(p.name for p in directory.iterdir())[:10]
    wanted = " or ".join(f"NAME.{d.src} / NAME.{d.tgt}" for d in directions.directions)
    return InputFileError(
        directory,
        f"no {wanted} files (plain or .gz)"
        + (f" whose NAME starts with {prefix!r}" if prefix else "")
        + f"; it has {others or 'nothing'}",
    )


def _moses_inputs(entry: MosesDir, directions: Directions, root: Path) -> Iterator[tuple[Direction, Input]]:
    directory = _resolve(entry.dir, root)
    found = moses_files(directory, entry.prefix, directions.languages)
    served = [(d, pair) for d in directions.directions for pair in moses_pairs(directory, found, d)]
    if not served:
        raise _serves_nothing(directory, entry.prefix, found, directions)
    for direction, (_, src, tgt) in served:
        yield direction, _aligned_input(src, tgt, str(PurePath(entry.dir) / src.name), direction)


# --- resolving data.files -----------------------------------------------------------------------------------


def _tsv_inputs(entry: TsvFile, directions: Directions, root: Path) -> Iterator[tuple[Direction, Input]]:
    path = _resolve(entry.tsv, root)
    if entry.columns is None:
        yield directions.directions[0], _tsv_input(path, False, entry.tsv)
        return
    for d in directions.directions:
        if set(entry.columns) == {d.src, d.tgt}:
            yield d, _tsv_input(path, entry.columns[0] != d.src, entry.tsv)


def _entry_inputs(entry, directions: Directions, root: Path) -> Iterator[tuple[Direction, Input]]:
    """(direction, input) for every direction the entry serves (the module docstring says which)."""
    only = directions.directions[0]
    if isinstance(entry, SplitFiles):
        direction = Direction.parse(entry.direction) if entry.direction else only
        yield direction, _aligned_input(_resolve(entry.src, root), _resolve(entry.tgt, root), entry.src, direction)
    elif isinstance(entry, TsvFile):
        yield from _tsv_inputs(entry, directions, root)
    elif isinstance(entry, MosesDir):
        yield from _moses_inputs(entry, directions, root)
    elif isinstance(entry, LanguageFiles):
        for d in directions.directions:
            src, tgt = (entry.pattern.replace("{lang}", lang) for lang in (d.src, d.tgt))
            yield d, _aligned_input(_resolve(src, root), _resolve(tgt, root), src, d)


def _split_inputs(entries: list, directions: Directions, root: Path) -> SplitInputs:
    inputs: SplitInputs = {d: [] for d in directions.directions}
    for entry in entries:
        for direction, one in _entry_inputs(entry, directions, root):
            inputs[direction].append(one)
    return inputs


def _sample_inputs(split: str, directions: Directions) -> SplitInputs:
    return {
        d: [_aligned_input(SAMPLE_DIR / f"{split}.{d.src}", SAMPLE_DIR / f"{split}.{d.tgt}", f"{split}.{d.src}", d)]
        for d in directions.directions
    }


def resolve_inputs(params: Params, root: Path) -> dict[str, SplitInputs]:
    """Every split's inputs per direction, with every file checked to exist and every direction to have inputs in
    train, valid and a test split, before anything is read."""
    directions = params.data.directions
    if params.data.source == "sample":
        splits = {split: _sample_inputs(split, directions) for split in SAMPLE_SPLITS}
    else:
        splits = {split: _split_inputs(entries, directions, root) for split, entries in params.data.files.items()}
    _check_files_exist(splits)
    _check_every_direction_has_input(splits, directions)
    return splits


def _check_files_exist(splits: dict[str, SplitInputs]) -> None:
    for split, by_direction in splits.items():
        for direction, inputs in by_direction.items():
            for path in (path for one in inputs for path in one.files):
                if not path.is_file():
                    what = "directory, not a file" if path.is_dir() else "file not found"
                    raise InputFileError(path, f"{what} (data.files.{split}, direction {direction})")


def _check_every_direction_has_input(splits: dict[str, SplitInputs], directions: Directions) -> None:
    for split in ("train", "valid"):
        for direction, inputs in splits[split].items():
            if not inputs:
                served = [str(d) for d, given in splits[split].items() if given]
                raise PipelineError(
                    f"direction {direction} has no input in split {split}: data.files.{split} serves "
                    f"{', '.join(served) or 'no direction'}; add {{src, tgt, direction: {direction}}}, a {{tsv, "
                    f"columns: [{direction.src}, {direction.tgt}]}}, a {{dir}} with NAME.{direction.src} / "
                    f"NAME.{direction.tgt} files or a {{pattern}}"
                )
    tests = [split for split in splits if split not in ("train", "valid")]
    for direction in directions.directions:
        if not any(splits[split][direction] for split in tests):
            raise PipelineError(
                f"direction {direction} has no input in any test split ({', '.join(tests)}): give at least one "
                "of them files for it, so the model is evaluated on every direction it learns"
            )


def split_pairs(inputs: list[Input]) -> Iterator[Pair]:
    """The inputs' pairs, concatenated; an input without a single pair is an error naming its files."""
    for one in inputs:
        rows = 0
        for rows, pair in enumerate(one.read(), start=1):  # noqa: B007 - rows is the count after the loop
            yield pair
        if rows == 0:
            raise InputFileError(one.describe, "empty: no pairs")
