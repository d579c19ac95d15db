"""Tiny random checkpoints of every supported family, built offline with the real transformers model and tokenizer
classes and saved with save_pretrained, so tests run `model.init: pretrained` on what a hub download would give.

    family        tokenizer (files)                                    model
    marian        MarianTokenizer (source.spm, target.spm, vocab.json) MarianMTModel, <pad> last, start <pad>
    marian-multi  the same, >>deu<< >>fra<< >>ces<< as pieces          MarianMTModel (OPUS-MT multi-target)
    mbart         MBartTokenizer (tokenizer.json)                      MBartForConditionalGeneration (cc25)
    mbart50       MBart50Tokenizer (tokenizer.json)                    MBartForConditionalGeneration, start </s>
    m2m100        M2M100Tokenizer (vocab.json, sentencepiece.bpe.model) M2M100ForConditionalGeneration
    nllb          NllbTokenizer (tokenizer.json)                       M2M100ForConditionalGeneration
    opus-mt       MarianTokenizer as a hub OPUS-MT repository:         MarianMTModel as marian's, and the hub's
                  source.spm and target.spm differ, no tokenizer       generation_config.json
                  class
    opus-mt-multi the same, >>deu<< >>fra<< in vocab.json only         MarianMTModel (OPUS-MT multi-target)

Each vocabulary comes from a SentencePiece model trained here (seeded) on the embedded sample (assets/sample
train.en/.de) plus the French lines below, laid out as the family's published checkpoints lay theirs out: Marian
`</s>`=0, `<unk>`=1, pieces, `<pad>` last (tags, when there are, right after the control pieces); the fairseq
families `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, pieces, then the language codes (every code the real tokenizer
has, so en, de, fr and cs are all there). The model's vocabulary covers every id the tokenizer can give,
embeddings are tied as in the real checkpoints, dropout is 0 and weights are seeded: the same family gives the
same files every time. The Marian `<pad>` embedding row is zero, as in converted OPUS-MT checkpoints.

The SentencePiece models and the built directories are cached for the process: a second `build_tiny` of a family
copies the first.
"""

from __future__ import annotations

import atexit
import io
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "assets" / "sample"

FAMILY_NAMES = ("marian", "marian-multi", "mbart", "mbart50", "m2m100", "nllb")
# The OPUS-MT multi-target tags (the newer three-letter style) of "marian-multi".
MARIAN_TAGS = (">>deu<<", ">>fra<<", ">>ces<<")
VOCAB_SIZE = 360
EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
SEED = 1234

# Written for these tests (with the English and German sample, the French gives the codes' languages real pieces).
FRENCH = """\
Le gouvernement a annoncé mardi un nouveau plan budgétaire.
De fortes pluies sont attendues dans le nord du pays ce week-end.
Le ministre des finances a déclaré que les impôts n'augmenteront pas l'année prochaine.
Un homme en chemise bleue regarde par la fenêtre.
Deux enfants jouent au football dans le parc.
La réunion commence à neuf heures demain matin.
Nous avons réservé une table pour quatre personnes.
Le train pour Paris part du quai numéro trois.
Elle lit un livre sous un grand arbre.
Le logiciel doit être mis à jour avant lundi.
Les chercheurs ont publié leurs résultats dans une revue scientifique.
Le médecin recommande de boire beaucoup d'eau.
Une femme vend des fruits et des légumes au marché.
Le chien court après une balle rouge sur la plage.
L'entreprise a embauché cent nouveaux employés cette année.
Il fait froid et le ciel est gris aujourd'hui.
Pouvez-vous m'aider à trouver la gare, s'il vous plaît ?
Les prix de l'énergie ont fortement augmenté cet hiver.
Un groupe de touristes visite le vieux château.
Le serveur apporte du café et des croissants.
Les élèves écoutent attentivement leur professeur.
La nouvelle version corrige plusieurs erreurs de sécurité.
Un cycliste traverse le pont au coucher du soleil.
Nous partons en vacances à la montagne en août.
Le musée est fermé le mardi.
Une petite fille porte un chapeau jaune.
Le conseil municipal votera le projet la semaine prochaine.
Les données sont enregistrées sur un serveur sécurisé.
Mon frère travaille dans une banque à Lyon.
Le restaurant propose un menu végétarien.
"""

_spm_cache: dict[tuple, bytes] = {}
_built: dict[str, Path] = {}
_cache_root: Path | None = None


def _remove_cache() -> None:
    if _cache_root is not None:
        shutil.rmtree(_cache_root, ignore_errors=True)


