"""tokenize with a pretrained checkpoint of every family: each row encoded by the checkpoint's own tokenizer in the
row's own direction (the ids are `tokenizer(src, text_target=tgt)` with src_lang/tgt_lang set, or with Marian's
tag in front of the source), every direction's layout of special ids recorded in languages.json as the family
lays them out, and clear errors for a language the tokenizer has no code for, an architecture outside the
families and a hub name that cannot be reached."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.artifacts import Paths
from pipeline.errors import HubUnreachable
from pipeline.params import parse
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.families import MissingLanguageCode, UnsupportedCheckpoint
from pipeline.runtime.model_languages import ModelLanguages
from pipeline.token_arrays import TokenArray, read_row_directions
from stages import tokenize
from tests.conftest import write_interleaved_splits

TWO = ("en-de", "en-fr")
SIZES = {"train": 120, "valid": 40, "test": 40}
FAMILIES = ("marian-multi", "mbart", "mbart50", "m2m100", "nllb")

# Written out here rather than taken from pipeline/runtime/families.py: each family's code of a language (as a token),
# and what its tokenizer's src_lang/tgt_lang are set to for it (M2M-100 takes "de" for "__de__").
CODES = {
    "marian": {},  # a single-target checkpoint: plain text
    "marian-multi": {"de": ">>deu<<", "fr": ">>fra<<"},  # targets only: the tag goes in front of the source
    "mbart": {"en": "en_XX", "de": "de_DE", "fr": "fr_XX"},
    "mbart50": {"en": "en_XX", "de": "de_DE", "fr": "fr_XX"},
    "m2m100": {"en": "__en__", "de": "__de__", "fr": "__fr__"},
    "nllb": {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn"},
}
TOLD = {**CODES, "m2m100": {"en": "en", "de": "de", "fr": "fr"}}


def expected_layout(family: str, src: str, tgt: str) -> dict:
    """The table of pipeline/runtime/model_languages.py, in tokens, for one direction."""
    codes = CODES[family]
    if family == "marian-multi":
        return {"source_prefix": [codes[tgt]], "source_suffix": ["</s>"], "target_prefix": [],
                "target_suffix": ["</s>"], "decoder_start": "<pad>"}
    if family == "mbart":  # cc25: codes after </s>; decoding starts from the target code (wrap-around shift)
        return {"source_prefix": [], "source_suffix": ["</s>", codes[src]], "target_prefix": [],
                "target_suffix": ["</s>", codes[tgt]], "decoder_start": codes[tgt]}
    return {"source_prefix": [codes[src]], "source_suffix": ["</s>"], "target_prefix": [codes[tgt]],
            "target_suffix": ["</s>"], "decoder_start": "</s>"}


def params_for(checkpoint: Path | str, directions: tuple[str, ...] = TWO, **model) -> object:
    """Params of a `files` corpus of `directions` (tokenize reads data/clean only; the patterns are never opened)."""
    files = {split: {"pattern": f"corpus/{split}.{{lang}}"} for split in SIZES}
    return parse({"data": {"source": "files", "directions": list(directions), "files": files},
                  "model": {"init": "pretrained", "name_or_path": str(checkpoint), **model}})


def interleaved_corpus(root: Path, directions: tuple[str, ...]) -> Path:
    """data/clean of `directions` with every split's rows shuffled (seeded), so a batch mixes the directions row
    by row and the ids must come back in row order."""
    write_interleaved_splits(root, SIZES, directions)
    return root


def fresh_root(corpus: Path, tmp_path: Path) -> Paths:
    shutil.copytree(corpus / "data", tmp_path / "data")
    return Paths(tmp_path)


def rows_of(paths: Paths, split: str) -> list[dict]:
    return pq.read_table(paths.split_file(paths.clean, split)).to_pylist()


def ids_of(paths: Paths, split: str, side: str) -> list[list[int]]:
    arrays = TokenArray.open(paths.tokenized / f"{split}.{side}")
    return [arrays[i].tolist() for i in range(len(arrays))]


def encode_row(tokenizer, family: str, row: dict) -> tuple[list[int], list[int]]:
    """One row as the checkpoint's tokenizer encodes it, set to the row's direction by hand."""
    if family.startswith("marian"):
        tag = CODES[family].get(row["tgt_lang"])
        encoded = tokenizer(f"{tag} {row['src']}" if tag else row["src"], text_target=row["tgt"])
    else:
        tokenizer.src_lang, tokenizer.tgt_lang = TOLD[family][row["src_lang"]], TOLD[family][row["tgt_lang"]]
        encoded = tokenizer(row["src"], text_target=row["tgt"])
    return encoded["input_ids"], encoded["labels"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return interleaved_corpus(tmp_path_factory.mktemp("two_directions"), TWO)


@pytest.fixture(scope="module", params=FAMILIES)
def tokenized(request, corpus, tiny_checkpoint, tmp_path_factory) -> tuple[str, Path, Paths]:
    """(family, checkpoint, paths): the two-direction corpus tokenized with a tiny checkpoint of the family."""
    family = request.param
    checkpoint = tiny_checkpoint(family)
    paths = fresh_root(corpus, tmp_path_factory.mktemp(f"tokenized_{family}"))
    tokenize.run(params_for(checkpoint), paths)
    return family, checkpoint, paths


def test_every_row_of_every_split_is_the_checkpoint_tokenizer_s_ids_in_the_row_s_direction(tokenized):
    from transformers import AutoTokenizer

    family, checkpoint, paths = tokenized
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    for split in SIZES:
        rows = rows_of(paths, split)
        directions = [f"{r['src_lang']}-{r['tgt_lang']}" for r in rows]
        assert set(directions[:8]) == set(TWO), f"{split}: the rows are not interleaved"
        expected = [encode_row(tokenizer, family, row) for row in rows]
        assert ids_of(paths, split, "src") == [src for src, _ in expected], split
        assert ids_of(paths, split, "tgt") == [tgt for _, tgt in expected], split
        assert read_row_directions(paths.tokenized / split).tolist() == [TWO.index(d) for d in directions]


def test_languages_json_records_the_family_the_codes_and_each_direction_s_layout(tokenized):
    from transformers import AutoTokenizer

    family, checkpoint, paths = tokenized
    hf = paths.tokenized / "hf_tokenizer"
    languages = ModelLanguages.read(hf)
    tokenizer = AutoTokenizer.from_pretrained(hf)  # the copy that travels with the model

    assert languages.family.name == family.removesuffix("-multi")
    assert dict(languages.codes) == CODES[family]
    for direction in TWO:
        layout = languages.layout(direction)
        recorded = {key: tokenizer.convert_ids_to_tokens(list(ids)) if isinstance(ids, list) else
                    tokenizer.convert_ids_to_tokens(ids) for key, ids in layout.to_json().items()}
        assert recorded == expected_layout(family, *direction.split("-")), direction


def test_the_recorded_layout_frames_the_plain_pieces_of_every_row(tokenized):
    from transformers import AutoTokenizer

    family, checkpoint, paths = tokenized
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    languages = ModelLanguages.read(paths.tokenized / "hf_tokenizer")
    rows = rows_of(paths, "valid")
    for row, src, tgt in zip(rows, ids_of(paths, "valid", "src"), ids_of(paths, "valid", "tgt"), strict=True):
        layout = languages.layout(f"{row['src_lang']}-{row['tgt_lang']}")
        pieces = tokenizer(row["src"], add_special_tokens=False).input_ids
        target_pieces = tokenizer(text_target=row["tgt"], add_special_tokens=False).input_ids
        assert src == layout.source(pieces)
        assert tgt == [*layout.target_prefix, *target_pieces, *layout.target_suffix]


def test_languages_name_the_family_and_meta_a_vocabulary_size_past_every_id(tokenized):
    family, checkpoint, paths = tokenized
    meta = json.loads((paths.tokenized / "meta.json").read_text(encoding="utf-8"))
    languages = ModelLanguages.read(paths.tokenized / "hf_tokenizer")
    assert languages.family.name == family.removesuffix("-multi") and meta["tokenizer"] == str(checkpoint)
    assert languages.directions.names == list(TWO)
    assert not (paths.tokenized / "spm.model").exists()  # nothing trained
    biggest = max(max(ids) for split in SIZES for side in ("src", "tgt") for ids in ids_of(paths, split, side))
    layouts = ModelLanguages.read(paths.tokenized / "hf_tokenizer").layouts.values()
    special = max(max(layout.special_ids()) for layout in layouts)
    assert max(biggest, special) < meta["vocab_size"]  # the dtype holds every id (M2M-100's codes come last)


def test_a_single_target_marian_checkpoint_encodes_plain_text_for_its_one_direction(tiny_checkpoint,
                                                                                    tmp_path_factory, tmp_path):
    from transformers import AutoTokenizer

    checkpoint = tiny_checkpoint("marian")
    corpus = interleaved_corpus(tmp_path_factory.mktemp("one_direction"), ("en-de",))
    paths = fresh_root(corpus, tmp_path)
    tokenize.run(params_for(checkpoint, ("en-de",)), paths)

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    rows = rows_of(paths, "test")
    expected = [encode_row(tokenizer, "marian", row) for row in rows]
    assert ids_of(paths, "test", "src") == [src for src, _ in expected]
    assert ids_of(paths, "test", "tgt") == [tgt for _, tgt in expected]
    languages = ModelLanguages.read(paths.tokenized / "hf_tokenizer")
    assert languages.family.name == "marian" and dict(languages.codes) == CODES["marian"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert languages.layout("en-de").to_json() == {"source_prefix": [], "source_suffix": [eos], "target_prefix": [],
                                                   "target_suffix": [eos], "decoder_start": pad}


def test_a_single_target_marian_checkpoint_is_refused_for_several_targets(corpus, tiny_checkpoint, tmp_path):
    paths = fresh_root(corpus, tmp_path)
    with pytest.raises(PipelineError, match=r"this checkpoint has a MarianTokenizer without >>de<<, >>fr<<"):
        tokenize.run(params_for(tiny_checkpoint("marian")), paths)
    assert not paths.tokenized.exists()


@pytest.mark.parametrize(("family", "directions", "message"), [
    ("mbart", ("en-de", "en-pl"), r"'pl' has no language code in this mbart tokenizer; its codes: ar_AR, cs_CZ, "
                                  r"de_DE, en_XX, .*zh_CN\. Set model.language_codes"),
    ("marian-multi", ("en-de", "en-es"), r"'es' has no language code in this marian tokenizer; its codes: "
                                         r">>ces<<, >>deu<<, >>fra<<\."),
])
def test_a_language_without_a_code_in_the_tokenizer_is_refused_listing_its_codes(
    family, directions, message, corpus, tiny_checkpoint, tmp_path
):
    paths = fresh_root(corpus, tmp_path)
    with pytest.raises(MissingLanguageCode, match=message):
        tokenize.run(params_for(tiny_checkpoint(family), directions), paths)
    assert not paths.tokenized.exists()


def test_model_language_codes_overrides_the_built_in_code(corpus, tiny_checkpoint, tmp_path):
    from transformers import AutoTokenizer

    checkpoint = tiny_checkpoint("nllb")
    paths = fresh_root(corpus, tmp_path)
    # Any code the tokenizer has, to see it used instead of the built-in deu_Latn.
    tokenize.run(params_for(checkpoint, language_codes={"de": "ltz_Latn"}), paths)

    languages = ModelLanguages.read(paths.tokenized / "hf_tokenizer")
    code_id = AutoTokenizer.from_pretrained(checkpoint).convert_tokens_to_ids("ltz_Latn")
    assert languages.codes == {"en": "eng_Latn", "de": "ltz_Latn", "fr": "fra_Latn"}
    assert languages.layout("en-de").target_prefix == (code_id,)
    labels = ids_of(paths, "valid", "tgt")
    german = [i for i, row in enumerate(rows_of(paths, "valid")) if row["tgt_lang"] == "de"]
    assert german and all(labels[i][0] == code_id for i in german)


def test_an_override_the_tokenizer_does_not_have_is_refused_naming_the_param(corpus, tiny_checkpoint, tmp_path):
    paths = fresh_root(corpus, tmp_path)
    with pytest.raises(MissingLanguageCode, match=r"model.language_codes.de='de_XX' is no language code in this "
                                                  r"nllb tokenizer; its codes: ace_Arab"):
        tokenize.run(params_for(tiny_checkpoint("nllb"), language_codes={"de": "de_XX"}), paths)


def tiny_bart(out: Path) -> Path:
    """A tiny BART checkpoint (a seq2seq architecture outside the families), saved as a hub download would be."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import BartConfig, BartForConditionalGeneration, BartTokenizer

    from tests.support.tiny_checkpoints import corpus

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(), vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    files = out / "bpe"
    files.mkdir(parents=True)
    bpe.save_model(str(files))
    tokenizer = BartTokenizer.from_pretrained(files)
    tokenizer.save_pretrained(out)
    config = BartConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                        max_position_embeddings=64)
    BartForConditionalGeneration(config).save_pretrained(out)
    return out


