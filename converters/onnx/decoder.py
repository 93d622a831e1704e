"""The decoder as an ONNX graph of onnxruntime's contrib operators, in the form
onnxruntime-genai runs.

Inputs and outputs carry onnxruntime-genai's default names::

    input_ids                   int64 (batch, seq)
    attention_mask              int64 (batch, past + seq)      ones for every real token
    past_key_values.N.key       (batch, n_head_kv, past, head_dim)   float32, float16, int8
    past_key_values.N.value                                          codes, or uint8 (head_dim / 2)
    logits                      float32 (batch, seq, n_vocab)
    present.N.key, .value       (batch, n_head_kv, past + seq, head_dim)

Each layer is ``RMSNormalization`` (ONNX opset 23), the projections (``MatMulNBits``
for quantized weights, ``MatMul`` for float32 ones), ``GroupQueryAttention`` (rotary
embedding from cos/sin tables, grouped KV heads, the sliding window of Gemma's local layers,
and the KV cache, quantized with static per-channel scales when asked), and the gated FFN.
The token embedding is a ``GatherBlockQuantized`` of the same codes the output projection
reads when the two are tied.

Weights are written once (:meth:`DecoderGraph.write_weights`); the graph itself is cheap and
can be built for more than one KV cache type over the same weights (the export first builds a
float cache to calibrate the quantized one).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from edgeinfer.converters.architectures import SourceTensor
from edgeinfer.converters.onnx import blockwise
from edgeinfer.converters.onnx.spec import DecoderSpec, rotary_tables
from edgeinfer.converters.onnx.tensor_data import TensorData

if TYPE_CHECKING:
    from edgeinfer.converters.convert import Progress

OPSET = 23
MS_DOMAIN = "com.microsoft"
IR_VERSION = 11
KV_TYPES = {
    "f32": (TensorProto.FLOAT, 0),
    "f16": (TensorProto.FLOAT16, 0),
    "int8": (TensorProto.INT8, 8),
    "int4": (TensorProto.UINT8, 4),
}


@dataclass(frozen=True)
class WeightFormat:
    """Matrices as float32 (``bits`` None) or as MatMulNBits codes."""

    bits: int | None = 4
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int = 0  # MatMulNBits: 0 computes in float32, 4 with int8 activations

    def layout(self, n: int, k: int) -> blockwise.BlockLayout:
        assert self.bits is not None
        return blockwise.BlockLayout(n, k, self.bits, self.block_size, self.symmetric)


@dataclass(frozen=True)
class KVCache:
    """The cache's element type (f32, f16, int8, int4) and, for int8/int4, each layer's
    per-channel (n_head_kv * head_dim,) key and value scales."""

    type: str = "f32"
    scales: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def onnx_type(self) -> int:
        return KV_TYPES[self.type][0]

    @property
    def bits(self) -> int:
        return KV_TYPES[self.type][1]

    def cache_dim(self, head_dim: int) -> int:
        return head_dim // 2 if self.bits == 4 else head_dim  # int4: two codes a byte


class DecoderGraph:
    """Weights written into ``data``, and graphs over them."""

    def __init__(
        self,
        spec: DecoderSpec,
        tensors: list[SourceTensor],
        weights: WeightFormat,
        data: TensorData,
    ) -> None:
        self.spec, self.weights, self.data = spec, weights, data
        # rows stay in the checkpoint's half-split rotary layout (GGUF's llama files permute
        # them for GGML's interleaved rotation; GroupQueryAttention rotates halves)
        self.tensors = {t.name: replace(t, rotary_heads=0) for t in tensors}
        self.tied = "output.weight" not in self.tensors
        self.initializers: list[TensorProto] = []
        self._nodes: list[Any] = []
        self._constants: dict[str, TensorProto] = {}

    # --- weights ----------------------------------------------------------------------------

    def write_weights(self, progress: Progress) -> None:
        items = [t for name, t in self.tensors.items() if name != "rope_freqs.weight"]
        for i, t in enumerate(items):
            progress("write", i, len(items))
            if t.is_matrix and self.weights.bits is not None:
                self._write_quantized(t)
            elif t.is_matrix and t.name != "token_embd.weight":
                # MatMul takes (K, N): the transpose of the (N, K) rows
                values = np.concatenate([rows for _, rows in t.chunks()]).T
                self.initializers.append(self.data.add(t.name, values))
            else:
                chunks = (rows for _, rows in t.chunks())
                self.initializers.append(self.data.add_chunks(t.name, np.float32, t.shape, chunks))
        s = self.spec
        tables = [("", s.inv_freq)] + (
            [("_swa", s.inv_freq_swa)] if s.inv_freq_swa is not None else []
        )
        for suffix, inv_freq in tables:
            cos, sin = rotary_tables(inv_freq, s.context_length)
            self.initializers.append(self.data.add(f"cos_cache{suffix}", cos))
            self.initializers.append(self.data.add(f"sin_cache{suffix}", sin))
        progress("write", len(items), len(items))

    def _write_quantized(self, t: SourceTensor) -> None:
        layout = self.weights.layout(t.shape[0], t.shape[1])
        scales: list[np.ndarray] = []  # (rows, n_blocks) per chunk
        zero_points: list[np.ndarray] = []

        def codes():
            for _, rows in t.chunks():
                q = blockwise.quantize(rows, layout)
                scales.append(q["scales"])
                if "zero_points" in q:
                    zero_points.append(q["zero_points"])
                yield q["B"]

        shapes = layout.shapes()
        self.initializers.append(
            self.data.add_chunks(f"{t.name}.B", np.uint8, shapes["B"], codes())
        )
        self.initializers.append(self.data.add(f"{t.name}.scales", np.concatenate(scales)))
        if zero_points:
            self.initializers.append(
                self.data.add(f"{t.name}.zero_points", np.concatenate(zero_points))
            )

    # --- the graph --------------------------------------------------------------------------

    def model(self, kv: KVCache) -> ModelProto:
        self._nodes, self._constants = [], {}
        s = self.spec
        seqlens_k, total = self._mask_lengths()
        x = self._embedding()
        for il in range(s.n_layer):
            x = self._layer(il, x, seqlens_k, total, kv)
        x = self._rms_norm(x, "output_norm.weight")
        logits = self._linear(x, "output.weight" if not self.tied else "token_embd.weight")
        if s.final_logit_softcap:
            cap = self._const("softcap", np.float32(s.final_logit_softcap))
            logits = self._node("Div", [logits, cap])
            logits = self._node("Tanh", [logits])
            logits = self._node("Mul", [logits, cap])
        self._node("Identity", [logits], out="logits")
        graph = helper.make_graph(
            self._nodes, "edgeinfer-decoder", self._inputs(kv), self._outputs(kv),
            initializer=self.initializers + list(self._constants.values()),
        )  # fmt: skip
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
            ir_version=IR_VERSION,
            producer_name="edgeinfer",
        )
        return model

    def _inputs(self, kv: KVCache) -> list[Any]:
        s = self.spec
        cache: list[str | int] = [
            "batch_size",
            s.n_head_kv,
            "past_sequence_length",
            kv.cache_dim(s.head_dim),
        ]
        out = [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                          ["batch_size", "sequence_length"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                          ["batch_size", "total_sequence_length"]),
        ]  # fmt: skip
        for il in range(s.n_layer):
            for part in ("key", "value"):
                out.append(
                    helper.make_tensor_value_info(
                        f"past_key_values.{il}.{part}", kv.onnx_type, cache
                    )
                )
        return out

    def _outputs(self, kv: KVCache) -> list[Any]:
        s = self.spec
        cache: list[str | int] = [
            "batch_size",
            s.n_head_kv,
            "total_sequence_length",
            kv.cache_dim(s.head_dim),
        ]
        out = [
            helper.make_tensor_value_info(
                "logits", TensorProto.FLOAT, ["batch_size", "sequence_length", s.n_vocab]
            )
        ]
        for il in range(s.n_layer):
            for part in ("key", "value"):
                out.append(
                    helper.make_tensor_value_info(f"present.{il}.{part}", kv.onnx_type, cache)
                )
        return out

    # --- node helpers ------------------------------------------------------------------------

    def _node(self, op: str, inputs: list[str], out: str | None = None, n_out: int = 1,
              domain: str | None = None, **attrs: Any) -> Any:  # fmt: skip
        name = f"/{op}_{len(self._nodes)}"
        outputs = [out] if out else [f"{name}/output_{i}" for i in range(n_out)]
        self._nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))
        return outputs[0] if n_out == 1 else outputs

    def _const(self, name: str, value: Any) -> str:
        name = f"const.{name}"
        if name not in self._constants:
            self._constants[name] = numpy_helper.from_array(np.asarray(value), name)
        return name

    # --- blocks ------------------------------------------------------------------------------

    def _mask_lengths(self) -> tuple[str, str]:
        """GroupQueryAttention's seqlens_k (tokens per row, less one) and total length."""
        one = self._const("one", np.array([1], np.int64))
        count = self._node("ReduceSum", ["attention_mask", one], keepdims=0)
        seqlens = self._node("Cast", [self._node("Sub", [count, one])], to=TensorProto.INT32)
        shape = self._node("Shape", ["attention_mask"])
        total = self._node("Gather", [shape, self._const("one_scalar", np.int64(1))], axis=0)
        return seqlens, self._node("Cast", [total], to=TensorProto.INT32)

    def _embedding(self) -> str:
        s = self.spec
        name = "token_embd.weight"
        if self.weights.bits is None:
            x = self._node("Gather", [name, "input_ids"], axis=0)
        else:
            layout = self.weights.layout(s.n_vocab, s.hidden_size)
            # the MatMulNBits codes (N, n_blocks, blob) read as (N, padded K * bits / 8)
            flat = self._const(
                "embd_shape", np.array([s.n_vocab, layout.n_blocks * layout.blob_size], np.int64)
            )
            data = self._node("Reshape", [f"{name}.B", flat])
            inputs = [data, "input_ids", f"{name}.scales"]
            if not self.weights.symmetric:
                inputs.append(f"{name}.zero_points")
            x = self._node("GatherBlockQuantized", inputs, domain=MS_DOMAIN,
                           bits=layout.bits, block_size=layout.block_size,
                           gather_axis=0, quantize_axis=1)  # fmt: skip
            if layout.padded_k != s.hidden_size:
                x = self._node("Slice", [
                    x, self._const("zero", np.array([0], np.int64)),
                    self._const("hidden", np.array([s.hidden_size], np.int64)),
                    self._const("last_axis", np.array([-1], np.int64)),
                ])  # fmt: skip
        if s.embed_scale != 1.0:
            x = self._node("Mul", [x, self._const("embed_scale", np.float32(s.embed_scale))])
        return x

    def _linear(self, x: str, name: str) -> str:
        t = self.tensors[name]
        n, k = t.shape
        if self.weights.bits is None:
            if name == "token_embd.weight":  # tied output: the embedding's (N, K) rows
                y = self._node("MatMul", [x, self._node("Transpose", [name], perm=[1, 0])])
            else:
                y = self._node("MatMul", [x, name])
        else:
            layout = self.weights.layout(n, k)
            inputs = [x, f"{name}.B", f"{name}.scales"]
            if not self.weights.symmetric:
                inputs.append(f"{name}.zero_points")
            attrs: dict[str, Any] = {
                "K": k,
                "N": n,
                "bits": layout.bits,
                "block_size": layout.block_size,
            }
            if self.weights.accuracy_level:
                attrs["accuracy_level"] = self.weights.accuracy_level
            y = self._node("MatMulNBits", inputs, domain=MS_DOMAIN, **attrs)
        bias = name.replace(".weight", ".bias")
        if bias in self.tensors:
            y = self._node("Add", [y, bias])
        return y

    def _rms_norm(self, x: str, weight: str) -> str:
        return self._node("RMSNormalization", [x, weight], axis=-1,
                          epsilon=self.spec.norm_eps, stash_type=1)  # fmt: skip

    def _head_norm(self, x: str, weight: str, n_heads: int) -> str:
        """RMS norm over each head of (batch, seq, n_heads * head_dim) (Qwen 3, Gemma 3)."""
        s = self.spec
        heads = self._const(f"heads_{n_heads}", np.array([0, 0, n_heads, s.head_dim], np.int64))
        flat = self._const(f"flat_{n_heads}", np.array([0, 0, n_heads * s.head_dim], np.int64))
        y = self._rms_norm(self._node("Reshape", [x, heads]), weight)
        return self._node("Reshape", [y, flat])

    def _layer(self, il: int, x: str, seqlens_k: str, total: str, kv: KVCache) -> str:
        s, p = self.spec, f"blk.{il}."
        h = self._rms_norm(x, p + "attn_norm.weight")
        q = self._linear(h, p + "attn_q.weight")
        k = self._linear(h, p + "attn_k.weight")
        v = self._linear(h, p + "attn_v.weight")
        if p + "attn_q_norm.weight" in self.tensors:
            q = self._head_norm(q, p + "attn_q_norm.weight", s.n_head)
            k = self._head_norm(k, p + "attn_k_norm.weight", s.n_head_kv)
        attn = self._attention(il, q, k, v, seqlens_k, total, kv)
        o = self._linear(attn, p + "attn_output.weight")
        if p + "post_attention_norm.weight" in self.tensors:
            o = self._rms_norm(o, p + "post_attention_norm.weight")
        x = self._node("Add", [x, o])
        h = self._rms_norm(x, p + "ffn_norm.weight")
        gate = self._linear(h, p + "ffn_gate.weight")
        up = self._linear(h, p + "ffn_up.weight")
        if s.activation == "silu":
            act = self._node("Mul", [gate, self._node("Sigmoid", [gate])])
        else:
            act = self._node("FastGelu", [gate], domain=MS_DOMAIN)
        d = self._linear(self._node("Mul", [act, up]), p + "ffn_down.weight")
        if p + "post_ffw_norm.weight" in self.tensors:
            d = self._rms_norm(d, p + "post_ffw_norm.weight")
        return self._node("Add", [x, d])

    def _attention(self, il: int, q: str, k: str, v: str, seqlens_k: str, total: str,
                   kv: KVCache) -> str:  # fmt: skip
        s = self.spec
        window = s.uses_window(il)
        tables = "_swa" if window and s.inv_freq_swa is not None else ""
        inputs = [q, k, v, f"past_key_values.{il}.key", f"past_key_values.{il}.value",
                  seqlens_k, total, f"cos_cache{tables}", f"sin_cache{tables}"]  # fmt: skip
        attrs: dict[str, Any] = {
            "num_heads": s.n_head, "kv_num_heads": s.n_head_kv, "do_rotary": 1,
            "rotary_interleaved": 0, "local_window_size": s.sliding_window if window else -1,
        }  # fmt: skip
        if s.attn_scale:
            attrs["scale"] = s.attn_scale
        if kv.bits:
            k_scale, v_scale = kv.scales[il]
            inputs += ["", "", "", self._const(f"k_scale.{il}", k_scale.astype(np.float32)),
                       self._const(f"v_scale.{il}", v_scale.astype(np.float32))]  # fmt: skip
            attrs.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL",
                         kv_cache_bit_width=kv.bits)  # fmt: skip
        outputs = [f"/attn_{il}/output_0", f"present.{il}.key", f"present.{il}.value"]
        self._nodes.append(helper.make_node("GroupQueryAttention", inputs, outputs,
                                            name=f"/blk.{il}/GroupQueryAttention", domain=MS_DOMAIN,
                                            **attrs))  # fmt: skip
        return outputs[0]
