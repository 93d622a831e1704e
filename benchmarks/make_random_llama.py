"""Writes a random-weight Llama-shaped GGUF for speed measurements (its text is noise).

Default: the 1.1B shape of the benchmark table (dim 2048, 16 layers, 32 heads, 8 KV heads,
FFN 8192, 32k vocabulary), every matrix Q4_0, norms F32, a SentencePiece-style vocabulary.
Q4_0 blocks are drawn directly (random nibbles, one small fp16 scale per block), so writing
600 MB takes seconds.

    python benchmarks/make_random_llama.py OUT.gguf [--dim 2048 --layers 16 ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def q4_0_matrix(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    blocks = rows * cols // 32
    raw = np.empty((blocks, 18), dtype=np.uint8)
    scale = np.float16(1.0 / (4.0 * np.sqrt(cols)))
    raw[:, :2] = np.frombuffer(
        np.full(blocks, scale, dtype=np.float16).tobytes(), dtype=np.uint8
    ).reshape(blocks, 2)
    raw[:, 2:] = rng.integers(0, 256, size=(blocks, 16), dtype=np.uint8)
    return raw.reshape(rows, cols // 32 * 18)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import gguf

    rng = np.random.default_rng(args.seed)
    head_dim = args.dim // args.heads
    kv_dim = args.kv_heads * head_dim
    w = gguf.GGUFWriter(str(args.out), "llama")
    w.add_name("random llama (benchmark)")
    w.add_context_length(4096)
    w.add_embedding_length(args.dim)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(args.ffn)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581w{i}" for i in range(args.vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    q4 = gguf.GGMLQuantizationType.Q4_0
    ones = np.ones(args.dim, dtype=np.float32)
    w.add_tensor("token_embd.weight", q4_0_matrix(rng, args.vocab, args.dim), raw_dtype=q4)
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", q4_0_matrix(rng, args.vocab, args.dim), raw_dtype=q4)
    for i in range(args.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", q4_0_matrix(rng, args.dim, args.dim), raw_dtype=q4)
        w.add_tensor(p + "attn_k.weight", q4_0_matrix(rng, kv_dim, args.dim), raw_dtype=q4)
        w.add_tensor(p + "attn_v.weight", q4_0_matrix(rng, kv_dim, args.dim), raw_dtype=q4)
        w.add_tensor(p + "attn_output.weight", q4_0_matrix(rng, args.dim, args.dim), raw_dtype=q4)
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", q4_0_matrix(rng, args.ffn, args.dim), raw_dtype=q4)
        w.add_tensor(p + "ffn_up.weight", q4_0_matrix(rng, args.ffn, args.dim), raw_dtype=q4)
        w.add_tensor(p + "ffn_down.weight", q4_0_matrix(rng, args.dim, args.ffn), raw_dtype=q4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
