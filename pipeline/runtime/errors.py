"""The errors the runtime raises, and the base of every error the pipeline raises: each names the file, line or
parameter at fault. Stages add their own in pipeline/errors.py."""

from __future__ import annotations


class PipelineError(Exception):
    """An error the user can act on; stages and the CLI exit non-zero with its message and no traceback."""


class InputFileError(PipelineError):
    def __init__(self, path: object, message: str, line: int | None = None):
        where = f"{path}" if line is None else f"{path}, line {line}"
        super().__init__(f"{where}: {message}")
        self.path, self.line = path, line
