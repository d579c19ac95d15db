"""The stages' typed errors, raised early, each naming the file, row or parameter at fault (their base, and the
errors the runtime raises too, are in pipeline/runtime/errors.py)."""

from __future__ import annotations

from pipeline.runtime.errors import PipelineError


class CorpusMisaligned(PipelineError):
    def __init__(self, path_src: object, path_tgt: object, lines_src: int, lines_tgt: int,
                 direction: str | None = None):
        # A multi-way corpus (one file per language) is read once per direction: say which pairing failed.
        super().__init__(
            (f"direction {direction}: " if direction else "")
            + f"source and target files are not aligned: {path_src} has {lines_src} lines, "
            f"{path_tgt} has {lines_tgt} lines"
        )
        self.path_src, self.path_tgt, self.lines_src, self.lines_tgt = path_src, path_tgt, lines_src, lines_tgt
        self.direction = direction


class HubUnreachable(PipelineError):
    pass


class MissingArtifact(PipelineError):
    def __init__(self, path: object, produced_by: str):
        super().__init__(
            f"{path} not found: it is produced by the '{produced_by}' stage (run `dvc repro {produced_by}`)"
        )


class ValidationFailed(PipelineError):
    pass


class ParityFailed(PipelineError):
    pass


class OptionalDependencyMissing(PipelineError):
    def __init__(self, package: str, needed_for: str, install: str):
        super().__init__(f"{package} is not installed, and {needed_for}: {install}")
        self.package = package
