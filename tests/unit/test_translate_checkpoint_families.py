"""`mtpipe translate` for every checkpoint family without transformers: the runtime tokenizer
(pipeline/runtime/text_pieces.py) gives the checkpoint's own source ids in each direction's layout and its own text of a
translation, and the search decodes after a direction's decoder prefix of any length (pipeline/runtime/beam_search.py).

The tokenizers are held to the transformers ones of the tiny checkpoints (tests/support/tiny_checkpoints.py), set to a
direction as the tokenize stage sets them, on the sample corpus and on texts that trip tokenizers up.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.runtime.beam_search import DecoderStep, beam_search
from pipeline.runtime.decoding import SpecialIds
from pipeline.runtime.families import check_local_checkpoint, language_codes
from pipeline.runtime.languages import Direction
from pipeline.runtime.text_pieces import M2M100SentencePiece, MarianSentencePiece, TokenizerJson, text_pieces
from tests.support.tiny_checkpoints import FAMILY_NAMES

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "assets" / "sample"
# The directions each tiny family is read in (a single-target Marian checkpoint has one).
DIRECTIONS = {"marian": ["en-de"], "marian-multi": ["en-de", "en-fr"]}
OTHER_DIRECTIONS = ["en-de", "de-fr"]
HARD_TEXTS = [
    "", " ", "x", ".", "  leading and trailing  ", "tab\tinside", "two  spaces", "naïve café ☃ 𝄞 — «quotes»",
    "Ça coûte 3,50 € — très cher !", "ÄÖÜß äöü", "ﬁ ligature Ⅻ", "日本語の文", "emoji 🙂 here", "12,345.67 %",
    "Hello , world . It 's n't", "a</s>b <unk> <pad>", ">>fra<< a tag written in the text", "__de__ en_XX deu_Latn",
]
RUNTIME_CLASSES = {"marian": MarianSentencePiece, "marian-multi": MarianSentencePiece, "mbart": TokenizerJson,
                   "mbart50": TokenizerJson, "m2m100": M2M100SentencePiece, "nllb": TokenizerJson}


def sentences() -> list[str]:
    lines = []
    for name in ("train.en", "train.de"):
        lines += (SAMPLE / name).read_text(encoding="utf-8").splitlines()[:150]
    return lines + HARD_TEXTS


class Checkpoint:
    """A tiny checkpoint's transformers tokenizer, family, language codes and each direction's layout, measured
    as the tokenize stage measures them (stages/tokenize/checkpoint_tokenizer.py)."""

    def __init__(self, directory: Path, tiny_family: str):
        from transformers import AutoConfig, AutoTokenizer

        from stages.tokenize.checkpoint_tokenizer import measure_layout, tokenizer_vocabulary

        self.directory = directory
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.config = AutoConfig.from_pretrained(directory)
        self.family = check_local_checkpoint(directory)
        self.directions = [Direction.parse(d) for d in DIRECTIONS.get(tiny_family, OTHER_DIRECTIONS)]
        languages = sorted({lang for d in self.directions for lang in (d.src, d.tgt)})
        if tiny_family == "marian":
            languages = []  # a single-target checkpoint has no codes
        elif tiny_family == "marian-multi":
            languages = sorted({d.tgt for d in self.directions})  # tags name targets only
        self.codes = language_codes(self.family, languages, tokenizer_vocabulary(self.tokenizer), {}, tiny_family)
        self.layouts = {d: measure_layout(self.tokenizer, self.family, self.config, d, self.codes, tiny_family)
                        for d in self.directions}

    def runtime(self):
        skip = {i for layout in self.layouts.values() for i in layout.special_ids()}
        tagged = self.family.name == "marian" and any(layout.source_prefix for layout in self.layouts.values())
        return text_pieces(self.directory, self.family.name, skip_ids=skip, tagged=tagged)

    def encoded(self, direction: Direction, texts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        """(source ids, label ids) the tokenize stage gives for `texts` as sources and targets of `direction`."""
        from stages.tokenize.checkpoint_tokenizer import encode_direction

        return encode_direction(self.tokenizer, self.family, direction, self.codes, texts, texts)


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def checkpoint(request, tiny_checkpoint) -> Checkpoint:
    return Checkpoint(tiny_checkpoint(request.param), request.param)


def test_each_family_gets_the_runtime_tokenizer_of_its_files(checkpoint, request):
    tiny_family = request.node.callspec.params["checkpoint"]
    assert type(checkpoint.runtime()) is RUNTIME_CLASSES[tiny_family]


def test_source_ids_in_each_directions_layout_are_the_checkpoint_tokenizers(checkpoint):
    runtime, texts = checkpoint.runtime(), sentences()
    for direction, layout in checkpoint.layouts.items():
        expected, _ = checkpoint.encoded(direction, texts)
        ours = [layout.source(runtime.pieces(text)) for text in texts]
        mismatched = [(t, o, e) for t, o, e in zip(texts, ours, expected, strict=True) if o != e]
        assert not mismatched, (direction, mismatched[:3])


def test_a_directions_layout_puts_its_own_language_codes_around_the_source(checkpoint):
    # The runtime reads the codes off the layout alone: two directions from one source differ only there.
    runtime = checkpoint.runtime()
    family = checkpoint.family.name
    for direction, layout in checkpoint.layouts.items():
        ids = layout.source(runtime.pieces("Two dogs."))
        if family in ("mbart50", "m2m100", "nllb"):
            code = checkpoint.codes[direction.src]
            assert ids[0] == checkpoint.tokenizer.convert_tokens_to_ids(code) != checkpoint.tokenizer.unk_token_id
            assert layout.decoder_prefix[1:] == (checkpoint.tokenizer.convert_tokens_to_ids(
                checkpoint.codes[direction.tgt]),)
        elif family == "mbart":
            assert ids[-1] == checkpoint.tokenizer.convert_tokens_to_ids(checkpoint.codes[direction.src])
            assert layout.decoder_prefix == (checkpoint.tokenizer.convert_tokens_to_ids(
                checkpoint.codes[direction.tgt]),)
        elif checkpoint.codes:  # a multi-target Marian checkpoint: the target's tag first
            assert ids[0] == checkpoint.tokenizer.convert_tokens_to_ids(checkpoint.codes[direction.tgt])


def test_the_text_of_a_translation_is_the_checkpoint_tokenizers(checkpoint):
    runtime, tokenizer = checkpoint.runtime(), checkpoint.tokenizer
    layout_ids = {i for layout in checkpoint.layouts.values() for i in layout.special_ids()}
    # A translation is what follows the decoder prefix: a label's ids after the target's prefix. (A text that
    # writes a tag or code gets its id, which the runtime drops: the test below.)
    texts = sentences()
    for direction, layout in checkpoint.layouts.items():
        _, labels = checkpoint.encoded(direction, texts)
        for text, label in zip(texts, labels, strict=True):
            ids = label[len(layout.target_prefix):]
            expected = tokenizer.decode([i for i in ids if i not in layout_ids], skip_special_tokens=True)
            assert runtime.decode(ids) == expected, (direction, text)
    # Any ids of the vocabulary, special ones among them, read alike (the layout's codes aside: below).
    rng = np.random.default_rng(0)
    vocabulary = [i for i in range(len(tokenizer)) if i not in layout_ids]
    special = [tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id]
    for _ in range(200):
        ids = rng.choice(vocabulary, size=int(rng.integers(1, 30))).tolist() + special
        rng.shuffle(ids)
        assert runtime.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True), ids


def test_the_layouts_codes_and_tags_never_reach_a_translations_text(checkpoint):
    runtime, tokenizer = checkpoint.runtime(), checkpoint.tokenizer
    words = runtime.pieces("Two dogs run.")
    for layout in checkpoint.layouts.values():
        for code in layout.special_ids():
            assert runtime.decode([code, *words, code]) == tokenizer.decode(words, skip_special_tokens=True)


def test_the_runtime_tokenizers_import_neither_torch_nor_transformers(tiny_checkpoint):
    families = {name: str(tiny_checkpoint(name)) for name in ("marian", "mbart50", "m2m100", "nllb")}
    code = (
        "import json, sys\n"
        "import pipeline.runtime.translate\n"
        "from pipeline.runtime.text_pieces import text_pieces\n"
        f"dirs = {families!r}\n"
        "out = {f: text_pieces(d, f).decode(text_pieces(d, f).pieces('Two dogs.')) for f, d in dirs.items()}\n"
        "print(json.dumps({'out': out, 'heavy': [m for m in ('torch', 'transformers') if m in sys.modules]}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    assert report["heavy"] == []
    assert set(report["out"].values()) == {"Two dogs."}


def test_a_missing_tokenizer_file_is_named(tiny_checkpoint, tmp_path):
    import shutil

    from pipeline.runtime.text_pieces import TokenizerFilesError

    copy = tmp_path / "nllb"
    shutil.copytree(tiny_checkpoint("nllb"), copy)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(TokenizerFilesError, match=f"{copy / 'tokenizer.json'} not found: a nllb tokenizer reads"):
        text_pieces(copy, "nllb")
    with pytest.raises(TokenizerFilesError, match="no runtime tokenizer for family 't5'"):
        text_pieces(copy, "t5")


# --------------------------------------------------------------------------------------------------- the search

EOS, PAD, START, VOCAB = 0, 9, 1, 10
IDS = SpecialIds(start=START, eos=EOS, pad=PAD)


class PrefixScripted:
    """A fake OnnxSeq2Seq whose next-token probabilities come from `table[tokens fed so far]` (the prefix
    included), the fed tokens kept in its one-layer self cache, so a search that did not feed the prefix, or fed
    it twice, or mixed up rows, reads other probabilities. Records each call's (input shape, cache length)."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], default: dict[int, float]):
        self.table, self.default, self.calls = table, default, []

    def encode(self, input_ids, attention_mask):
        return np.zeros((*input_ids.shape, 1)), [np.zeros((len(input_ids), 1, 1, 1), dtype=np.float32)] * 2

    def empty_cache(self, rows):
        return [np.zeros((rows, 1, 0, 1), dtype=np.float32) for _ in range(2)]

    def decode(self, decoder_input_ids, encoder_attention_mask, self_cache, cross_cache, logits=True,
               cache_rows=None):
        past = self_cache[0] if cache_rows is None else self_cache[0][cache_rows]
        self.calls.append((decoder_input_ids.shape, past.shape[2]))
        fed = np.concatenate([past, decoder_input_ids[:, None, :, None].astype(np.float32)], axis=2)
        scores = np.full((len(fed), decoder_input_ids.shape[1], VOCAB), -30.0, dtype=np.float32)
        for row in range(len(fed)):
            tokens = tuple(int(t) for t in fed[row, 0, :, 0])
            for token, p in self.table.get(tokens, self.default).items():
                scores[row, -1, token] = np.log(p)
        return DecoderStep(scores, [fed, fed.copy()])


