"""A Hugging Face Gemma3ForCausalLM folder with real weights: the packaged Gemma 3 270M GGUF
dequantized back into Hugging Face layout (norms in HF's ``x * (1 + w)`` form, the tied
embedding as ``embed_tokens``), whole or cut down to a few layers and a subset vocabulary.

The random checkpoints of checkpoints.py are fine for exactness (F32 against F32), but they
are chaotic: any 4-bit rounding of their Gaussian weights moves the logits by as much as
GGUF's own Q4_0 does, so a quality bar means nothing there. Real weights behave like a
trained model, with one catch: the file's values lie on its Q8_0/Q5_0/Q4_K/Q6_K grids, which
a re-quantization to the same type recovers almost exactly. Noise takes them off the grid,
as trained weights are, in one of two units:

* ``noise``: Gaussian noise of that fraction of each matrix's standard deviation (the same
  for every matrix, whatever its grid);
* ``step_noise``: Gaussian noise of that fraction of each value's own quantization step in
  the packaged file (the scale of its block, or sub-block for the K-quants). The original
  rounding left an error of about 0.29 step (uniform over one step), so 0.5 step adds noise
  of the size of the rounding the model already survived: each matrix is disturbed in
  proportion to its grid, and a same-grid quantizer finds the original level of only ~68% of
  the values (|noise| < step / 2).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.converters.checkpoints import CHAT_TEMPLATE, UNKNOWN, spm_model_bytes, write_safetensors

REAL_LAYERS = (0, 1, 5)  # the few-layer cut: Gemma 3's sixth layer is its first global one

# GGUF name of a layer tensor -> its Hugging Face name
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
}  # fmt: skip


@dataclass
class FileVocab:
    """The GGUF file's whole vocabulary, in the shape of GemmaSubsetVocab."""

    tokens: list[str]
    scores: list[float]
    types: list[int]
    ids: dict[str, int]

    @classmethod
    def from_metadata(cls, md: dict) -> FileVocab:
        tokens = list(md["tokenizer.ggml.tokens"])
        ids = {
            "<pad>": int(md["tokenizer.ggml.padding_token_id"]),
            "<eos>": int(md["tokenizer.ggml.eos_token_id"]),
            "<bos>": int(md["tokenizer.ggml.bos_token_id"]),
            "<unk>": int(md["tokenizer.ggml.unknown_token_id"]),
        }
        return cls(tokens, [float(s) for s in md["tokenizer.ggml.scores"]],
                   [int(t) for t in md["tokenizer.ggml.token_type"]], ids)  # fmt: skip