atexit.register(_remove_cache)


def corpus() -> list[str]:
    """The lines every tiny vocabulary is trained on."""
    lines: list[str] = []
    for name in ("train.en", "train.de"):
        lines += (SAMPLE / name).read_text(encoding="utf-8").splitlines()
    return [line for line in lines + FRENCH.splitlines() if line.strip()]


def spm_model(layout: str, model_type: str = "unigram", tags: tuple[str, ...] = ()) -> bytes:
    """A SentencePiece model (bytes) over `corpus()`. layout "marian": </s>=0, <unk>=1, no <s>, `tags` as
    user-defined pieces 2, 3, ...; "fairseq": SentencePiece's own <unk>=0, <s>=1, </s>=2 (what the fairseq
    families' converters expect: they drop those three and put <s> <pad> </s> <unk> in front)."""
    key = (layout, model_type, tags)
    if key not in _spm_cache:
        import sentencepiece as spm

        ids = {"marian": {"eos_id": 0, "unk_id": 1, "bos_id": -1, "pad_id": -1},
               "fairseq": {"unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1}}[layout]
        spm.set_random_generator_seed(SEED)
        model = io.BytesIO()
        # model_writer, not model_prefix: the prefix is stored in the model, and one per run would differ.
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(corpus()), model_writer=model, model_type=model_type, vocab_size=VOCAB_SIZE,
            hard_vocab_limit=False, character_coverage=1.0, byte_fallback=False, num_threads=1,
            user_defined_symbols=list(tags), minloglevel=2, **ids)
        _spm_cache[key] = model.getvalue()
    return _spm_cache[key]


def _seeded_model(build: Callable[[], object]):
    """The model `build()` makes, its random weights from a fixed seed (the caller's torch RNG left as it was)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = build()
    return model.eval()


def _layers() -> dict:
    """The tiny shape every family shares; dropout 0 so a forward pass is deterministic."""
    return dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
                decoder_layerdrop=0.0)


def _marian(out: Path, tags: tuple[str, ...]) -> None:
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    spm_bytes = spm_model("marian", tags=tags)
    for name in ("source.spm", "target.spm"):
        (out / name).write_bytes(spm_bytes)

    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    vocab[PAD] = len(vocab)  # OPUS-MT: <pad> is the last id
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = MarianTokenizer(source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"),
                                vocab=str(out / "vocab.json"), source_lang="en", target_lang=None if tags else "de",
                                unk_token=UNK, eos_token=EOS, pad_token=PAD, model_max_length=512)
    tokenizer.save_pretrained(out)
    pad = vocab[PAD]
    config = MarianConfig(vocab_size=len(vocab), pad_token_id=pad, eos_token_id=vocab[EOS],
                          decoder_start_token_id=pad, forced_eos_token_id=vocab[EOS], bos_token_id=None,
                          activation_function="swish", scale_embedding=True,
                          share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
                          tokenizer_class="MarianTokenizer", **_layers())
    model = _seeded_model(lambda: MarianMTModel(config))
    with torch.no_grad():
        model.get_input_embeddings().weight[pad].zero_()  # converted OPUS-MT checkpoints: a zero <pad> row
    model.save_pretrained(out)


def _fast_fairseq(out: Path, tokenizer_class: str, model_type: str, src: str, tgt: str, **kwargs):
    """A tokenizers-backed fairseq tokenizer (MBart, MBart50, Nllb) converted from the SentencePiece model by
    from_pretrained, as it converts a hub download that has only sentencepiece.bpe.model; saved to `out`."""
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sentencepiece.bpe.model").write_bytes(spm_model("fairseq", model_type))
        tokenizer = getattr(transformers, tokenizer_class).from_pretrained(tmp, src_lang=src, tgt_lang=tgt,
                                                                          model_max_length=512, **kwargs)
    # Loading details from_pretrained records, and SentencePiece's own <unk> id (0; the fairseq layout's is 3):
    # none is a setting of the tokenizer, and a published tokenizer_config.json has none of them.
    for key in ("is_local", "local_files_only", "unk_id"):
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.save_pretrained(out)
    # The published checkpoints ship the SentencePiece model beside tokenizer.json.
    (out / "sentencepiece.bpe.model").write_bytes(spm_model("fairseq", model_type))
    return tokenizer


def _mbart(out: Path, fifty: bool) -> None:
    from transformers import MBartConfig, MBartForConditionalGeneration

    if fifty:
        tokenizer = _fast_fairseq(out, "MBart50Tokenizer", "unigram", "en_XX", "de_DE")
        # facebook/mbart-large-50: decoding starts from </s>, the target code forced after it.
        start = {"decoder_start_token_id": tokenizer.eos_token_id}
    else:
        tokenizer = _fast_fairseq(out, "MBartTokenizer", "unigram", "en_XX", "de_DE")
        # facebook/mbart-large-cc25 sets no start token: labels are shifted with a wrap-around (the last label
        # token, the target code, starts the decoder).
        start = {}
    # MBart50Tokenizer has <s> as its cls token only (no bos_token): the configs still name it bos, id 0.
    config = MBartConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.convert_tokens_to_ids("<s>"), eos_token_id=tokenizer.eos_token_id,
                         forced_eos_token_id=tokenizer.eos_token_id, scale_embedding=True,
                         # The published configs name their tokenizer; CTranslate2's converter reads it to tell
                         # mBART-50 (decoding starts from </s>) from mBART-cc25 (from the target code).
                         tokenizer_class=type(tokenizer).__name__, **start, **_layers())
    _seeded_model(lambda: MBartForConditionalGeneration(config)).save_pretrained(out)


def _m2m100(out: Path) -> None:
    import sentencepiece as spm
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES as M2M100_CODES

    spm_bytes = spm_model("fairseq")
    (out / "sentencepiece.bpe.model").write_bytes(spm_bytes)
    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    # fairseq's dictionary: <s> <pad> </s> <unk>, then SentencePiece's pieces after its own three controls.
    pieces = [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]
    vocab = {token: i for i, token in enumerate(["<s>", PAD, EOS, UNK, *pieces])}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    # The codes named as special tokens, as facebook/m2m100_418M's tokenizer_config.json names them: this
    # constructor means to add them itself, but its test (a chained `not in`) is always false, and without them
    # they are neither in get_vocab() nor skipped by decode(skip_special_tokens=True).
    codes = [f"__{lang}__" for lang in M2M100_CODES["m2m100"]]
    tokenizer = M2M100Tokenizer(vocab_file=str(out / "vocab.json"), spm_file=str(out / "sentencepiece.bpe.model"),
                                src_lang="en", tgt_lang="de", additional_special_tokens=codes,
                                model_max_length=512)
    tokenizer.save_pretrained(out)
    # The language codes (and the made-up words after them) lie past the vocab.json ids: size the model past
    # them all, as facebook/m2m100_418M (128112 = 128004 + 100 codes + 8) is.
    vocab_size = max(tokenizer.lang_code_to_id.values()) + 1 + tokenizer.num_madeup_words
    config = M2M100Config(vocab_size=vocab_size, pad_token_id=tokenizer.pad_token_id,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          decoder_start_token_id=tokenizer.eos_token_id, scale_embedding=True,
                          tokenizer_class="M2M100Tokenizer", **_layers())
    _seeded_model(lambda: M2M100ForConditionalGeneration(config)).save_pretrained(out)


def _nllb(out: Path) -> None:
    from transformers import M2M100Config, M2M100ForConditionalGeneration
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    # NLLB-200's SentencePiece model is BPE (its tokenizer.json is a BPE model). Converting one, from_pretrained
    # passes the model's control pieces as additional_special_tokens, which replace NllbTokenizer's default
    # (the 202 codes): name the codes explicitly.
    tokenizer = _fast_fairseq(out, "NllbTokenizer", "bpe", "eng_Latn", "deu_Latn",
                              extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES))
    config = M2M100Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          decoder_start_token_id=tokenizer.eos_token_id, scale_embedding=True,
                          tokenizer_class="NllbTokenizer", **_layers())
    _seeded_model(lambda: M2M100ForConditionalGeneration(config)).save_pretrained(out)


# ---------------------------------------------------------------------------------- OPUS-MT as the hub holds it

# An OPUS-MT repository (Helsinki-NLP/opus-mt-en-de; opus-mt-en-mul for the multi-target one) as transformers'
# Marian converter wrote it: a SentencePiece model per side (source.spm, target.spm: different pieces), one joint
# vocab.json over both (</s> 0, <unk> 1, the pieces, <pad> appended last, its embedding row and logit bias zero),
# a tokenizer_config.json naming the languages only (no tokenizer_class, none in config.json either), and the
# generation settings in generation_config.json (decoding from <pad>, <pad> a bad word, beam 4, max_length 512).
# The multi-target one's tags are vocab.json entries, not SentencePiece pieces: MarianTokenizer splits a leading
# `>>xx<<` off itself.
OPUS_MT_NAMES = ("opus-mt", "opus-mt-multi")


def _lines_of(language: str) -> list[str]:
    text = FRENCH if language == "fr" else (SAMPLE / f"train.{language}").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def language_spm(languages: tuple[str, ...]) -> bytes:
    """A SentencePiece model (bytes) over the lines of `languages` only (en, de: the sample; fr: FRENCH), in the
    Marian layout: </s>=0, <unk>=1, no <s>."""
    key = ("languages", languages)
    if key not in _spm_cache:
        import sentencepiece as spm

        spm.set_random_generator_seed(SEED)
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter([line for language in languages for line in _lines_of(language)]),
            model_writer=model, model_type="unigram", vocab_size=VOCAB_SIZE, hard_vocab_limit=False,
            character_coverage=1.0, byte_fallback=False, num_threads=1, minloglevel=2, eos_id=0, unk_id=1,
            bos_id=-1, pad_id=-1)
        _spm_cache[key] = model.getvalue()
    return _spm_cache[key]


def _pieces(spm_bytes: bytes) -> list[str]:
    """The model's pieces without its control and unknown pieces (those vocab.json holds once, at 0 and 1)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]


def _opus_mt(out: Path, target_lang: str, targets: tuple[str, ...], tags: tuple[str, ...] = ()) -> None:
    """An OPUS-MT repository from English to `target_lang` (its name's code: de, mul), its target.spm over the
    `targets` languages' lines, with the target `tags` (multi-target)."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    source, target = language_spm(("en",)), language_spm(targets)
    (out / "source.spm").write_bytes(source)
    (out / "target.spm").write_bytes(target)
    vocab = {EOS: 0, UNK: 1}
    for token in (*tags, *_pieces(source), *_pieces(target)):
        vocab.setdefault(token, len(vocab))
    vocab[PAD] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({"target_lang": target_lang, "source_lang": "en"}),
                                               encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": EOS, "unk_token": UNK, "pad_token": PAD}),
                                                 encoding="utf-8")
    pad, eos = vocab[PAD], vocab[EOS]
    config = MarianConfig(vocab_size=len(vocab), decoder_vocab_size=len(vocab), pad_token_id=pad, eos_token_id=eos,
                          bos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=eos,
                          activation_function="swish", scale_embedding=True, share_encoder_decoder_embeddings=True,
                          tie_word_embeddings=True, **{**_layers(), "dropout": 0.1})
    model = _seeded_model(lambda: MarianMTModel(config))
    with torch.no_grad():
        model.get_input_embeddings().weight[pad].zero_()  # the converter appended <pad> as a zero row
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]], bos_token_id=0, decoder_start_token_id=pad, eos_token_id=eos,
        forced_eos_token_id=eos, max_length=512, num_beams=4, pad_token_id=pad, renormalize_logits=True)
    model.save_pretrained(out)


BUILDERS: dict[str, Callable[[Path], None]] = {
    "marian": lambda out: _marian(out, ()),
    "marian-multi": lambda out: _marian(out, MARIAN_TAGS),
    "mbart": lambda out: _mbart(out, fifty=False),
    "mbart50": lambda out: _mbart(out, fifty=True),
    "m2m100": _m2m100,
    "nllb": _nllb,
    "opus-mt": lambda out: _opus_mt(out, "de", ("de",)),
    "opus-mt-multi": lambda out: _opus_mt(out, "mul", ("de", "fr"), MARIAN_TAGS[:2]),
}


def build_tiny(family: str, out_dir: Path) -> Path:
    """Save a tiny random checkpoint of `family` (one of FAMILY_NAMES, or of OPUS_MT_NAMES: a Marian checkpoint laid
    out as the hub's OPUS-MT repositories are) to `out_dir` (created if missing) and return it: loadable by
    AutoModelForSeq2SeqLM / AutoTokenizer.from_pretrained."""
    global _cache_root
    if family not in BUILDERS:
        raise ValueError(f"build_tiny: unknown family {family!r}; one of {', '.join(BUILDERS)}")
    out_dir = Path(out_dir)
    if family not in _built:
        if _cache_root is None:
            _cache_root = Path(tempfile.mkdtemp(prefix="tiny_checkpoints_"))
        built = _cache_root / family
        shutil.rmtree(built, ignore_errors=True)  # what a failed build left
        built.mkdir()
        BUILDERS[family](built)
        _built[family] = built
    shutil.copytree(_built[family], out_dir, dirs_exist_ok=True)
    return out_dir
