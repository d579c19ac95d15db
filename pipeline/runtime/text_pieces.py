"""A model's tokenizer at run time, without transformers: the plain pieces of a text (its ids without any special
token: the direction's layout, pipeline.runtime.model_languages, puts those around them) and the text of generated ids.
Each family's class gives the ids and text its transformers tokenizer gives (`tokenizer(text,
add_special_tokens=False)` and `tokenizer.decode(ids, skip_special_tokens=True)`), from the files that tokenizer
saves:

    family                files                                     read with
    marian                source.spm, target.spm, vocab.json        sentencepiece (MarianSentencePiece)
                          (+ target_vocab.json: separate_vocabs)
    m2m100                sentencepiece.bpe.model, vocab.json       sentencepiece (M2M100SentencePiece)
    mbart, mbart50, nllb  tokenizer.json                            tokenizers (TokenizerJson)

transformers' Marian and M2M-100 tokenizers are Python code over a SentencePiece model and vocab.json, which is
reimplemented here: the text split around its added tokens (`</s>` written in a text is that token), each other
part cut into SentencePiece pieces, each piece looked up in vocab.json (unknown -> <unk>); decoding maps ids back
to pieces and the pieces to text with SentencePiece, a special token written out as itself between runs of pieces.
The other three families' tokenizers are `tokenizers` models, so tokenizer.json gives the same ids and text.

Decoding drops the tokenizer's special ids and `skip_ids` (the layouts' ids: language codes and tags, which
transformers' Marian and M2M-100 tokenizers would write out as text, though no translation should contain them).

transformers takes seconds to import and `mtpipe translate` must start fast: this module imports only the
standard library until a tokenizer is built (then sentencepiece or tokenizers, tens of milliseconds).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from pipeline.runtime.export_format import ExportDirError, read_export_json

SPIECE_UNDERLINE = "\u2581"
TOKENIZER_CONFIG = "tokenizer_config.json"
# Named special tokens of a tokenizer config, as transformers lists them (all_special_tokens).
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# A Marian tokenizer with separate_vocabs: the target side's pieces by id (vocab.json holds the source side's).
TARGET_VOCAB = "target_vocab.json"
# The files each family's runtime tokenizer reads (config aside).
TOKENIZER_FILES = {
    "marian": ("source.spm", "target.spm", "vocab.json"),
    "m2m100": ("sentencepiece.bpe.model", "vocab.json"),
    "mbart": ("tokenizer.json",),
    "mbart50": ("tokenizer.json",),
    "nllb": ("tokenizer.json",),
}


class TokenizerFilesError(ValueError):
    """A tokenizer file is missing or unreadable; the message names it."""


class TextPieces(Protocol):
    """What a runtime tokenizer does: a text's plain pieces, and the text of ids."""

    def pieces(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


def text_pieces(model_dir: str | Path, family: str, skip_ids: Iterable[int] = (), tagged: bool = False
                ) -> TextPieces:
    """The runtime tokenizer of a `family` (pipeline.runtime.families) model saved in `model_dir`; decoding also drops
    `skip_ids`; `tagged`: a Marian model whose sources start with a target tag (MarianSentencePiece). Raises
    TokenizerFilesError naming the file that is missing."""
    model_dir = Path(model_dir)
    if family not in TOKENIZER_FILES:
        raise TokenizerFilesError(f"{model_dir}: no runtime tokenizer for family {family!r}; one of "
                                  f"{', '.join(TOKENIZER_FILES)}")
    for name in TOKENIZER_FILES[family]:
        if not (model_dir / name).is_file():
            raise TokenizerFilesError(f"{model_dir / name} not found: a {family} tokenizer reads "
                                      f"{', '.join(TOKENIZER_FILES[family])}")
    if family == "marian":
        return MarianSentencePiece(model_dir, skip_ids, tagged)
    if family == "m2m100":
        return M2M100SentencePiece(model_dir, skip_ids)
    return TokenizerJson(model_dir, skip_ids)


def read_json(path: Path) -> Any:
    """A tokenizer's JSON file (the export format's reader), its errors as TokenizerFilesError naming the file."""
    try:
        return read_export_json(path)
    except ExportDirError as err:
        raise TokenizerFilesError(str(err)) from None


def token_text(token: Any) -> str:
    """A special token of tokenizer_config.json, stored either as a string or as an AddedToken dict."""
    return token["content"] if isinstance(token, dict) else str(token)


def clean_up_tokenization(text: str) -> str:
    """transformers' `clean_up_tokenization` (applied where a tokenizer config asks for it)."""
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                           (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(spaced, joined)
    return text


class SentencePieceVocabulary:
    """transformers' SentencePiece-and-vocab.json tokenizers (its "python backend"); subclasses say how a part of
    the text becomes pieces, which model decodes, and how an id outside vocab.json and the special tokens read."""

    encode_model = ""  # the SentencePiece file that cuts text
    decode_model = ""  # the one that joins pieces back into text

    def __init__(self, model_dir: Path, skip_ids: Iterable[int] = ()):
        import sentencepiece as spm

        self.model_dir = Path(model_dir)
        self.config: dict[str, Any] = read_json(self.model_dir / TOKENIZER_CONFIG)
        self.vocab: dict[str, int] = read_json(self.model_dir / "vocab.json")
        self.pieces_of_ids = {i: piece for piece, i in self.vocab.items()}
        self.encoder_spm = spm.SentencePieceProcessor(model_file=str(self.model_dir / self.encode_model))
        self.decoder_spm = (self.encoder_spm if self.decode_model == self.encode_model
                            else spm.SentencePieceProcessor(model_file=str(self.model_dir / self.decode_model)))
        self.unk_token = token_text(self.config.get("unk_token", "<unk>"))
        self.eos_token = token_text(self.config.get("eos_token", "</s>"))
        self.pad_token = token_text(self.config.get("pad_token", "<pad>"))
        self.unk_id, self.eos_id, self.pad_id = (self.vocab[t] for t in (self.unk_token, self.eos_token,
                                                                         self.pad_token))
        # Added tokens: kept whole when written in a text (with their strip rules), decoded as themselves.
        self.added: dict[str, tuple[int, dict[str, Any]]] = {
            entry["content"]: (int(i), entry) for i, entry in self.config.get("added_tokens_decoder", {}).items()}
        self.added_by_id = {i: content for content, (i, _) in self.added.items()}
        self.special_tokens = {token_text(self.config[key]) for key in SPECIAL_TOKEN_KEYS if self.config.get(key)}
        for key in ("extra_special_tokens", "additional_special_tokens"):
            if isinstance(listed := self.config.get(key), list):
                self.special_tokens.update(token_text(t) for t in listed)
        self.special_ids = {self.id_of(t) for t in self.special_tokens}
        self.skip_ids = self.special_ids | {int(i) for i in skip_ids}
        self._added_pattern = (re.compile("|".join(re.escape(t) for t in sorted(self.added, key=len, reverse=True)))
                               if self.added else None)
        self.clean_up = bool(self.config.get("clean_up_tokenization_spaces", False))

    # -------------------------------------------------------------------------------------------- text -> ids

    def id_of(self, token: str) -> int:
        if token in self.added:
            return self.added[token][0]
        return self.vocab.get(token, self.unk_id)

    def pieces(self, text: str) -> list[int]:
        """The ids of a text without special tokens of the layout (an added token written in it stays one)."""
        tokens: list[str] = []
        for k, (part, is_added) in enumerate(self._split_added(text)):
            tokens += [part] if is_added else self._tokenize(part, leading=k == 0)
        return [self.id_of(t) for t in tokens]

    def _tokenize(self, text: str, leading: bool) -> list[str]:
        """The pieces of a part of the text without added tokens (`leading`: the text's first part)."""
        return self.encoder_spm.encode(text, out_type=str)

    def _split_added(self, text: str) -> list[tuple[str, bool]]:
        """The text cut around its added tokens (leftmost, longest first), each token's lstrip/rstrip applied to
        its neighbours, as transformers' `tokenize` does; empty parts dropped."""
        if self._added_pattern is None:
            return [(text, False)] if text else []
        parts: list[list[Any]] = []
        at = 0
        for match in self._added_pattern.finditer(text):
            parts += [[text[at : match.start()], False], [match.group(), True]]
            at = match.end()
        parts.append([text[at:], False])
        for k, (part, is_added) in enumerate(parts):
            if not is_added:
                continue
            rules = self.added[part][1]
            if rules.get("rstrip") and k + 1 < len(parts):
                parts[k + 1][0] = parts[k + 1][0].lstrip()
            if rules.get("lstrip") and k > 0:
                parts[k - 1][0] = parts[k - 1][0].rstrip()
        return [(part, is_added) for part, is_added in parts if part]

    # -------------------------------------------------------------------------------------------- ids -> text

    def decode(self, ids: Iterable[int]) -> str:
        """The text of generated ids, special ids and `skip_ids` dropped."""
        tokens = [self.added_by_id.get(i) or self._token_of(i) for i in (int(i) for i in ids)
                  if i not in self.skip_ids]
        text = self._join(tokens)
        return clean_up_tokenization(text) if self.clean_up else text

    def _token_of(self, index: int) -> str:
        return self.pieces_of_ids.get(index, self.unk_token)

    def _join(self, tokens: list[str]) -> str:
        raise NotImplementedError


class MarianSentencePiece(SentencePieceVocabulary):
    """MarianTokenizer's ids and text. A leading `>>xx<<` language code of a text part is kept as one token;
    text is decoded with the source model unless the vocabularies are separate; an id outside vocab.json falls
    back to the SentencePiece model's piece.

    `tagged`: the model's sources are read with the target's tag in front (`>>fr<< ` + text, the layout's source
    prefix), so the text's own first part is not at the start: a `>>xx<<` it begins with is text, as
    MarianTokenizer reads it there."""

    encode_model = "source.spm"

    def __init__(self, model_dir: Path, skip_ids: Iterable[int] = (), tagged: bool = False):
        config = read_json(Path(model_dir) / TOKENIZER_CONFIG)
        separate = bool(config.get("separate_vocabs"))
        self.decode_model = "target.spm" if separate else "source.spm"
        self.tagged = tagged
        super().__init__(model_dir, skip_ids)
        if separate:
            # Outputs are target ids: with separate vocabularies they name target_vocab.json's pieces, as
            # MarianTokenizer decodes them (vocab.json holds the source side's, other pieces at the same ids).
            target_vocab = self.model_dir / TARGET_VOCAB
            if not target_vocab.is_file():
                raise TokenizerFilesError(f"{target_vocab} not found: {TOKENIZER_CONFIG} says separate_vocabs, "
                                          "whose target ids it names")
            self.pieces_of_ids = {i: piece for piece, i in read_json(target_vocab).items()}

    def encode(self, text: str) -> list[int]:
        """MarianTokenizer's ids of a text: its pieces, then </s> (untruncated)."""
        return [*self.pieces(text), self.eos_id]

    def _tokenize(self, text: str, leading: bool) -> list[str]:
        code: list[str] = []
        if not (leading and self.tagged) and text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        return code + self.encoder_spm.encode(text, out_type=str)

    def _token_of(self, index: int) -> str:
        if index in self.pieces_of_ids:
            return self.pieces_of_ids[index]
        in_model = 0 <= index < self.decoder_spm.get_piece_size()
        return (self.decoder_spm.id_to_piece(index) if in_model else "") or self.unk_token

    def _join(self, tokens: list[str]) -> str:
        out, run = "", []
        for token in tokens:
            if token in self.special_tokens:  # not decoded by SentencePiece
                out += self.decoder_spm.decode_pieces(run) + token + " "
                run = []
            else:
                run.append(token)
        out += self.decoder_spm.decode_pieces(run)
        return out.replace(SPIECE_UNDERLINE, " ").strip()


class M2M100SentencePiece(SentencePieceVocabulary):
    """M2M100Tokenizer's ids and text (its language codes lie past vocab.json: the layouts hold the ones a model
    uses, and no text asks for them)."""

    encode_model = decode_model = "sentencepiece.bpe.model"

    def _join(self, tokens: list[str]) -> str:
        out, run = "", []
        for token in tokens:
            if token in self.special_tokens:
                out += self.decoder_spm.decode(run) + token
                run = []
            else:
                run.append(token)
        out += self.decoder_spm.decode(run)
        return out.strip()


class TokenizerJson:
    """A `tokenizers` model's ids and text (mBART, mBART-50, NLLB: their transformers tokenizers are this model
    plus the language codes the layout places)."""

    def __init__(self, model_dir: Path, skip_ids: Iterable[int] = ()):
        from tokenizers import Tokenizer

        self.model_dir = Path(model_dir)
        path = self.model_dir / "tokenizer.json"
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a plain Exception for a file it cannot parse
            raise TokenizerFilesError(f"{path}: not a tokenizers file ({err})") from None
        config = read_json(self.model_dir / TOKENIZER_CONFIG)
        self.skip_ids = {int(i) for i in skip_ids}
        self.clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        if self.clean_up and not config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"):
            # transformers skips its clean-up for BPE models unless forced (it eats spaces before punctuation).
            self.clean_up = type(self.tokenizer.model).__name__ != "BPE"

    def pieces(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        text = self.tokenizer.decode([int(i) for i in ids if int(i) not in self.skip_ids], skip_special_tokens=True)
        return clean_up_tokenization(text) if self.clean_up else text
