"""A tiny random checkpoint made to stand for a fine-tuned one in models/final: its weights redrawn (`redrawn`: as
built, an untrained tied-embedding model repeats the last token it was fed, whatever the source, so outputs equal
across runtimes would prove little) and the languages.json the tokenize stage writes for it (`write_languages`:
the tokenize stage's own functions measure the layouts)."""

from __future__ import annotations

from pathlib import Path

from pipeline.runtime.families import check_local_checkpoint
from pipeline.runtime.languages import Directions
from pipeline.runtime.model_languages import ModelLanguages

# Linear weights are drawn with std GAIN / sqrt(fan_in), the tied embeddings with EMBEDDING_STD: the residual
# stream is then more than the input embedding, so greedy outputs vary with the source and the target language,
# and logits stay small enough (std ~1.7) that float32 rounding (~2e-5 against float64) is well inside 1e-4.
GAIN = 2.0
EMBEDDING_STD = 0.3


def redrawn(model) -> None:
    """Seeded new weights for every Linear (the output projection is the tied embedding) and the embeddings, the
    <pad> row kept zero (CTranslate2's Marian decoder starts from a zero vector in its place)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not model.lm_head:
                module.weight.normal_(0, GAIN / module.in_features**0.5, generator=generator)
        embeddings = model.get_input_embeddings().weight
        embeddings.normal_(0, EMBEDDING_STD, generator=generator)
        embeddings[model.config.pad_token_id] = 0


def write_languages(model_dir: Path, directions: Directions) -> ModelLanguages:
    """languages.json as the tokenize stage writes it for this checkpoint (its codes, its measured layouts)."""
    from transformers import AutoConfig, AutoTokenizer

    from stages.tokenize import checkpoint_codes
    from stages.tokenize.checkpoint_tokenizer import measure_layout, tokenizer_vocabulary

    family = check_local_checkpoint(model_dir)
    tokenizer, config = AutoTokenizer.from_pretrained(model_dir), AutoConfig.from_pretrained(model_dir)
    where = str(model_dir)
    codes = checkpoint_codes(family, tokenizer_vocabulary(tokenizer), directions, {}, where)
    layouts = {str(d): measure_layout(tokenizer, family, config, d, codes, where) for d in directions.directions}
    languages = ModelLanguages(directions, family, codes, layouts)
    languages.write(model_dir)
    return languages


def family_root(family: str, root: Path, sizes: dict[str, int], directions: tuple[str, ...]):
    """`root` as a project after fine-tuning a `family` checkpoint: data/clean with `sizes` pairs per split of each
    direction, and models/final the tiny checkpoint (laid out as the hub's) with redrawn weights and its
    languages.json."""
    from transformers import AutoModelForSeq2SeqLM

    from pipeline.artifacts import Paths
    from tests.conftest import write_clean_splits
    from tests.support.tiny_checkpoints import build_tiny

    paths = Paths(root)
    write_clean_splits(root, sizes, directions)
    build_tiny(family, paths.final_model)
    model = AutoModelForSeq2SeqLM.from_pretrained(paths.final_model)
    redrawn(model)
    model.save_pretrained(paths.final_model)
    write_languages(paths.final_model, Directions.of(directions))
    return paths