def search(model, prefix, beam=2, limit=8, length_penalty=1.0, sentences=1):
    ids = np.array([[5, EOS]] * sentences, dtype=np.int64)
    return beam_search(model, ids, np.ones_like(ids), beam=beam, max_new_tokens=[limit] * sentences, ids=IDS,
                       length_penalty=length_penalty, decoder_prefix=prefix)


def test_the_first_step_feeds_the_whole_prefix_to_an_empty_cache_and_hypotheses_follow_it():
    # After the prefix (1, 7) the model says "3 4 </s>"; after (1, 8) "6 </s>": the prefix decides the language.
    table = {(1, 7): {3: 0.9}, (1, 7, 3): {4: 0.9}, (1, 7, 3, 4): {EOS: 0.9},
             (1, 8): {6: 0.9}, (1, 8, 6): {EOS: 0.9}}
    model = PrefixScripted(table, {EOS: 0.5, 2: 0.5})
    assert search(model, (1, 7), beam=1, sentences=2) == [[3, 4, EOS]] * 2
    assert model.calls[0] == ((2, 2), 0)  # one row per sentence, the two prefix tokens, no cache yet
    assert model.calls[1:] == [((2, 1), 2), ((2, 1), 3)]  # then one token a step against a cache one longer
    assert search(PrefixScripted(table, {EOS: 0.5, 2: 0.5}), (1, 8), beam=3) == [[6, EOS]]


