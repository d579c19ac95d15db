"""Quieting the exporters' known, harmless chatter for the length of an export, and nothing else. Each exporter is
quieted where its messages come from: the ONNX exporter's named loggers (set to ERROR, their levels restored after),
onnxruntime's quantiser by a filter that drops only the records its own source files log on the root logger, and
warnings by message. `logging.disable` would also silence every other thread of the process for that time (a Prefect
worker, the stage's own progress), however briefly.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.logger_levels import logger_levels

# The ONNX exporter's graph passes log every rewrite at INFO, and torch.onnx warns about torchvision ops.
ONNX_EXPORTER_LOGGERS = ("onnx_ir", "onnxscript", "torch.onnx")
# The quantiser's modules that have loggers of their own (the rest log on the root logger).
QUANTIZER_LOGGERS = ("onnxruntime.quantization",)
HARMLESS_WARNINGS = (
    r".*torch\.jit\.\w+` is deprecated",
    r".*is_gradient_checkpointing",
    r".*The axis name: .* will not be used",
    r".*isinstance\(treespec, LeafSpec\)",
)


@contextmanager
def quiet_exporters() -> Iterator[None]:
    """Hide the torch exporters' warnings that are known and harmless here; the parity gate checks the graphs."""
    import torch

    with logger_levels(ONNX_EXPORTER_LOGGERS, logging.ERROR), warnings.catch_warnings():
        for message in HARMLESS_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


@contextmanager
def quiet_quantizer() -> Iterator[None]:
    """Hide onnxruntime's quantiser's messages below ERROR (every skipped node, a hint about image-model
    pre-processing).

    It logs them with the module-level `logging.info`/`logging.warning`, i.e. on the root logger, so they have no
    logger name to quiet. A filter on the root logger sees only the records logged on it directly, never those
    that propagate up from named loggers, and this one drops only the quantiser's: records whose source file lies
    in the onnxruntime.quantization package.
    """
    import onnxruntime.quantization

    package_dir = str(Path(onnxruntime.quantization.__file__).parent) + os.sep

    def not_from_the_quantizer(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not record.pathname.startswith(package_dir)

    root = logging.getLogger()
    root.addFilter(not_from_the_quantizer)
    try:
        with logger_levels(QUANTIZER_LOGGERS, logging.ERROR):
            yield
    finally:
        root.removeFilter(not_from_the_quantizer)
