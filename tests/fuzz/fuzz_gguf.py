"""Fuzz target: the GGUF reader and the checks ``edgeinfer.load`` makes before it builds an
engine (the config and its tensors, the tokenizer, the vocabulary against the embedding), then
the file's vocabulary at work: a prompt tokenized, token pieces and ids turned back to text.

Each input is written to a file in memory (/dev/shm where there is one) and parsed there. The
seeds are real files cut short after their tensor table, so that the mutations work on the
header and the metadata: when such a file fails only because its tensor data is missing, the
same bytes are parsed again from a file extended with zeros to ``PADDED_SIZE`` (sparse: it
costs no memory), and the checks go on. Tensor data never matters to them; its bounds do.

    python -m tests.fuzz.fuzz_gguf --runs 1000000 --corpus DIR --artifacts DIR
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import atheris

from tests.fuzz import harness

with atheris.instrument_imports(include=["edgeinfer"]):
    from edgeinfer import errors
    from edgeinfer.gguf import GGUFFile, ValueType
    from edgeinfer.models import config_from_gguf
    from edgeinfer.tokenizer import Tokenizer

PADDED_SIZE = 512 << 20  # past the end of the real Gemma 3 270M file (253 MB)
SEED_DATA_BYTES = 4096  # tensor data kept after the header of each seed
GEMMA_SEED_VOCAB = 4096  # the real vocabulary's first tokens: controls, bytes, some pieces

_SHM = "/dev/shm"  # a file system in memory: writing each input costs no disk
_WORK = Path(
    tempfile.mkdtemp(prefix="edgeinfer-fuzz-gguf-", dir=_SHM if os.path.isdir(_SHM) else None)
)
atexit.register(shutil.rmtree, _WORK, ignore_errors=True)
_INPUT = _WORK / "input.gguf"


def check_like_load(gguf: GGUFFile) -> None:
    """What ``edgeinfer.api.Model`` checks before it creates an engine."""
    cfg = config_from_gguf(gguf)
    tokenizer = Tokenizer.from_metadata(gguf.metadata)
    if tokenizer.n_vocab != cfg.n_vocab:
        raise errors.TokenizerError(
            f"vocabulary has {tokenizer.n_vocab} tokens, the embedding {cfg.n_vocab} rows"
        )
    for name in gguf.tensors:
        view = gguf.tensor_data(name)  # every view must lie inside the map
        assert view.nbytes == gguf.tensors[name].nbytes, name
    use_tokenizer(tokenizer)


# text with specials of every family, spaces, digits, accents, CJK and an emoji
SAMPLE_TEXT = (
    "Hi <s></s> <|im_start|>user\n<start_of_turn> 12 345 caf\u00e9 \u65e5\u672c \U0001f600\t!"
)
PIECES_TRIED = 256  # the first and the last tokens of the file's vocabulary


def use_tokenizer(tokenizer: Tokenizer) -> None:
    """What generation does with the file's vocabulary: a prompt to ids, ids to text."""
    n = tokenizer.n_vocab
    ids = [*range(min(n, PIECES_TRIED)), *range(max(n - PIECES_TRIED, PIECES_TRIED), n)]
    for token_id in ids:
        tokenizer.token_to_piece(token_id, special=True)
    tokenizer.detokenize(ids)
    for parse_special in (False, True):
        prompt = tokenizer.tokenize(SAMPLE_TEXT, add_special=True, parse_special=parse_special)
        assert all(0 <= i < n for i in prompt), prompt
        tokenizer.detokenize(prompt, unparse_special=parse_special)


def one_input(data: bytes) -> None:
    _INPUT.write_bytes(data)
    try:
        gguf = GGUFFile(_INPUT)
    except errors.TensorOutOfBoundsError:
        if len(data) >= PADDED_SIZE:
            raise
        os.truncate(_INPUT, PADDED_SIZE)
        gguf = GGUFFile(_INPUT)
    with gguf:
        check_like_load(gguf)


# --- seeds -------------------------------------------------------------------------------


def _cut_after_header(path: Path) -> bytes:
    with GGUFFile(path) as f:
        end = f.data_offset + SEED_DATA_BYTES
    with open(path, "rb") as f:
        return f.read(end)


def _array_of(value: Any) -> tuple[int, list[Any]]:
    if isinstance(value, list):
        return int(ValueType.STRING), value
    codes = {"float32": ValueType.FLOAT32, "int32": ValueType.INT32, "uint32": ValueType.UINT32,
             "int64": ValueType.INT64, "uint64": ValueType.UINT64, "float64": ValueType.FLOAT64,
             "uint8": ValueType.UINT8, "int8": ValueType.INT8, "bool": ValueType.BOOL,
             "uint16": ValueType.UINT16, "int16": ValueType.INT16}  # fmt: skip
    return int(codes[value.dtype.name]), value.tolist()


def gemma_header_seed(gemma_path: Path, n_vocab: int = GEMMA_SEED_VOCAB) -> bytes:
    """The real Gemma 3 header (every key, every tensor entry) with its vocabulary cut to its
    first ``n_vocab`` tokens and the embedding's rows to match, and no tensor data."""
    from tests.gguf import craft

    spec = craft.GGUFSpec()
    with GGUFFile(gemma_path) as f:
        for key, value in f.metadata.items():
            vtype = f.metadata_types[key]
            if vtype == ValueType.ARRAY:
                etype, items = _array_of(value)
                if key.startswith("tokenizer.ggml."):
                    items = items[:n_vocab]
                spec.add(key, int(vtype), (etype, items))
            else:
                spec.add(key, int(vtype), value)
        base = f.data_offset
        for name, info in f.tensors.items():
            shape = info.shape
            if name == "token_embd.weight":
                shape = (shape[0], n_vocab)
            rel = info.offset - base
            spec.tensors.append(craft.Tensor(name, shape, int(info.ggml_type), b"", rel))
    spec.alignment = f.alignment
    return spec.build() + b"\0" * SEED_DATA_BYTES


def seeds() -> Iterator[bytes]:
    """The tiny hand-made llama, the test fixtures (one per architecture) and the real Gemma
    3 header, each cut after its tensor table."""
    from tests.conftest import _fixture_models, packaged_gemma_path
    from tests.gguf import craft

    tiny = craft.tiny_llama_spec().build()
    yield tiny
    gemma = packaged_gemma_path()
    for path in _fixture_models(gemma, all_f32=False).values():
        yield _cut_after_header(path)
    yield gemma_header_seed(gemma)


if __name__ == "__main__":
    harness.main(one_input, seeds)
