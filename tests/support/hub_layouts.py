"""Local directories laid out as Hugging Face dataset repositories are (the hub is unreachable from the tests):
script-free Parquet per configuration and split with the configurations declared in README.md (wmt/wmt14,
Helsinki-NLP/opus-100), `data/<split>-*.parquet` without a card, and JSON lines named after their splits
(bentrevett/multi30k: train.jsonl, val.jsonl, test.jsonl with one column per language). `datasets` reads them as
it reads the hub's, and `redirect_hub` sends a hub id's calls to one of them, recording the revision each got."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

SIZES = {"train": 12, "validation": 3, "test": 2}


def translation_rows(config: str, split: str, size: int) -> list[dict[str, str]]:
    """`size` {lang: text} rows of a pair config (de-en): "<lang> <split> <i>" in each language."""
    return [{lang: f"{lang} {split} {i}" for lang in config.split("-")} for i in range(size)]


def write_translation_repo(root: Path, configs: list[str], sizes: dict[str, int] = SIZES,
                           card_sizes: bool = True) -> Path:
    """A `translation`-column repository: <config>/<split>-00000-of-00001.parquet, README.md declaring each
    config (and, with card_sizes, its splits' sizes, as the hub's cards do)."""
    from datasets import Dataset, Features, Translation

    card: dict = {"configs": [], "dataset_info": []}
    for config in configs:
        languages = sorted(config.split("-"))
        features = Features({"translation": Translation(languages=languages)})
        (root / config).mkdir(parents=True, exist_ok=True)
        for split, size in sizes.items():
            rows = translation_rows(config, split, size)
            Dataset.from_dict({"translation": rows}, features=features).to_parquet(
                root / config / f"{split}-00000-of-00001.parquet"
            )
        card["configs"].append({"config_name": config, "data_files": [
            {"split": split, "path": f"{config}/{split}-*"} for split in sizes]})
        info = {"config_name": config,
                "features": [{"name": "translation", "dtype": {"translation": {"languages": languages}}}]}
        if card_sizes:
            info["splits"] = [{"name": s, "num_bytes": 100 * n, "num_examples": n} for s, n in sizes.items()]
        card["dataset_info"].append(info)
    (root / "README.md").write_text(f"---\n{yaml.safe_dump(card, sort_keys=False)}---\n", encoding="utf-8")
    return root


def write_cardless_parquet(root: Path, columns: dict[str, list], split: str) -> Path:
    """data/<split>-00000-of-00001.parquet with the given columns, and no README: one default config."""
    from datasets import Dataset

    (root / "data").mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(columns).to_parquet(root / "data" / f"{split}-00000-of-00001.parquet")
    return root


def write_jsonl_repo(root: Path, files: dict[str, list[dict[str, str]]]) -> Path:
    """<name>.jsonl per split file (train, val, test), a README with metadata but no configs: bentrevett/multi30k."""
    root.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                            encoding="utf-8")
    (root / "README.md").write_text("---\ntask_categories:\n- translation\nlanguage:\n- en\n- de\n---\n# Multi30k\n",
                                    encoding="utf-8")
    return root


def redirect_hub(monkeypatch, mirror: Path, commit: str) -> list[tuple[str, str | None]]:
    """Make a hub id resolve to `commit` and read from `mirror`; returns the (path, revision) of every datasets call."""
    from stages.download import hub

    calls: list[tuple[str, str | None]] = []
    real = {name: getattr(hub, name) for name in ("_config_names", "_builder", "_stream")}

    def redirected(name):
        def call(path, *args):
            *rest, revision = args
            calls.append((path, revision))
            return real[name](str(mirror), *rest, None)
        return call

    for name in real:
        monkeypatch.setattr(hub, name, redirected(name))
    monkeypatch.setattr(hub, "check_hub_reachable", lambda params: None)
    monkeypatch.setattr(hub, "resolve_revision", lambda path, revision: commit)
    return calls
