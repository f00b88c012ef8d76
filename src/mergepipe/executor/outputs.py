"""Where a merge's output goes: a local directory (atomic rename) or an s3:// prefix (multipart)."""

from __future__ import annotations

from pathlib import Path

from mergepipe.executor import publish
from mergepipe.executor.s3_output import S3Output
from mergepipe.storage.locations import is_url


class LocalOutput:
    """A local output directory: staged beside it, published by one rename."""

    def __init__(self, location: str | Path) -> None:
        self.path = Path(location).absolute()
        self.location = str(self.path)

    def check(self, *, overwrite: bool = False) -> None:
        publish.check_target(self.path, overwrite=overwrite)

    def stage(self, tag: str, *, overwrite: bool = False) -> Path:
        return publish.prepare(self.path, tag, overwrite=overwrite)

    def publish(self, stage: Path, *, overwrite: bool = False) -> None:
        publish.publish(stage, self.path, overwrite=overwrite)

    def discard(self) -> None:
        publish.discard(self.path)


def output_for(location: str | Path) -> LocalOutput | S3Output:
    """The output at `location`: a local path or an s3:// URL."""
    text = str(location)
    return S3Output(text) if is_url(text) else LocalOutput(location)
