"""The legacy TorchScript graphs (torch deprecates TorchScript): an encoder and an uncached decoder, traced."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from pipeline.runtime.export_format import GRAPHS, TORCHSCRIPT_FILES
from stages.export.quiet import quiet_exporters
from stages.export.wrappers import legacy_wrappers

log = logging.getLogger("mtpipe.export")


def export_torchscript(model: Any, example: dict[str, torch.Tensor], out: Path) -> dict[str, float]:
    """Write encoder.ts.pt and decoder.ts.pt (uncached) with torch.jit.trace; returns seconds per graph."""
    log.warning("TorchScript is deprecated in torch (torch.export replaces it); it is kept as a legacy export format")
    encoder, decoder = legacy_wrappers(model)
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
        with quiet_exporters(), torch.no_grad():
            traced = torch.jit.trace(module, args)
            traced.save(str(out / TORCHSCRIPT_FILES[graph]))
        seconds[graph] = round(time.perf_counter() - start, 2)
    return seconds


def load_torchscript(out: Path) -> tuple[Any, Any]:
    """(encoder, decoder) TorchScript modules of the export directory `out`."""
    with quiet_exporters():
        return tuple(torch.jit.load(str(out / TORCHSCRIPT_FILES[graph])) for graph in GRAPHS)
