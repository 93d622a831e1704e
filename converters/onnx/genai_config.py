"""``genai_config.json``: what onnxruntime-genai needs to run the folder.

The schema is onnxruntime-genai's (``model``: type, special token ids, context length and the
decoder's file, sizes and input/output names; ``search``: the default generation settings).
Special token ids and sampling defaults come from the converted vocabulary and the source's
generation_config.json, as the model builder takes them.
"""

from __future__ import annotations

from typing import Any

from edgeinfer.converters.onnx.spec import DecoderSpec
from edgeinfer.converters.vocab import Vocabulary

MODEL_FILE = "model.onnx"


def _ids(value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def _number(generation: dict[str, Any], key: str, default: float) -> float:
    v = generation.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def genai_config(
    spec: DecoderSpec, vocab: Vocabulary, generation: dict[str, Any], *, share_buffer: bool
) -> dict[str, Any]:
    special = vocab.special_ids
    eos = _ids(generation.get("eos_token_id")) or _ids(special.get("eos"))
    bos = _ids(generation.get("bos_token_id")) or _ids(special.get("bos"))
    pad = _ids(generation.get("pad_token_id")) or _ids(special.get("pad")) or eos[:1]
    model: dict[str, Any] = {
        "type": spec.genai_type,
        "vocab_size": spec.n_vocab,
        "context_length": spec.context_length,
        "decoder": {
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "filename": MODEL_FILE,
            "head_size": spec.head_dim,
            "hidden_size": spec.hidden_size,
            "num_attention_heads": spec.n_head,
            "num_key_value_heads": spec.n_head_kv,
            "num_hidden_layers": spec.n_layer,
            "inputs": {
                "input_ids": "input_ids",
                "attention_mask": "attention_mask",
                "past_key_names": "past_key_values.%d.key",
                "past_value_names": "past_key_values.%d.value",
            },
            "outputs": {
                "logits": "logits",
                "present_key_names": "present.%d.key",
                "present_value_names": "present.%d.value",
            },
        },
        "eos_token_id": eos if len(eos) != 1 else eos[0],
    }
    if bos:
        model["bos_token_id"] = bos[0]
    if pad:
        model["pad_token_id"] = pad[0]
    search = {
        "diversity_penalty": 0.0,
        "do_sample": generation.get("do_sample") is True,
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": spec.context_length,
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        "past_present_share_buffer": share_buffer,
        "repetition_penalty": _number(generation, "repetition_penalty", 1.0),
        "temperature": _number(generation, "temperature", 1.0),
        "top_k": int(_number(generation, "top_k", 50)),
        "top_p": _number(generation, "top_p", 1.0),
    }
    return {"model": model, "search": search}
