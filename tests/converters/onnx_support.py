"""Helpers of the ONNX tests: a Hugging Face folder with real Gemma 3 weights, and onnxruntime
run on an exported folder directly (no edgeinfer code in between).

The random checkpoints of checkpoints.py are fine for exactness (F32 against F32), but they
are chaotic: any 4-bit rounding of their Gaussian weights moves the logits by as much as GGUF's
own Q4_0 does (mean KL ~2 on the llama one), so a quality bar means nothing there. The real-
weights folder takes a few layers of the packaged Gemma 3 270M (a local and a global one, real
sizes), dequantized into Hugging Face layout, with the subset vocabulary the other fixtures use.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.converters.checkpoints import CHAT_TEMPLATE, spm_model_bytes, write_safetensors

REAL_LAYERS = (0, 1, 5)  # Gemma 3's sixth layer is its first global one
TEXT = (
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk. From the top he "
    "could see the fishing boats returning to the harbour, their lamps flickering on the dark "
    "water. He had kept the light burning for forty years, through storms and quiet summers, "
    "and he knew every rock along the coast by name."
)


def real_gemma_checkpoint(gemma_path: Path, folder: Path, vocab, noise: float = 0.0) -> Path:
    """An HF Gemma3ForCausalLM folder: REAL_LAYERS of the packaged Gemma 3 270M (dequantized,
    norms back to HF's x * (1 + w) form), embedding rows of ``vocab`` (GemmaSubsetVocab).

    ``noise`` > 0 adds Gaussian noise of that fraction of each matrix's standard deviation:
    the file's weights lie on its Q4_K/Q6_K grids, which a K-quant re-quantization recovers
    almost exactly; the noise takes them off every grid, as trained weights are."""
    rng = np.random.default_rng(0)
    from edgeinfer import quants
    from edgeinfer.gguf import GGUFFile

    folder.mkdir(parents=True, exist_ok=True)
    with GGUFFile(gemma_path) as f:
        md = f.metadata
        original = {t: i for i, t in enumerate(md["tokenizer.ggml.tokens"])}
        rows = [original[t] for t in vocab.tokens]

        def tensor(name: str) -> np.ndarray:
            info = f.tensors[name]
            x = quants.dequantize(f.tensor_data(name), info.ggml_type, info.shape[::-1])
            if noise and x.ndim == 2:
                x = x + (noise * x.std() * rng.standard_normal(x.shape)).astype(np.float32)
            return x

        hf = {"model.embed_tokens.weight": tensor("token_embd.weight")[rows]}
        names = {
            "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
            "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
            "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
            "post_ffw_norm": "post_feedforward_layernorm",
        }  # fmt: skip
        for new, old in enumerate(REAL_LAYERS):
            for gguf_name, hf_name in names.items():
                values = tensor(f"blk.{old}.{gguf_name}.weight")
                if gguf_name.endswith("norm"):
                    values = values - np.float32(1.0)
                hf[f"model.layers.{new}.{hf_name}.weight"] = values
        hf["model.norm.weight"] = tensor("output_norm.weight") - np.float32(1.0)
        config = {
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "vocab_size": len(rows), "hidden_size": md["gemma3.embedding_length"],
            "intermediate_size": md["gemma3.feed_forward_length"],
            "num_hidden_layers": len(REAL_LAYERS),
            "num_attention_heads": md["gemma3.attention.head_count"],
            "num_key_value_heads": md["gemma3.attention.head_count_kv"],
            "head_dim": md["gemma3.attention.key_length"],
            "query_pre_attn_scalar": md["gemma3.attention.key_length"],
            "rms_norm_eps": 1e-6, "sliding_window": md["gemma3.attention.sliding_window"],
            "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in REAL_LAYERS],
            "rope_theta": md["gemma3.rope.freq_base"], "rope_local_base_freq": 10000.0,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 32768,
            "tie_word_embeddings": True, "torch_dtype": "float32",
            "bos_token_id": vocab.ids["<bos>"], "eos_token_id": vocab.ids["<eos>"],
            "pad_token_id": vocab.ids["<pad>"],
        }  # fmt: skip
    write_safetensors(folder / "model.safetensors", hf)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "tokenizer.model").write_bytes(spm_model_bytes(
        vocab.tokens, vocab.scores, [2 if t == "<unk>" else k for t, k in zip(vocab.tokens, vocab.types)],
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


def ort_logits(folder: Path, tokens: list[int]) -> np.ndarray:
    """onnxruntime's logits at every position of ``tokens`` (a fresh sequence), shape
    (n_tokens, n_vocab), from the folder's model.onnx as it is."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(
        str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    feed: dict[str, np.ndarray] = {
        "input_ids": np.array([tokens], dtype=np.int64),
        "attention_mask": np.ones((1, len(tokens)), dtype=np.int64),
    }
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8,
             "tensor(uint8)": np.uint8}  # fmt: skip
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            feed[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), dtype=types[i.type])
    return session.run(["logits"], feed)[0][0]
