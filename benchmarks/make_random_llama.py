"""Writes a random-weight Llama-shaped GGUF for speed measurements (its text is noise).

Default: the 1.1B shape of the benchmark table (dim 2048, 16 layers, 32 heads, 8 KV heads,
FFN 8192, 32k vocabulary), every matrix Q4_0, norms F32, a SentencePiece-style vocabulary.
Q4_0 blocks are drawn directly (random nibbles, one small fp16 scale per block), so writing
600 MB takes seconds.

    python benchmarks/make_random_llama.py OUT.gguf [--shape 1.1b|3b] [--dim 2048 --layers 16 ...]
    python benchmarks/make_random_llama.py OUT.gguf --type f16
    python benchmarks/make_random_llama.py OUT.gguf --quantize Q4_K_M [--threads N]

--shape 3b is a Llama 3.2 3B-like shape with a 32k vocabulary (dim 3072, 28 layers, 24 heads,
8 KV heads, FFN 8192: 3.0B weights, 1.70 GB as Q4_0); every row length is a multiple of 256,
so K-quants apply to every matrix. --dim, --layers and the others override the preset.

--type f16 writes every matrix as F16, normal weights with a standard deviation of one Q4_0
step (1 / (4 sqrt(columns))). --quantize TYPE (a llama.cpp file type: Q4_K_M, Q4_0, Q8_0,
Q6_K, Q5_K_M, ...) writes those F16 weights to a temporary file beside OUT and has llama.cpp's
own quantizer (llama-cpp-python's llama_model_quantize) make OUT from it, with its mix of
tensor types (Q4_K_M: Q6_K for the output matrix and some attn_v / ffn_down, Q4_K elsewhere).

Tensors are generated and written a slice at a time, so memory stays bounded for any shape.
OUT appears only when complete (written as OUT.part, then renamed); on any failure neither a
partial OUT nor a temporary file is left.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np

Q4_0_BLOCK, Q4_0_BLOCK_BYTES = 32, 2 + 16  # 32 weights: an fp16 scale, 32 nibbles
CHUNK_WEIGHTS = 1 << 24  # weights generated at once (64 MB of float32)


@dataclass(frozen=True)
class Shape:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.dim // self.heads)

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every tensor in file order: (rows, columns) for a matrix, (dim,)
        for a norm."""
        out: list[tuple[str, tuple[int, ...]]] = [
            ("token_embd.weight", (self.vocab, self.dim)),
            ("output_norm.weight", (self.dim,)),
            ("output.weight", (self.vocab, self.dim)),
        ]
        for i in range(self.layers):
            p = f"blk.{i}."
            out += [
                (p + "attn_norm.weight", (self.dim,)),
                (p + "attn_q.weight", (self.dim, self.dim)),
                (p + "attn_k.weight", (self.kv_dim, self.dim)),
                (p + "attn_v.weight", (self.kv_dim, self.dim)),
                (p + "attn_output.weight", (self.dim, self.dim)),
                (p + "ffn_norm.weight", (self.dim,)),
                (p + "ffn_gate.weight", (self.ffn, self.dim)),
                (p + "ffn_up.weight", (self.ffn, self.dim)),
                (p + "ffn_down.weight", (self.dim, self.ffn)),
            ]
        return out

    def problems(self) -> list[str]:
        if min(self.dim, self.layers, self.heads, self.kv_heads, self.ffn, self.vocab) < 1:
            return ["every size must be positive"]
        found = []
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            found.append(f"dim {self.dim} is not an even head size times {self.heads} heads")
        if self.heads % self.kv_heads:
            found.append(f"{self.heads} heads are not a multiple of {self.kv_heads} KV heads")
        for name, n in (("dim", self.dim), ("ffn", self.ffn)):
            if n % Q4_0_BLOCK:
                found.append(f"{name} {n} is not a multiple of {Q4_0_BLOCK}")
        if self.vocab <= len(SPECIAL_TOKENS) + 256:
            found.append(f"vocab {self.vocab} leaves no room for words after the byte tokens")
        return found


SHAPES = {
    "1.1b": Shape(dim=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=32000),
    "3b": Shape(dim=3072, layers=28, heads=24, kv_heads=8, ffn=8192, vocab=32000),
}
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def matrix_bytes(shape: tuple[int, ...], weight_type: str) -> int:
    n = int(np.prod(shape))
    if len(shape) == 1:
        return 4 * n  # norms are F32
    return 2 * n if weight_type == "f16" else n // Q4_0_BLOCK * Q4_0_BLOCK_BYTES


def file_weight_bytes(shape: Shape, weight_type: str) -> int:
    """Bytes of tensor data (without alignment padding) in a file of this shape and type."""
    return sum(matrix_bytes(s, weight_type) for _, s in shape.tensors())


