"""export: the trained model as ONNX (and legacy TorchScript) graphs, gated by a parity check against PyTorch.

Two graphs per format, so a runtime without transformers can translate with a small greedy or beam loop:

    encoder(input_ids, attention_mask) -> last_hidden_state
    decoder(decoder_input_ids, encoder_hidden_states, encoder_attention_mask) -> logits

The decoder has no KV cache yet: every step feeds the full target prefix. Batch size and both sequence lengths are
dynamic. `models/export` also gets the tokenizer files, config.json, generation_config.json and an `export.json`
manifest, so it is self-contained: nothing from `models/final` is needed to translate with it.

The parity gate runs on the first `export.parity_sentences` pairs of the first test split, against the model as
PyTorch runs it: (a) encoder hidden states and (b) teacher-forced decoder logits, max abs diff <=
`export.max_logit_diff` for each exported format; (c) greedy decoding with ONNX Runtime gives token-identical output
to `model.generate` on at least `export.min_identical` of the sentences. A failed gate raises `ParityFailed` and
leaves any previous `models/export` in place, because the directory is only renamed into place after the gate.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifacts import Paths, atomic_path, test_splits, write_json
from pipeline.corpus import read_pairs
from pipeline.errors import MissingArtifact, ParityFailed
from pipeline.params import Params

log = logging.getLogger("mtpipe.export")

ENCODER_INPUTS = ("input_ids", "attention_mask")
ENCODER_OUTPUTS = ("last_hidden_state",)
DECODER_INPUTS = ("decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask")
DECODER_OUTPUTS = ("logits",)
GRAPHS = ("encoder", "decoder")
FILE_NAMES = {
    "onnx": {"encoder": "encoder.onnx", "decoder": "decoder.onnx"},
    "torchscript": {"encoder": "encoder.ts.pt", "decoder": "decoder.ts.pt"},
}
# Files of models/final that are the PyTorch weights; everything else (tokenizer, configs) is copied.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")
ORT_THREADS = 2
# Parity sentences are run in batches of this many (padded), which bounds the teacher-forced logits' memory.
PARITY_BATCH = 16
MANIFEST = "export.json"


# --------------------------------------------------------------------------------------------------- wrappers


@functools.cache
def _wrapper_classes() -> dict[str, type]:
    """The wrapper classes, defined on first use so that importing this module does not import torch."""
    from torch import nn

    class EncoderForExport(nn.Module):
        """input_ids, attention_mask -> last_hidden_state."""

        def __init__(self, model: Any):
            super().__init__()
            self.encoder = model.get_encoder()

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class DecoderForExport(nn.Module):
        """decoder_input_ids, encoder_hidden_states, encoder_attention_mask -> logits (no cache)."""

        def __init__(self, model: Any):
            super().__init__()
            self.decoder = model.get_decoder()
            self.lm_head = model.lm_head
            # Marian adds a bias buffer outside lm_head; MarianMTModel.forward does the same sum.
            self.register_buffer("final_logits_bias", model.final_logits_bias.detach().clone())

        def forward(self, decoder_input_ids: Any, encoder_hidden_states: Any, encoder_attention_mask: Any) -> Any:
            hidden = self.decoder(
                input_ids=decoder_input_ids,
                encoder_hidden_states=encoder_hidden_states,
                encoder_attention_mask=encoder_attention_mask,
                use_cache=False,
            ).last_hidden_state
            return self.lm_head(hidden) + self.final_logits_bias

    return {"EncoderForExport": EncoderForExport, "DecoderForExport": DecoderForExport}


def __getattr__(name: str) -> Any:
    # `from stages.export import EncoderForExport` works; torch is imported only then.
    if name in ("EncoderForExport", "DecoderForExport"):
        return _wrapper_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def export_wrappers(model: Any) -> tuple[Any, Any]:
    """(EncoderForExport, DecoderForExport) around a loaded model, in eval mode."""
    classes = _wrapper_classes()
    return classes["EncoderForExport"](model).eval(), classes["DecoderForExport"](model).eval()


# --------------------------------------------------------------------------------------------------- inputs


def _pad(rows: list[list[int]], pad_id: int, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id lists into (ids, mask) int64 arrays."""
    length = length or max(len(r) for r in rows)
    ids = np.full((len(rows), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def _teacher_forced_inputs(targets: list[list[int]], start_id: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Decoder inputs (start token + reference minus its last token) and a mask of the real positions."""
    return _pad([[start_id, *t[:-1]] for t in targets], pad_id)


def _example_inputs(sources: list[list[int]], targets: list[list[int]], start_id: int, pad_id: int) -> dict:
    """Trace/export inputs: batch 2, lengths >= 2 and padding in every row.

    torch.export specialises dimensions of size 0 or 1, and jit.trace records whichever mask branch the example
    takes, so the example must have a masked position to keep the padding mask in the traced graph.
    """
    import torch

    src = [sources[i % len(sources)] for i in range(2)]
    tgt = [targets[i % len(targets)] for i in range(2)]
    ids, mask = _pad(src, pad_id, length=max(len(s) for s in src) + 1)
    dec_ids, _ = _pad([[start_id, *t[:2]] for t in tgt], pad_id, length=3)
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask),
        "decoder_input_ids": torch.from_numpy(dec_ids),
    }


# --------------------------------------------------------------------------------------------------- export


@contextmanager
def _quiet_export() -> Iterator[None]:
    """Hide warnings that are known and harmless here; the parity gate is what checks the graphs."""
    import torch

    # The ONNX exporter's graph passes log every rewrite at INFO, and torch.onnx warns about torchvision ops.
    chatty = {name: logging.getLogger(name) for name in ("onnx_ir", "onnxscript", "torch.onnx")}
    levels = {name: logger.level for name, logger in chatty.items()}
    for logger in chatty.values():
        logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing")
        warnings.filterwarnings("ignore", message=r".*The axis name: .* will not be used")
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
        try:
            yield
        finally:
            for name, logger in chatty.items():
                logger.setLevel(levels[name])


def export_onnx(encoder: Any, decoder: Any, example: dict, out: Path, opset: int, max_positions: int) -> dict:
    """Write encoder.onnx and decoder.onnx (weights inside, dynamic batch and lengths); returns seconds per graph."""
    import onnx
    import torch

    batch = torch.export.Dim("batch")
    src_len = torch.export.Dim("src_len", max=max_positions)
    tgt_len = torch.export.Dim("tgt_len", max=max_positions)
    with torch.no_grad():
        hidden = encoder(example["input_ids"], example["attention_mask"])
    jobs = {
        "encoder": (
            encoder,
            (example["input_ids"], example["attention_mask"]),
            ENCODER_INPUTS,
            ENCODER_OUTPUTS,
            {"input_ids": {0: batch, 1: src_len}, "attention_mask": {0: batch, 1: src_len}},
        ),
        "decoder": (
            decoder,
            (example["decoder_input_ids"], hidden, example["attention_mask"]),
            DECODER_INPUTS,
            DECODER_OUTPUTS,
            {
                "decoder_input_ids": {0: batch, 1: tgt_len},
                "encoder_hidden_states": {0: batch, 1: src_len},
                "encoder_attention_mask": {0: batch, 1: src_len},
            },
        ),
    }
    seconds = {}
    for graph, (module, args, input_names, output_names, dynamic_shapes) in jobs.items():
        path = out / FILE_NAMES["onnx"][graph]
        log.info("exporting the %s to ONNX (opset %d)", graph, opset)
        start = time.perf_counter()
        with _quiet_export(), torch.no_grad():
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=True,
                external_data=False,
                opset_version=opset,
                input_names=list(input_names),
                output_names=list(output_names),
                dynamic_shapes=dynamic_shapes,
                verbose=False,
            )
        seconds[graph] = round(time.perf_counter() - start, 2)
        onnx.checker.check_model(str(path))
    return seconds


def export_torchscript(encoder: Any, decoder: Any, example: dict, out: Path) -> dict:
    """Write encoder.ts.pt and decoder.ts.pt with torch.jit.trace; returns seconds per graph."""
    import torch

    log.info("TorchScript is deprecated in torch (torch.export replaces it); it is kept as a legacy export format")
    with torch.no_grad():
        hidden = encoder(example["input_ids"], example["attention_mask"])
    jobs = {
        "encoder": (encoder, (example["input_ids"], example["attention_mask"])),
        "decoder": (decoder, (example["decoder_input_ids"], hidden, example["attention_mask"])),
    }
    seconds = {}
    for graph, (module, args) in jobs.items():
        log.info("tracing the %s to TorchScript", graph)
        start = time.perf_counter()
        with _quiet_export(), torch.no_grad():
            traced = torch.jit.trace(module, args)
            traced.save(str(out / FILE_NAMES["torchscript"][graph]))
        seconds[graph] = round(time.perf_counter() - start, 2)
    return seconds


def copy_model_files(final_model: Path, out: Path) -> list[str]:
    """Copy the tokenizer files, config.json and generation_config.json (everything but the weights)."""
    copied = []
    for f in sorted(final_model.iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES) and not f.name.endswith(".index.json"):
            shutil.copy2(f, out / f.name)
            copied.append(f.name)
    return copied


# --------------------------------------------------------------------------------------------------- runtimes


def ort_session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = ORT_THREADS
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OrtModel:
    """The two ONNX sessions with the same call signatures as the wrappers, on numpy arrays."""

    def __init__(self, encoder_path: Path, decoder_path: Path):
        self.encoder = ort_session(encoder_path)
        self.decoder = ort_session(decoder_path)

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.encoder.run(None, dict(zip(ENCODER_INPUTS, (input_ids, attention_mask), strict=True)))[0]

    def decode(self, decoder_input_ids: np.ndarray, hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feeds = dict(zip(DECODER_INPUTS, (decoder_input_ids, hidden, attention_mask), strict=True))
        return self.decoder.run(None, feeds)[0]


def ort_greedy(
    runtime: OrtModel,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    *,
    start_id: int,
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
) -> list[list[int]]:
    """Batched greedy decoding as `generate(num_beams=1)` does it for Marian: <pad> is never emitted, </s> is
    forced at the last step, finished rows are padded. No KV cache: the whole prefix is fed at every step.
    Returns each sentence's ids up to and including </s>."""
    hidden = runtime.encode(input_ids, attention_mask)
    batch = input_ids.shape[0]
    tokens = np.full((batch, 1), start_id, dtype=np.int64)
    finished = np.zeros(batch, dtype=bool)
    for step in range(max_new_tokens):
        logits = runtime.decode(tokens, hidden, attention_mask)[:, -1, :]
        logits[:, pad_id] = -np.inf
        next_ids = logits.argmax(axis=-1)
        if step == max_new_tokens - 1:
            next_ids[:] = eos_id
        next_ids = np.where(finished, pad_id, next_ids)
        tokens = np.concatenate([tokens, next_ids[:, None]], axis=1)
        finished |= next_ids == eos_id
        if finished.all():
            break
    return [_strip(row[1:].tolist(), eos_id, pad_id) for row in tokens]


def _strip(ids: list[int], eos_id: int, pad_id: int) -> list[int]:
    """A hypothesis up to and including its first </s>, without padding."""
    if eos_id in ids:
        ids = ids[: ids.index(eos_id) + 1]
    return [t for t in ids if t != pad_id]


def max_new_tokens(params: Params, src_len: int, max_positions: int) -> int:
    """fairseq's max_len_a * src_len + max_len_b, capped so the decoder input stays within the positions."""
    return max(1, min(int(params.evaluate.max_len_a * src_len + params.evaluate.max_len_b), max_positions - 1))


# --------------------------------------------------------------------------------------------------- parity


def _max_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Max abs difference over the real (unpadded) positions of (batch, length, dim) arrays."""
    keep = mask.astype(bool)
    return float(np.abs(a[keep] - b[keep]).max()) if keep.any() else 0.0


def check_parity(
    model: Any,
    tokenizer: Any,
    out: Path,
    params: Params,
    sources: list[list[int]],
    targets: list[list[int]],
    references: list[str],
) -> dict[str, Any]:
    """Compare every exported format with the PyTorch model on the parity sentences; returns the figures."""
    import sacrebleu
    import torch

    cfg = model.config
    pad_id, eos_id, start_id = cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id
    formats = [f for f in ("onnx", "torchscript") if getattr(params.export, f)]
    runtimes: dict[str, Any] = {}
    if "onnx" in formats:
        runtimes["onnx"] = OrtModel(*(out / FILE_NAMES["onnx"][g] for g in GRAPHS))
    if "torchscript" in formats:
        with _quiet_export():
            runtimes["torchscript"] = tuple(torch.jit.load(str(out / FILE_NAMES["torchscript"][g])) for g in GRAPHS)

    diffs = {f: {"encoder": 0.0, "decoder": 0.0} for f in formats}
    hyps: dict[str, list[list[int]]] = {"pytorch": [], "onnx": []}
    for start in range(0, len(sources), PARITY_BATCH):
        ids, mask = _pad(sources[start : start + PARITY_BATCH], pad_id)
        dec_ids, dec_mask = _teacher_forced_inputs(targets[start : start + PARITY_BATCH], start_id, pad_id)
        t_ids, t_mask, t_dec = (torch.from_numpy(a) for a in (ids, mask, dec_ids))
        with torch.no_grad():
            ref_hidden = model.get_encoder()(input_ids=t_ids, attention_mask=t_mask).last_hidden_state
            ref_logits = model(input_ids=t_ids, attention_mask=t_mask, decoder_input_ids=t_dec).logits.numpy()
        # Each runtime's decoder gets PyTorch's encoder states, so (b) measures the decoder graph alone.
        for fmt, runtime in runtimes.items():
            if fmt == "onnx":
                hidden = runtime.encode(ids, mask)
                logits = runtime.decode(dec_ids, ref_hidden.numpy(), mask)
            else:
                with torch.no_grad():
                    hidden = runtime[0](t_ids, t_mask).numpy()
                    logits = runtime[1](t_dec, ref_hidden, t_mask).numpy()
            diffs[fmt]["encoder"] = max(diffs[fmt]["encoder"], _max_diff(hidden, ref_hidden.numpy(), mask))
            diffs[fmt]["decoder"] = max(diffs[fmt]["decoder"], _max_diff(logits, ref_logits, dec_mask))

        if "onnx" in runtimes:
            limit = max_new_tokens(params, ids.shape[1], cfg.max_position_embeddings)
            with torch.no_grad():
                generated = model.generate(
                    input_ids=t_ids,
                    attention_mask=t_mask,
                    num_beams=1,
                    do_sample=False,
                    max_new_tokens=limit,
                    bad_words_ids=[[pad_id]],
                    forced_eos_token_id=eos_id,
                    decoder_start_token_id=start_id,
                    eos_token_id=eos_id,
                    pad_token_id=pad_id,
                )
            hyps["pytorch"] += [_strip(row[1:].tolist(), eos_id, pad_id) for row in generated]
            hyps["onnx"] += ort_greedy(
                runtimes["onnx"], ids, mask, start_id=start_id, eos_id=eos_id, pad_id=pad_id, max_new_tokens=limit
            )

    report: dict[str, Any] = {"n_sentences": len(sources)}
    for fmt in formats:
        report[fmt] = {f"{g}_max_abs_diff": diffs[fmt][g] for g in GRAPHS}
    if "onnx" in runtimes:
        identical = sum(a == b for a, b in zip(hyps["pytorch"], hyps["onnx"], strict=True))
        report["identical_share"] = round(identical / len(sources), 4)
        report["emitted_pad"] = any(pad_id in h for h in hyps["onnx"])
        bleu = {
            name: round(
                sacrebleu.corpus_bleu(tokenizer.batch_decode(h, skip_special_tokens=True), [references]).score, 2
            )
            for name, h in hyps.items()
        }
        report["bleu"] = {**bleu, "delta": round(abs(bleu["onnx"] - bleu["pytorch"]), 2)}
    return report


def parity_failures(report: dict[str, Any], params: Params) -> list[str]:
    """Each broken threshold as 'figure vs threshold'; empty when the gate passes."""
    limit = params.export.max_logit_diff
    failures = []
    for fmt in ("onnx", "torchscript"):
        for graph in GRAPHS:
            value = report.get(fmt, {}).get(f"{graph}_max_abs_diff")
            if value is not None and not value <= limit:  # `not <=` also catches NaN
                failures.append(f"{fmt} {graph} max abs diff {value:.3g} > max_logit_diff {limit:.3g}")
    share = report.get("identical_share")
    if share is not None and share < params.export.min_identical:
        failures.append(
            f"onnx greedy outputs identical to PyTorch for {share:.2%} of {report['n_sentences']} sentences "
            f"< min_identical {params.export.min_identical:.2%}"
        )
    if report.get("emitted_pad"):
        failures.append("onnx greedy decoding emitted <pad>")
    return failures


# --------------------------------------------------------------------------------------------------- stage


def _load(paths: Paths) -> tuple[Any, Any]:
    import torch
    from transformers import AutoTokenizer, MarianMTModel

    if not (paths.final_model / "config.json").is_file():
        raise MissingArtifact(paths.final_model, "train")
    model = MarianMTModel.from_pretrained(paths.final_model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(paths.final_model)
    return model, tokenizer


def _parity_pairs(params: Params, paths: Paths) -> tuple[list[str], list[str]]:
    splits = test_splits(paths.clean)
    if not splits:
        raise MissingArtifact(paths.split_file(paths.clean, "test"), "clean")
    path = paths.split_file(paths.clean, splits[0])
    src, tgt = read_pairs(path)
    if not src:
        raise ParityFailed(f"{path} has no sentence pairs to check parity on")
    n = params.export.parity_sentences
    return src[:n], tgt[:n]


def _size_mb(path: Path) -> float:
    return round(path.stat().st_size / 1e6, 3)


def run(params: Params, paths: Paths) -> dict[str, Any]:
    model, tokenizer = _load(paths)
    src_text, tgt_text = _parity_pairs(params, paths)
    cfg = model.config
    pad_id, eos_id, start_id = cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id
    max_positions = cfg.max_position_embeddings
    sources = tokenizer(src_text, truncation=True, max_length=max_positions)["input_ids"]
    targets = tokenizer(text_target=tgt_text, truncation=True, max_length=max_positions)["input_ids"]

    encoder, decoder = export_wrappers(model)
    example = _example_inputs(sources, targets, start_id, pad_id)
    opset = params.export.opset
    formats = [f for f in ("onnx", "torchscript") if getattr(params.export, f)]
    metrics: dict[str, Any] = {}

    with atomic_path(paths.export) as out:
        out.mkdir()
        copied = copy_model_files(paths.final_model, out)
        export_seconds = {}
        if params.export.onnx:
            export_seconds["onnx"] = export_onnx(encoder, decoder, example, out, opset, max_positions)
        if params.export.torchscript:
            export_seconds["torchscript"] = export_torchscript(encoder, decoder, example, out)

        if formats:
            log.info("checking parity on %d sentences (%s)", len(sources), ", ".join(formats))
            report = check_parity(model, tokenizer, out, params, sources, targets, tgt_text)
            failures = parity_failures(report, params)
            if failures:
                raise ParityFailed("parity gate failed: " + "; ".join(failures))
            metrics = report
            for fmt in formats:
                metrics[fmt]["export_seconds"] = export_seconds[fmt]
                metrics[fmt]["size_mb"] = {g: _size_mb(out / FILE_NAMES[fmt][g]) for g in GRAPHS}
        metrics["thresholds"] = {
            "max_logit_diff": params.export.max_logit_diff,
            "min_identical": params.export.min_identical,
        }

        manifest = {
            "files": {fmt: FILE_NAMES[fmt] for fmt in formats},
            "model_files": copied,
            "opset": opset if params.export.onnx else None,
            "inputs": {"encoder": list(ENCODER_INPUTS), "decoder": list(DECODER_INPUTS)},
            "outputs": {"encoder": list(ENCODER_OUTPUTS), "decoder": list(DECODER_OUTPUTS)},
            "kv_cache": False,
            "vocab_size": cfg.vocab_size,
            "pad_id": pad_id,
            "eos_id": eos_id,
            "decoder_start_id": start_id,
            # Generation must never emit <pad> (Marian starts from it) and forces </s> at the length limit.
            "bad_words_ids": [[pad_id]],
            "dims": {
                "d_model": cfg.d_model,
                "encoder_layers": cfg.encoder_layers,
                "decoder_layers": cfg.decoder_layers,
                "attention_heads": cfg.encoder_attention_heads,
                "max_positions": max_positions,
            },
            "max_len": {"a": params.evaluate.max_len_a, "b": params.evaluate.max_len_b},
            "parity": {
                k: metrics[k] for k in ("n_sentences", "identical_share", "onnx", "torchscript") if k in metrics
            },
        }
        write_json(out / MANIFEST, manifest)

    write_json(paths.metrics("export"), metrics)
    diffs = [metrics[f][f"{g}_max_abs_diff"] for f in formats for g in GRAPHS]
    summary = {
        "identical_share": metrics.get("identical_share"),
        "max_logit_diff": max(diffs) if diffs else None,
        "bleu_delta": metrics.get("bleu", {}).get("delta"),
    }
    log.info(
        "exported %s to %s: max abs diff %s, identical greedy outputs %s, BLEU delta %s",
        "+".join(formats) or "tokenizer and config only",
        paths.export,
        f"{summary['max_logit_diff']:.2g}" if diffs else "n/a",
        summary["identical_share"],
        summary["bleu_delta"],
    )
    return summary


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "export")
