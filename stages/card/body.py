"""The model card's text (markdown, after the YAML metadata): what a person deciding whether to use the model
needs, all of it read from the run's own files, never typed by hand.

Scores per test set and direction (and their macro average) with their signatures; the training data (source,
rows per split from the download's manifest, rows the clean stage kept and why it rejected the others, and the
same per direction when there are several); the model and the params that shaped it; how training went (time,
hardware, stopping point); the export's parity with PyTorch; and how to use it with transformers, `mtpipe
translate` and CTranslate2 (with the target's `>>de<<` tag and `--tgt` when the model has several targets).

A fine-tuned checkpoint (model.init: pretrained) is described by its own config (family, sizes, tokenizer, language
codes: stages/card/checkpoint.py), not by model.preset, and its usage asks for the target the family's way
(mBART-50: src_lang and forced_bos_token_id; CTranslate2: the code as target prefix).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from pipeline.params import MACRO, Params
from pipeline.run_figures import Evaluation, ExportParity, TrainingRun
from pipeline.runtime.languages import Directions
from pipeline.runtime.model_languages import ModelLanguages
from stages.card.checkpoint import PretrainedCheckpoint
from stages.card.metadata import direction_of, model_name


@dataclass(frozen=True)
class CardInputs:
    """Everything the card shows, read once by the stage."""

    params: Params
    evaluation: Evaluation
    training: TrainingRun
    parity: ExportParity
    manifest: dict[str, Any]  # data/raw/manifest.json
    clean: dict[str, Any]  # metrics/clean.json
    model_config: dict[str, Any]  # models/final/config.json
    languages: ModelLanguages  # models/final/languages.json: the directions, family and codes the model has
    checkpoint: PretrainedCheckpoint | None  # the checkpoint fine-tuned (model.init: pretrained); None from scratch


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]], right: tuple[int, ...] = ()) -> list[str]:
    align = ["---:" if i in right else "---" for i in range(len(header))]
    return [f"| {' | '.join(header)} |", f"|{'|'.join(align)}|",
            *(f"| {' | '.join('' if v is None else str(v) for v in row)} |" for row in rows)]


def _number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def scores_section(card: CardInputs) -> list[str]:
    scored, macro = card.evaluation.scored, card.evaluation.macro
    directions = card.languages.directions
    rows = [(s.test_set, direction_of(s, directions), s.sentences, _number(s.bleu), _number(s.chrf), _number(s.ter),
             _number(s.length_ratio, 3)) for s in scored]
    if len(scored) > 1 and macro:
        rows.append((MACRO, f"mean of {len(scored)}", "", _number(macro.get("bleu")), _number(macro.get("chrf")),
                     _number(macro.get("ter")), ""))
    lines = ["## Scores", "", "sacreBLEU on detokenized, cased text against one reference; length ratio is hypothesis "
             "over reference length in BLEU's tokens.", "",
             *_table(("test set", "direction", "sentences", "BLEU", "chrF", "TER", "length ratio"), rows,
                     right=(2, 3, 4, 5, 6))]
    if scored:
        lines += ["", "Signatures:", ""]
        lines += [f"- {name}: `{signature}`" for name, signature in scored[0].signatures.items()]
    e = card.params.evaluate
    lines += ["", f"Decoding: beam {e.beam}, length penalty {e.length_penalty}, at most {e.max_len_a} x source + "
              f"{e.max_len_b} tokens."]
    return lines


def _input_name(path: str) -> str:
    """An input file by its name, not by where it lay on the machine that ran the pipeline."""
    return PurePath(path).name


def _direction_rows(card: CardInputs) -> list[tuple[Any, ...]]:
    """(direction, split, pairs read, kept, rejected, train's rejection reasons) from the manifest's
    rows_per_direction and metrics/clean.json's directions; [] for files written before directions."""
    read, clean = card.manifest.get("rows_per_direction", {}), card.clean.get("directions", {})
    rows = []
    for direction in card.languages.directions.names:
        counted = clean.get(direction, {})
        reasons = ", ".join(f"{reason} {n}" for reason, n in counted.get("reasons", {}).items())
        for split, per_direction in read.items():
            if direction in per_direction:
                kept = counted.get(split, {})
                rows.append((direction, split, per_direction[direction], kept.get("kept"), kept.get("rejected"),
                             reasons if split == "train" else ""))
    return rows


def data_section(card: CardInputs) -> list[str]:
    manifest, clean = card.manifest, card.clean.get("splits", {})
    source = manifest.get("source", "?")
    revision = f"revision {manifest.get('revision') or 'latest'}"
    hub = ("a local copy of the Hugging Face dataset layout at " if manifest.get("dataset_is_local")
           else "the Hugging Face dataset ") + f"`{manifest.get('dataset', '')}`"
    described = {"sample": "the embedded sample corpus of mtpipe", "files": "local files",
                 "wmt14": f"WMT14 ({manifest.get('dataset', '')}, {revision})",
                 "hub": hub + ("" if manifest.get("dataset_is_local") else f" ({revision})")}
    rows = []
    for split, read in manifest.get("splits", {}).items():
        kept = clean.get(split, {})
        reasons = ", ".join(f"{reason} {n}" for reason, n in kept.get("reasons", {}).items())
        rows.append((split, read, kept.get("kept"), kept.get("rejected"), reasons))
    pairs = ", ".join(f"{d.src} → {d.tgt}" for d in card.languages.directions.directions)
    lines = ["## Training data", "", f"{pairs} pairs from {described.get(source, source)}.",
             "", *_table(("split", "pairs read", "kept", "rejected", "rejected because"), rows, right=(1, 2, 3))]
    by_direction = _direction_rows(card) if len(card.languages.directions.names) > 1 else []
    if by_direction:
        lines += ["", "Per direction (the reasons are the training split's):",
                  "", *_table(("direction", "split", "pairs read", "kept", "rejected", "rejected because"),
                              by_direction, right=(2, 3, 4))]
    if manifest.get("subsample"):
        lines += ["", f"Training pairs subsampled: `{manifest['subsample']}`."]
    if manifest.get("inputs"):
        lines += ["", "Input files (sha256):", ""]
        lines += [f"- `{_input_name(path)}` `{sha[:16]}…`" for path, sha in manifest["inputs"].items()]
    return lines


def _shared_vocabulary(directions: Directions) -> str:
    count = len(directions.languages)
    return ", one model for both languages" if count == 2 else f", one model for all {count} languages"


def _tags(pairs: Directions) -> str:
    """What a multi-target model reads in front of each source."""
    return f"; each source starts with its target's tag ({', '.join(pairs.tags)})" if pairs.target_tags else ""


def _extra_dropout(arch: dict[str, Any]) -> str:
    """The attention and activation dropout where set (no preset sets them)."""
    extra = [f"{kind} {arch[f'{kind}_dropout']}" for kind in ("attention", "activation") if arch[f"{kind}_dropout"]]
    return f" ({', '.join(extra)})" if extra else ""


def _subword_regularization(tok: Any) -> str:
    """The sampled segmentations the model trained on beside the one best, where there were any."""
    if not tok.sampled_copies:
        return ""
    return (f"; trained with subword regularization: every training pair also in {tok.sampled_copies} segmentations "
            f"sampled from the {tok.sampling_nbest} best (alpha {tok.sampling_alpha}), decoded with the one best")


def _scratch_rows(card: CardInputs) -> list[tuple[str, str]]:
    """A model trained from scratch: the preset with its overrides, and the project's own SentencePiece model."""
    p, config, directions = card.params, card.model_config, card.languages.directions
    arch = p.model.architecture()
    return [
        ("architecture", f"Marian transformer, preset `{p.model.preset}`: d_model {arch['d_model']}, "
                         f"{arch['encoder_layers']}+{arch['decoder_layers']} layers, {arch['attention_heads']} heads, "
                         f"FFN {arch['ffn_dim']}, dropout {arch['dropout']}{_extra_dropout(arch)}"),
        ("parameters", f"{card.training.parameters:,}" if card.training.parameters else "n/a"),
        ("vocabulary", f"{config.get('vocab_size')} pieces, SentencePiece {p.tokenize.model_type}"
                       f"{_shared_vocabulary(directions) if p.tokenize.joint else ', one model per language'}"
                       f"{', embeddings tied to the output projection' if p.model.tie_embeddings else ''}"
                       f"{_tags(directions)}{_subword_regularization(p.tokenize)}"),
    ]


def _pretrained_rows(card: CardInputs, checkpoint: PretrainedCheckpoint) -> list[tuple[str, str]]:
    """A fine-tuned checkpoint: its architecture and tokenizer as its config says (model.preset does not apply),
    and what fine-tuning kept fixed."""
    t = card.params.train
    return [
        ("architecture", checkpoint.architecture()),
        ("parameters", f"{card.training.parameters:,}" if card.training.parameters else "n/a"),
        ("vocabulary", checkpoint.vocabulary()),
        ("fine-tuning", f"frozen: {', '.join(t.freeze) or 'nothing'}; gradient checkpointing "
                        f"{'on' if t.gradient_checkpointing else 'off'}"),
    ]


def model_section(card: CardInputs) -> list[str]:
    p, run, checkpoint = card.params, card.training, card.checkpoint
    if checkpoint is None:
        model_class, init, described = "MarianMTModel", "trained from scratch", _scratch_rows(card)
    else:
        name = p.model.name_or_path or ""
        # A hub name as given; a local directory by its name, not by where it lay on the machine that ran this.
        source = f"the local checkpoint `{_input_name(name)}`" if Path(name).exists() else f"`{name}`"
        model_class, init = checkpoint.model_class, f"fine-tuned from {source}"
        described = _pretrained_rows(card, checkpoint)
    t = p.train
    shaped = [
        *described,
        ("optimisation", f"AdamW, lr {t.lr}, {t.warmup_steps} warmup steps (inverse sqrt), weight decay "
                         f"{t.weight_decay}, label smoothing {t.label_smoothing}, clip norm {t.clip_norm}"
                         + (f", word dropout {t.word_dropout}" if t.word_dropout else "")),
        ("batches", f"{t.max_tokens} tokens x update_freq {t.update_freq} x {run.processes} process(es), "
                    f"sentences up to {t.max_len} tokens"),
        ("limits", ", ".join(f"{name} {'none' if value is None else value}" for name, value in (
            ("max_steps", t.max_steps), ("max_epochs", t.max_epochs), ("max_minutes", t.max_minutes),
            ("patience", t.patience)))),
        ("precision, seed", f"{t.precision}, seed {t.seed}"),
    ]
    minutes = f"{run.seconds / 60:.1f} min" if run.seconds is not None else "n/a"
    figures = [
        ("updates", f"{run.steps} ({run.epochs} epochs), stopped by {run.stop_reason}"),
        ("training time", f"{minutes} on {run.hardware}"),
        ("throughput", f"{run.tgt_tokens_per_s} target tokens/s (median)" if run.tgt_tokens_per_s else "n/a"),
        ("best valid loss", f"{run.best_valid_loss} (valid BLEU {run.best_valid_bleu})"
                            f"{', means over the directions' if len(card.languages.directions.names) > 1 else ''}"),
        ("weights", run.final_model),
    ]
    return ["## Model and training", "", f"`{model_class}` {init} by mtpipe's train stage (a plain PyTorch loop).",
            "", *_table(("", "params.yaml"), shaped), "", *_table(("", "this run"), figures)]


def export_section(card: CardInputs) -> list[str]:
    x = card.parity
    lines = ["## Export", "", f"`models/export` holds {', '.join(x.formats) or 'no graphs'}; on {x.sentences} "
             "parity sentences, against PyTorch:", ""]
    rows = [("greedy outputs identical", "n/a" if x.identical_share is None else f"{x.identical_share:.1%}"),
            ("largest logit difference (fp32, max abs)",
             "n/a" if x.max_logit_diff is None else f"{x.max_logit_diff:.1e}"),
            ("corpus BLEU difference", _number(x.bleu_delta))]
    if x.int8_identical_share is not None:
        rows += [("int8: greedy outputs identical", f"{x.int8_identical_share:.1%}"),
                 ("int8: corpus BLEU difference", _number(x.int8_bleu_delta))]
    return [*lines, *_table(("", ""), rows)]


def _translate_command(card: CardInputs) -> str:
    """`mtpipe translate` for the first direction: --tgt when the model has a choice of target, --src when that
    target has a choice of source."""
    pairs, beam = card.languages.directions, card.params.evaluate.beam
    first = pairs.directions[0]
    choose = f" --tgt {first.tgt}" if pairs.target_tags else ""
    if sum(d.tgt == first.tgt for d in pairs.directions) > 1:
        choose += f" --src {first.src}"
    return f"mtpipe translate --model models/export{choose} --beam {beam} < input.{first.src} > output.{first.tgt}"


@dataclass(frozen=True)
class TargetRequest:
    """How the usage snippets ask the model for the first direction's target, the way its family does."""

    text: str  # the source as the tokenizer is given it (a Marian multi-target model: the target's tag in front)
    tokenizer_args: str = ""  # more AutoTokenizer.from_pretrained arguments (the family's src_lang)
    generate_args: str = ""  # more generate arguments (the target's code forced, or decoding started from it)
    ct2_args: str = ""  # more translate_batch arguments (the target's code as the target prefix)
    comment: tuple[str, ...] = ()  # what the snippet's reader needs to know to ask for another target
    added: str = "the tag is"  # what `mtpipe translate --tgt` adds for the user

    @property
    def ct2_drops_prefix(self) -> bool:
        """CTranslate2 returns the target prefix in the hypothesis: the code is cut off before decoding."""
        return bool(self.ct2_args)


def target_request(card: CardInputs, sentence: str) -> TargetRequest:
    pairs, checkpoint = card.languages.directions, card.checkpoint
    first = pairs.directions[0]
    targets = ", ".join(pairs.targets)
    if checkpoint is None or not checkpoint.family.sets_languages:
        # Marian, ours or OPUS-MT: the target's tag is text in front of the source. Ours has tags only with several
        # targets; a multi-target OPUS-MT checkpoint needs its tag (languages.json's code) even for one.
        if checkpoint is None:
            tag = pairs.tags[0] if pairs.target_tags else None
        else:
            tag = checkpoint.codes.get(first.tgt)
        if tag is None:
            return TargetRequest(text=sentence)
        return TargetRequest(text=f"{tag} {sentence}",
                             comment=(f"# The leading {tag} asks for {first.tgt}; this model's targets: {targets}.",))
    source, target = checkpoint.codes[first.src], checkpoint.codes[first.tgt]
    argument = checkpoint.generate_argument()
    started = (f"starts decoding from {target}" if argument == "decoder_start_token_id"
               else f"forces {target} as the first token")
    return TargetRequest(
        text=sentence, added="the language codes are",
        tokenizer_args=f", src_lang={json.dumps(checkpoint.src_lang(first.src))}",
        generate_args=f", {argument}=tokenizer.convert_tokens_to_ids({json.dumps(target)})",
        ct2_args=f", target_prefix=[[{json.dumps(target)}]]",
        comment=(f"# src_lang marks the source as {first.src} ({source}); generate {started}, asking for "
                 f"{first.tgt}. This model's codes: "
                 f"{', '.join(f'{lang} {code}' for lang, code in checkpoint.codes.items())}; targets: {targets}.",),
    )


def usage_section(card: CardInputs) -> list[str]:
    pairs, beam = card.languages.directions, card.params.evaluate.beam
    # The length penalty the scores above were decoded with (`mtpipe translate` reads it from the export).
    penalty = card.params.evaluate.length_penalty
    first = pairs.directions[0]
    ask = target_request(card, "The weather is nice today." if first.src == "en" else "...")
    # json.dumps: a Python string literal in double quotes, whatever the sentence holds.
    example = json.dumps(ask.text)
    best = "best[1:]" if ask.ct2_drops_prefix else "best"
    return [
        "## Use", "",
        "With transformers (its `translation` pipeline is gone in version 5: `generate` it is):", "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        "",
        'model = AutoModelForSeq2SeqLM.from_pretrained("models/release")',
        f'tokenizer = AutoTokenizer.from_pretrained("models/release"{ask.tokenizer_args})',
        *ask.comment,
        f'batch = tokenizer([{example}], return_tensors="pt", padding=True)',
        f"out = model.generate(**batch{ask.generate_args}, num_beams={beam}, length_penalty={penalty}, "
        "max_new_tokens=256)",
        "print(tokenizer.batch_decode(out, skip_special_tokens=True))",
        "```", "",
        "With the ONNX export, on ONNX Runtime alone (no torch), one sentence a line"
        f"{f' (`--tgt` names the target language; {ask.added} added for you)' if pairs.target_tags else ''}:", "",
        "```bash",
        _translate_command(card),
        "```", "",
        "With CTranslate2 (`export.ctranslate2: true` writes `models/export/ctranslate2`; or convert this directory):",
        "",
        "```python",
        "import ctranslate2",
        "from transformers import AutoTokenizer",
        "",
        "# ct2-transformers-converter --model models/release --output_dir ct2 --quantization int8",
        'translator = ctranslate2.Translator("ct2")',
        f'tokenizer = AutoTokenizer.from_pretrained("models/release"{ask.tokenizer_args})',
        f"source = tokenizer.convert_ids_to_tokens(tokenizer.encode({example}))",
        "# min_decoding_length=0: </s> may come first, as in generate (CTranslate2's default forbids it)",
        f"best = translator.translate_batch([source]{ask.ct2_args}, beam_size={beam}, length_penalty={penalty},",
        "                                  min_decoding_length=0)[0].hypotheses[0]",
        f"print(tokenizer.decode(tokenizer.convert_tokens_to_ids({best})))",
        "```",
    ]


def _translates(pairs: Directions) -> str:
    """`en into de and fr; de into en`: the directions grouped by source language."""
    targets = {src: [d.tgt for d in pairs.directions if d.src == src] for src in pairs.sources}
    return "; ".join(f"{src} into {' and '.join(tgts)}" for src, tgts in targets.items())


def student_section(card: CardInputs) -> list[str]:
    """A distilled student's card: of which teacher, on what, and the teacher's scores beside its own."""
    distillation = card.manifest.get("distillation")
    if distillation is None:
        return []
    teacher = distillation["teacher"]
    sources = sum(d["sources"] for d in distillation["directions"].values())
    references = sum(d["references"] for d in distillation["directions"].values())
    rows = [(s.test_set, direction_of(s, card.languages.directions), _number(s.bleu),
             _number(s.teacher_bleu), f"{s.bleu - s.teacher_bleu:+.2f}")
            for s in card.evaluation.scored if s.teacher_bleu is not None]
    return ["## Distillation", "",
            f"A student: trained on its teacher's translations (sequence-level knowledge distillation, Kim & Rush "
            f"2016). The teacher, the export `{_input_name(teacher['export'])}` (graphs sha256 "
            f"`{teacher['digest']}`, {teacher['runtime']}), translated the {sources} training sources with beam "
            f"{teacher['beam']}; {references} original pairs (distill.original_ratio "
            f"{distillation['original_ratio']}) joined its translations.", "",
            *_table(("test set", "direction", "student BLEU", "teacher BLEU", "difference"), rows,
                    right=(2, 3, 4))]


def card_body(card: CardInputs) -> str:
    scored, macro = card.evaluation.scored, card.evaluation.macro
    headline = [f"{s.label} BLEU {s.bleu:.2f} / chrF {s.chrf:.2f}" for s in scored]
    if len(scored) > 1 and macro:
        headline.append(f"{MACRO} BLEU {macro['bleu']:.2f} / chrF {macro['chrf']:.2f}")
    warning = card.training.cut_short
    name = model_name(card.params, card.languages.directions, "distillation" in card.manifest)
    lines = [f"# {name}", "", *([f"> **Warning:** {warning}", ""] if warning else []),
             f"Translates {_translates(card.languages.directions)}. {', '.join(headline)}.", "",
             "Everything on this card was written by the pipeline's card stage from the run's own metrics and "
             "params (`dvc repro` rewrites it).", ""]
    for section in (scores_section, student_section, data_section, model_section, export_section, usage_section):
        lines += [*section(card), ""]
    return "\n".join(lines)