def test_an_architecture_outside_the_families_is_refused_naming_them(corpus, tmp_path):
    checkpoint = tiny_bart(tmp_path / "bart")
    paths = fresh_root(corpus, tmp_path / "root")
    with pytest.raises(UnsupportedCheckpoint, match=r"model_type 'bart' with tokenizer '\w+Tokenizer' is not a "
                                                    r"supported family\. Supported: marian \(MarianTokenizer") as err:
        tokenize.run(params_for(checkpoint, ("en-de",)), paths)
    assert all(name in str(err.value) for name in ("mbart (", "mbart50 (", "m2m100 (", "nllb ("))
    assert not paths.tokenized.exists()


def test_a_hub_name_that_cannot_be_reached_says_to_pass_a_local_directory(corpus, tmp_path):
    paths = fresh_root(corpus, tmp_path)  # tests run with HF_HUB_OFFLINE=1 (tests/conftest.py)
    with pytest.raises(HubUnreachable, match=r"model.name_or_path 'example-org/opus-mt-en-xx' is not a local "
                                             r"directory, and the Hugging Face hub is unreachable .* set "
                                             r"model.name_or_path to a directory the checkpoint was saved to"):
        tokenize.run(params_for("example-org/opus-mt-en-xx"), paths)
    assert not paths.tokenized.exists()


def test_a_local_directory_that_holds_no_checkpoint_is_refused_naming_it(corpus, tmp_path):
    empty = tmp_path / "not_a_checkpoint"
    empty.mkdir()
    paths = fresh_root(corpus, tmp_path / "root")
    with pytest.raises(PipelineError, match=rf"model.name_or_path {empty}: not a checkpoint with a config.json"):
        tokenize.run(params_for(empty), paths)