def q4_0_rows(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Q4_0 blocks with random nibbles and the scale 1 / (4 sqrt(cols)), (rows, cols/32*18)."""
    blocks = rows * cols // Q4_0_BLOCK
    raw = np.empty((blocks, Q4_0_BLOCK_BYTES), dtype=np.uint8)
    scale = np.float16(1.0 / (4.0 * np.sqrt(cols)))
    raw[:, :2] = np.full(blocks, scale, dtype=np.float16).view(np.uint8).reshape(blocks, 2)
    raw[:, 2:] = rng.integers(0, 256, size=(blocks, 16), dtype=np.uint8)
    return raw.reshape(rows, cols // Q4_0_BLOCK * Q4_0_BLOCK_BYTES)


def f16_rows(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Normal weights with a standard deviation of one Q4_0 step, (rows, cols) float16."""
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    x *= np.float32(1.0 / (4.0 * np.sqrt(cols)))
    return x.astype(np.float16)


def tensor_slices(
    rng: np.random.Generator, shape: tuple[int, ...], weight_type: str
) -> Iterator[np.ndarray]:
    """One tensor's data, a slice of rows at a time."""
    if len(shape) == 1:
        yield np.ones(shape, dtype=np.float32)
        return
    rows, cols = shape
    draw = f16_rows if weight_type == "f16" else q4_0_rows
    step = max(1, CHUNK_WEIGHTS // cols)
    for start in range(0, rows, step):
        yield draw(rng, min(step, rows - start), cols)


def add_vocabulary(w, vocab: int) -> None:
    tokens = SPECIAL_TOKENS + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581w{i}" for i in range(vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def write_random(path: Path, shape: Shape, weight_type: str, seed: int) -> None:
    """The random model, written to ``path`` directly (callers rename it into place)."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    try:
        w.add_name("random llama (benchmark)")
        w.add_context_length(4096)
        w.add_embedding_length(shape.dim)
        w.add_block_count(shape.layers)
        w.add_feed_forward_length(shape.ffn)
        w.add_head_count(shape.heads)
        w.add_head_count_kv(shape.kv_heads)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        f16 = weight_type == "f16"
        ftype = gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.MOSTLY_Q4_0
        w.add_file_type(ftype)
        add_vocabulary(w, shape.vocab)
        tensors = shape.tensors()
        for name, s in tensors:
            nbytes = matrix_bytes(s, weight_type)
            if len(s) == 1:
                w.add_tensor_info(name, s, np.dtype(np.float32), nbytes)
            elif f16:
                w.add_tensor_info(name, s, np.dtype(np.float16), nbytes)
            else:
                byte_shape = (s[0], s[1] // Q4_0_BLOCK * Q4_0_BLOCK_BYTES)
                q4_0 = gguf.GGMLQuantizationType.Q4_0
                w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=q4_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        # the writer holds whole tensors in memory; the data is streamed past it instead
        assert w.fout is not None and len(w.fout) == 1
        out: BinaryIO = w.fout[0]
        for _, s in tensors:
            w.write_padding(out, out.tell())
            for part in tensor_slices(rng, s, weight_type):
                part.tofile(out)
        w.write_padding(out, out.tell())
        out.flush()
        os.fsync(out.fileno())
    finally:
        w.close()


def quantize_file_type(name: str) -> int:
    """llama.cpp's LLAMA_FTYPE_MOSTLY_<NAME> (an argparse type: unknown names are refused)."""
    import llama_cpp

    prefix = "LLAMA_FTYPE_MOSTLY_"
    known = sorted(n[len(prefix) :] for n in dir(llama_cpp) if n.startswith(prefix))
    if name.upper() not in known:
        raise argparse.ArgumentTypeError(
            f"unknown llama.cpp file type {name!r}; known: {', '.join(known)}"
        )
    return int(getattr(llama_cpp, prefix + name.upper()))


def quantize(src: Path, dst: Path, ftype: int, threads: int) -> None:
    """llama.cpp's quantizer: ``src`` (F16) to ``dst`` in file type ``ftype``."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if status != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} (status {status})")


@contextlib.contextmanager
def removed_on_exit(*paths: Path) -> Iterator[None]:
    """Temporary files that are gone when the body ends, however it ends."""
    try:
        yield
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


def make(
    out: Path, shape: Shape, weight_type: str, seed: int, ftype: int | None, threads: int
) -> None:
    """Writes the model to ``out``, which appears only once complete."""
    part = out.with_name(out.name + ".part")
    if ftype is None:
        with removed_on_exit(part):
            write_random(part, shape, weight_type, seed)
            os.replace(part, out)
        return
    f16 = out.with_name(out.name + ".f16.part")
    with removed_on_exit(part, f16):
        write_random(f16, shape, "f16", seed)
        quantize(f16, part, ftype, threads)
        os.replace(part, out)


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Shape]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.1b", help="preset shape")
    for flag in ("dim", "layers", "heads", "kv-heads", "ffn", "vocab"):
        ap.add_argument(f"--{flag}", type=int, help="overrides the preset")
    ap.add_argument("--type", choices=["q4_0", "f16"], help="matrix type (default q4_0)")
    ap.add_argument(
        "--quantize", metavar="TYPE", type=quantize_file_type,
        help="quantize F16 weights with llama.cpp to this file type (Q4_K_M, Q8_0, ...)",
    )  # fmt: skip
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="for --quantize")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.quantize is not None and args.type not in (None, "f16"):
        ap.error("--quantize starts from F16 weights; --type q4_0 does not apply")
    overrides = {
        field: getattr(args, field)
        for field in ("dim", "layers", "heads", "kv_heads", "ffn", "vocab")
        if getattr(args, field) is not None
    }
    shape = replace(SHAPES[args.shape], **overrides)
    problems = shape.problems()
    if problems:
        ap.error("; ".join(problems))
    return args, shape


def main(argv: Sequence[str] | None = None) -> int:
    args, shape = parse_args(argv)
    weight_type = "f16" if args.quantize is not None else args.type or "q4_0"
    n_weights = sum(int(np.prod(s)) for _, s in shape.tensors())
    print(
        f"{shape}: {n_weights:,} weights, "
        f"{file_weight_bytes(shape, weight_type):,} bytes of tensor data as {weight_type}",
        flush=True,
    )
    t0 = time.perf_counter()
    make(args.out, shape, weight_type, args.seed, args.quantize, args.threads)
    size = args.out.stat().st_size
    took = time.perf_counter() - t0
    print(f"wrote {args.out} ({size} bytes, {size / 1e6:.0f} MB) in {took:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
