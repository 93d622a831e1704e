"""Files that appear whole or not at all: written beside their target under a temporary name
(``.NAME.XXXX.part``), synced, then renamed onto it; removed instead on any error or
interruption. The GGUF writer, perplexity baselines and saved sessions all write this way."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` once the body has run to its end, never before."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=directory)
    try:
        chmod_as_created(fd)
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(directory)


def chmod_as_created(fd: int) -> None:
    """mkstemp makes the file private (0600); give it the mode open() would have (0666 less
    the umask), since it becomes the output."""
    mask = os.umask(0)
    os.umask(mask)
    # AttributeError: no fchmod on Windows; the default mode is fine there
    with contextlib.suppress(AttributeError, OSError):
        os.fchmod(fd, 0o666 & ~mask)


def fsync_directory(directory: Path) -> None:
    """Makes the rename durable where the platform allows opening a directory."""
    try:
        fd = os.open(directory if str(directory) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
