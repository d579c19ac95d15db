"""An untrained tiny Marian model of several directions, saved as `models/final` would be, for the evaluate and card
tests: a joint SentencePiece model over the cleaned training pairs of every direction, with the target tags
(`>>de<<`, `>>fr<<`) as user-defined symbols when there are several targets (as the tokenize stage reserves them),
the MarianTokenizer over it, and `languages.json` with the scratch layouts (stages.tokenize.scratch_languages).

Built here, not through the tokenize stage, so these tests pin what evaluate and card do with a tagged model
whatever else the tokenize stage does.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import write_clean_splits

EOS, UNK, PAD = "</s>", "<unk>", "<pad>"


def train_joint_spm(texts: list[str], tags: list[str], model_file: Path, vocab_size: int = 400) -> Path:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_prefix=str(model_file.with_suffix("")), vocab_size=vocab_size,
        hard_vocab_limit=False, user_defined_symbols=tags, eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, minloglevel=2,
    )
    return model_file


def marian_tokenizer_dir(spm_file: Path, out_dir: Path) -> Path:
    """A saved MarianTokenizer over `spm_file`, the vocabulary in the Opus-MT layout (pieces, then <pad> last)."""
    import sentencepiece as spm
    from transformers import MarianTokenizer

    sp = spm.SentencePieceProcessor(model_file=str(spm_file))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    vocab[PAD] = len(vocab)
    out_dir.mkdir(parents=True)
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = MarianTokenizer(source_spm=str(spm_file), target_spm=str(spm_file), vocab=str(out_dir / "vocab.json"),
                                unk_token=UNK, eos_token=EOS, pad_token=PAD, model_max_length=1024)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def tagged_tiny_model(root: Path, directions: tuple[str, ...], sizes: dict[str, int]) -> Path:
    """`root`/models/final for `directions`, with `root`/data/clean holding `sizes` rows per direction and split."""
    import pyarrow.parquet as pq

    from pipeline.artifacts import Paths
    from pipeline.params import parse
    from pipeline.runtime.languages import Directions
    from stages.tokenize import scratch_languages
    from stages.train.model import build_model
    from stages.train.save import save_final

    paths, pairs = Paths(root), Directions.of(directions)
    clean = write_clean_splits(root, sizes, directions)
    train = pq.read_table(clean / "train.parquet", columns=["src", "tgt"])
    texts = train.column("src").to_pylist() + train.column("tgt").to_pylist()
    work = root / "tokenizer"
    work.mkdir()
    tokenizer_dir = marian_tokenizer_dir(train_joint_spm(texts, pairs.tags, work / "spm.model"), work / "hf")
    vocab = json.loads((tokenizer_dir / "vocab.json").read_text(encoding="utf-8"))
    # As the tokenize stage does: languages.json (directions, tags, layouts) travels with the tokenizer.
    scratch_languages(vocab, pairs).write(tokenizer_dir)
    model = build_model(parse({"model": {"preset": "tiny"}}).model, len(vocab), vocab[PAD], vocab[EOS])
    save_final(model, tokenizer_dir, paths.final_model)
    return paths.final_model