def grid_steps(raw: np.ndarray, ggml_type, shape: tuple[int, ...]) -> np.ndarray:
    """The quantization step of every value of a GGUF tensor (numpy ``shape``): the scale of
    its block (Q4_0..Q8_0) or sub-block (Q4_K, Q5_K: d * sc; Q6_K: d * sc)."""
    from edgeinfer import quants
    from edgeinfer.gguf.constants import GGMLType as T

    cls = quants.quant_type(ggml_type)
    blocks = np.ascontiguousarray(raw).reshape(-1, cls.type_size).view(cls.layout)[:, 0]
    if cls.ggml_type in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        step = quants.fp16_bits_to_fp32(blocks["d"])[:, None]  # (n_blocks, 1)
    elif cls.ggml_type in (T.Q4_K, T.Q5_K):
        step = cls.scales_and_mins(blocks)[0]  # (n_blocks, 8, 1): d * sc of each group of 32
    elif cls.ggml_type == T.Q6_K:
        d = quants.fp16_bits_to_fp32(blocks["d"])[:, None]
        step = (d * blocks["scales"])[:, :, None]  # (n_blocks, 16, 1)
    else:
        raise ValueError(f"no grid step for {cls.ggml_type.name}")
    per_group = np.abs(step).reshape(len(blocks), -1)  # (n_blocks, groups per block)
    return np.repeat(per_group, cls.block_size // per_group.shape[1], axis=1).reshape(shape)


def real_gemma_checkpoint(
    gemma_path: Path, folder: Path, vocab=None, *, layers: Sequence[int] | None = REAL_LAYERS,
    noise: float = 0.0, step_noise: float = 0.0,
) -> Path:  # fmt: skip
    """Writes the HF folder: ``layers`` of the packaged file (None: all of them), embedding
    rows of ``vocab`` (GemmaSubsetVocab; None: the file's whole vocabulary), matrices taken
    off their grid by ``noise`` or ``step_noise`` (see the module docstring)."""
    from edgeinfer import quants
    from edgeinfer.gguf import GGUFFile

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    with GGUFFile(gemma_path) as f:
        md = f.metadata
        vocab = vocab or FileVocab.from_metadata(md)
        original = {t: i for i, t in enumerate(md["tokenizer.ggml.tokens"])}
        rows = [original[t] for t in vocab.tokens]
        layers = tuple(range(md["gemma3.block_count"])) if layers is None else tuple(layers)

        def tensor(name: str, keep_rows: list[int] | None = None) -> np.ndarray:
            info = f.tensors[name]
            raw = f.tensor_data(name)
            x = quants.dequantize(raw, info.ggml_type, info.shape[::-1])
            if x.ndim == 2 and noise:
                x = x + (noise * x.std() * rng.standard_normal(x.shape)).astype(np.float32)
            if x.ndim == 2 and step_noise:
                step = grid_steps(raw, info.ggml_type, x.shape)
                step *= np.float32(step_noise)
                x += step * rng.standard_normal(x.shape, dtype=np.float32)
            if keep_rows is not None and len(keep_rows) != len(x):
                x = x[keep_rows]
            return x

        hf = {"model.embed_tokens.weight": tensor("token_embd.weight", rows)}
        for new, old in enumerate(layers):
            for gguf_name, hf_name in LAYER_NAMES.items():
                values = tensor(f"blk.{old}.{gguf_name}.weight")
                if gguf_name.endswith("norm"):
                    values = values - np.float32(1.0)
                hf[f"model.layers.{new}.{hf_name}.weight"] = values
        hf["model.norm.weight"] = tensor("output_norm.weight") - np.float32(1.0)
        config = {
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "vocab_size": len(rows), "hidden_size": md["gemma3.embedding_length"],
            "intermediate_size": md["gemma3.feed_forward_length"],
            "num_hidden_layers": len(layers),
            "num_attention_heads": md["gemma3.attention.head_count"],
            "num_key_value_heads": md["gemma3.attention.head_count_kv"],
            "head_dim": md["gemma3.attention.key_length"],
            "query_pre_attn_scalar": md["gemma3.attention.key_length"],
            "rms_norm_eps": 1e-6, "sliding_window": md["gemma3.attention.sliding_window"],
            "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                            for i in layers],
            "rope_theta": md["gemma3.rope.freq_base"], "rope_local_base_freq": 10000.0,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 32768,
            "tie_word_embeddings": True, "torch_dtype": "float32",
            "bos_token_id": vocab.ids["<bos>"], "eos_token_id": vocab.ids["<eos>"],
            "pad_token_id": vocab.ids["<pad>"],
        }  # fmt: skip
    write_safetensors(folder / "model.safetensors", hf)
    del hf
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "tokenizer.model").write_bytes(spm_model_bytes(
        vocab.tokens, vocab.scores,
        [UNKNOWN if t == "<unk>" else k for t, k in zip(vocab.tokens, vocab.types, strict=True)],
        unk_id=vocab.ids["<unk>"], bos_id=vocab.ids["<bos>"], eos_id=vocab.ids["<eos>"],
        pad_id=vocab.ids["<pad>"],
    ))  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHAT_TEMPLATE, "bos_token": "<bos>", "eos_token": "<eos>",
        "unk_token": "<unk>", "pad_token": "<pad>", "add_bos_token": True, "add_eos_token": False,
    }))  # fmt: skip
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": vocab.ids["<bos>"], "eos_token_id": [vocab.ids["<eos>"]]})
    )
    return folder
