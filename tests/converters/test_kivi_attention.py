"""KIVI caches against transformers: its own forward pass, with an attention function that
quantizes the history each query sees with KIVI's formula (torch), gives our logits to within
float rounding, and far closer than transformers' unquantized logits are."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer.gguf import GGUFFile
from tests.converters.conftest import hf_model, prompt_tokens


def _kivi_fake_quantize(torch, x, bits: int, dim: int):
    """KIVI's quantizer (its reference code): min and max along dim, scale = (mx - mn) /
    (2^b - 1), code = round((x - mn) / scale) clamped, decoded code * scale + mn; the scale
    and the minimum kept as float16, as our format stores them."""
    mn = torch.amin(x, dim=dim, keepdim=True).half().float()
    scale = ((torch.amax(x, dim=dim, keepdim=True) - mn) / (2**bits - 1)).half().float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    code = torch.where(scale > 0, ((x - mn) / safe).round().clamp(0, 2**bits - 1), 0.0)
    return code * scale + mn


def _kivi_attention(bits: int, group: int, residual: int):
    """An attention function for transformers' AttentionInterface: eager attention where the
    query at position p sees the keys and values of every whole group of G positions ending
    at or before p + 1 - R quantized (keys per channel over the group's positions, values per
    position over groups of min(G, head_dim) channels), the rest rounded to float16."""
    import torch

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        n_rep = query.shape[1] // key.shape[1]
        k16, v16 = key.half().float(), value.half().float()  # (1, n_kv, T, d)
        kq, vq = k16.clone(), v16.clone()
        T, hdv = key.shape[2], value.shape[3]
        gv = min(group, hdv)
        for g in range(T // group):
            rows = slice(g * group, (g + 1) * group)
            kq[:, :, rows] = _kivi_fake_quantize(torch, k16[:, :, rows], bits, 2)
            vg = v16[:, :, rows].reshape(*v16.shape[:2], group, hdv // gv, gv)
            vq[:, :, rows] = _kivi_fake_quantize(torch, vg, bits, 4).reshape(vq[:, :, rows].shape)
        kf, kqq, vf, vqq = (t.repeat_interleave(n_rep, dim=1) for t in (k16, kq, v16, vq))
        n = query.shape[2]
        pos = torch.arange(T - n, T)
        below = torch.clamp(pos + 1 - residual, min=0) // group * group
        quantized = torch.arange(T)[None, :] < below[:, None]  # (n, T)
        scores = torch.where(quantized, query @ kqq.transpose(2, 3), query @ kf.transpose(2, 3))
        # one sequence without padding: the causal mask is all the mask there is
        causal = torch.arange(T)[None, :] > pos[:, None]
        scores = torch.where(causal, -torch.inf, scores * scaling)
        probs = torch.softmax(scores.double(), dim=-1).float()
        out = torch.where(quantized, probs, 0.0) @ vqq + torch.where(quantized, 0.0, probs) @ vf
        return out.transpose(1, 2).contiguous(), probs

    return attention


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("kv_type, group, residual", [("kivi4", 32, 16), ("kivi2", 64, 0)])
def test_transformers_with_kivi_attention_gives_our_logits(
    checkpoints, converted, arch, kv_type, group, residual
):
    torch = pytest.importorskip("torch")
    from transformers import AttentionInterface

    bits = int(kv_type[-1])
    path = converted(arch, "f32")
    with GGUFFile(path) as f:
        tokens = prompt_tokens(len(f.metadata["tokenizer.ggml.tokens"]), 160, seed=5)
    model = hf_model(checkpoints[arch])
    theirs = {}
    with torch.no_grad():
        plain = model(torch.tensor([tokens])).logits[0].numpy()
        for r in (residual, residual + group):  # ours, and a view one group late
            name = f"edgeinfer_kivi_{bits}_{group}_{r}"
            AttentionInterface.register(name, _kivi_attention(bits, group, r))
            model.set_attn_implementation(name)
            theirs[r] = model(torch.tensor([tokens])).logits[0].numpy()
    with edgeinfer.load(
        path, n_ctx=256, kv_type=kv_type, kivi_group=group, kivi_residual=residual
    ) as m:
        ours = m.logits(tokens)
    apart = np.abs(ours - theirs[residual]).mean()
    # the quantization moves the logits, by far more than ours and theirs are apart (a code
    # rounds the other way only where our keys and theirs differ in the last bits)
    assert apart < 0.02 * np.abs(theirs[residual] - plain).mean()
    # and seeing each group one group later would not agree
    assert apart < 0.1 * np.abs(ours - theirs[residual + group]).mean()