def test_a_one_token_prefix_is_the_search_from_the_start_token():
    table = {(1,): {3: 0.5, 4: 0.4, EOS: 0.1}, (1, 3): {EOS: 0.2, 5: 0.8}, (1, 4): {EOS: 0.9},
             (1, 3, 5): {EOS: 0.9}}
    for beam in (1, 2, 4):
        default = search(PrefixScripted(table, {EOS: 0.6, 2: 0.4}), None, beam=beam)
        assert default == search(PrefixScripted(table, {EOS: 0.6, 2: 0.4}), (START,), beam=beam)
    assert search(PrefixScripted(table, {EOS: 0.6, 2: 0.4}), None, beam=1) == [[3, 5, EOS]]


def test_the_limit_and_the_length_penalty_count_the_tokens_after_the_prefix():
    # "</s>" scores -0.50 (1 token), "3 3 </s>" -1.40 (3 tokens): per token after the prefix the long one wins
    # (-0.467 > -0.50); counting the two prefix tokens too, the short one would (-0.167 > -0.28).
    table = {(1, 7): {EOS: float(np.exp(-0.5)), 3: 0.35}, (1, 7, 3): {3: 0.8, 5: 0.2},
             (1, 7, 3, 3): {EOS: float(np.exp(-1.4 - np.log(0.35) - np.log(0.8)))}}
    model = PrefixScripted(table, {EOS: 0.5, 2: 0.5})
    assert search(model, (1, 7), beam=2) == [[3, 3, EOS]]
    assert search(model, (1, 7), beam=2, length_penalty=0.0) == [[EOS]]
    # A limit of 2 tokens after the prefix: "3 3" cannot be followed by its </s>, so "3 </s>" is forced.
    forced = search(PrefixScripted({(1, 7): {3: 0.9}, (1, 7, 3): {3: 0.9}}, {3: 0.9}), (1, 7), beam=1, limit=2)
    assert forced == [[3, EOS]]


def test_an_empty_prefix_is_refused():
    with pytest.raises(ValueError, match="decoder_prefix is empty"):
        search(PrefixScripted({}, {EOS: 1.0}), ())
