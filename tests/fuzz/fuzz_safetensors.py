"""Fuzz target: the converters' safetensors reader on random bytes.

Each input is written as one ``.safetensors`` file and opened as ``edgeinfer convert`` opens
a checkpoint's weights: the header (length field, JSON, dtypes, shapes, offsets) and then one
positioned read of the first and the last row of every tensor. Seeds are small real files,
written by the ``safetensors`` package (through numpy and torch) and by the test checkpoints'
own writer (tests/converters/checkpoints.py).

    python -m tests.fuzz.fuzz_safetensors --runs 1000000 --corpus DIR --artifacts DIR
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import atheris
import numpy as np

with atheris.instrument_imports(include=["edgeinfer"]):
    from edgeinfer.converters.safetensors_file import SafetensorsFile, read_rows

from tests.fuzz import harness

# one file per process, rewritten for every input (in memory where /dev/shm exists)
_SHM = "/dev/shm" if Path("/dev/shm").is_dir() else None
_SCRATCH = Path(tempfile.mkdtemp(prefix="fuzz-st-", dir=_SHM)) / "input.safetensors"
atexit.register(shutil.rmtree, _SCRATCH.parent, ignore_errors=True)


def _file(data: bytes) -> bytes:
    """The file an input stands for: the bytes as they are (first byte even), or (odd) a
    header and the data section apart, ``header NUL data``, framed with the header's true
    length, so that mutations of the JSON keep a file whose length field fits it."""
    fdp = atheris.FuzzedDataProvider(data)
    framed = fdp.ConsumeUInt(1) & 1
    rest = fdp.ConsumeBytes(fdp.remaining_bytes())
    if not framed:
        return rest
    header, _, tensor_data = rest.partition(b"\0")
    return len(header).to_bytes(8, "little") + header + tensor_data


def _as_inputs(file: bytes) -> Iterator[bytes]:
    """A real file as both kinds of input (see :func:`_file`)."""
    yield b"\0" + file
    n = int.from_bytes(file[:8], "little")
    yield b"\1" + file[8 : 8 + n] + b"\0" + file[8 + n :]


def one_input(data: bytes) -> None:
    _SCRATCH.write_bytes(_file(data))
    st = SafetensorsFile(_SCRATCH)
    for entry in st.tensors.values():
        read_rows(entry, 0, 0)
        if entry.n_rows:
            read_rows(entry, 0, 1)
            read_rows(entry, entry.n_rows - 1, 1)
    for entry in st.tensors.values():
        if not entry.n_rows:  # refused (typed): an empty tensor has no row, however long
            read_rows(entry, 0, 1)


def _arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "model.embed_tokens.weight": rng.standard_normal((12, 8)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(8).astype(np.float32),
        "scalar": np.array(1.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def _library_seeds(rng: np.random.Generator) -> Iterator[bytes]:
    """Files written by the safetensors package itself (skipped where it is missing)."""
    try:
        from safetensors.numpy import save as save_numpy
    except ImportError:
        return
    arrays = _arrays(rng)
    for dtype in (np.float32, np.float16, np.float64, np.int32):
        yield save_numpy({k: v.astype(dtype) for k, v in arrays.items()})
    yield save_numpy(arrays, metadata={"format": "pt", "note": "fuzz seed"})
    try:
        import torch
        from safetensors.torch import save as save_torch
    except ImportError:
        return
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    for dtype in (torch.bfloat16, torch.float16, torch.int8, torch.bool):
        yield save_torch({k: v.to(dtype) for k, v in tensors.items()}, metadata={"format": "pt"})


def _checkpoint_seeds(rng: np.random.Generator) -> Iterator[bytes]:
    """Files written by the test checkpoints' writer, as the converter tests read them."""
    from tests.converters.checkpoints import write_safetensors

    arrays = _arrays(rng)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seed.safetensors"
        for dtype in ("F32", "F16", "BF16"):
            write_safetensors(path, arrays, dtype)
            yield path.read_bytes()
        write_safetensors(path, {}, "F32")
        yield path.read_bytes()


def seeds() -> Iterator[bytes]:
    rng = np.random.default_rng(9)
    for file in (*_library_seeds(rng), *_checkpoint_seeds(rng)):
        yield from _as_inputs(file)
    # a header length announcing far more than the file holds, and the smallest headers
    yield b"\0" + (1 << 40).to_bytes(8, "little") + b"{}"
    yield b"\0" + (2).to_bytes(8, "little") + b"{}"
    yield b'\1{"a": 1}\0'


if __name__ == "__main__":
    harness.main(one_input, seeds)
