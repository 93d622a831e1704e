"""The mixes choose llama.cpp's types, checked on a 32-layer model's names without reading
any weights: which layers get more bits, what the output becomes, and the fallbacks."""

from __future__ import annotations

import pytest

from edgeinfer.converters import errors
from edgeinfer.converters.architectures.base import SourceTensor
from edgeinfer.converters.recipes import Model, fallback, recipe, use_more_bits
from edgeinfer.gguf.constants import GGMLType as T

N_LAYER = 32
MORE_BITS = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}


def tensor(name: str, shape: tuple[int, ...], layer: int | None = None) -> SourceTensor:
    return SourceTensor(name, shape, layer=layer)


def layer_types(type_name: str, role: str, row: int = 4096, tied: bool = False) -> list[T]:
    model = Model(N_LAYER, tied_embeddings=tied)
    r = recipe(type_name)
    return [r.choose(tensor(f"blk.{i}.{role}", (1024, row), i), model) for i in range(N_LAYER)]


def test_use_more_bits_layers():
    assert {i for i in range(N_LAYER) if use_more_bits(i, N_LAYER)} == MORE_BITS


@pytest.mark.parametrize("name", ["q4_k_m", "q5_k_m"])
def test_m_mixes_raise_attn_v_and_ffn_down_on_more_bits_layers(name):
    base = recipe(name).base
    for role in ("attn_v.weight", "ffn_down.weight"):
        got = layer_types(name, role)
        assert got == [T.Q6_K if i in MORE_BITS else base for i in range(N_LAYER)]
    for role in (
        "attn_q.weight",
        "attn_k.weight",
        "attn_output.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
    ):
        assert set(layer_types(name, role)) == {base}


def test_q4_k_s_raises_first_layers():
    assert layer_types("q4_k_s", "attn_v.weight") == [T.Q5_K] * 4 + [T.Q4_K] * 28
    assert layer_types("q4_k_s", "ffn_down.weight") == [T.Q5_K] * 4 + [T.Q4_K] * 28


@pytest.mark.parametrize(
    "name, output, embd",
    [("q4_k_m", T.Q6_K, T.Q4_K), ("q4_0", T.Q6_K, T.Q4_0), ("q8_0", T.Q8_0, T.Q8_0),
     ("q6_k", T.Q6_K, T.Q6_K), ("f16", T.F16, T.F16), ("bf16", T.BF16, T.BF16)],
)  # fmt: skip
def test_output_and_embedding(name, output, embd):
    model = Model(N_LAYER, tied_embeddings=False)
    r = recipe(name)
    assert r.choose(tensor("output.weight", (32000, 4096)), model) == output
    assert r.choose(tensor("token_embd.weight", (32000, 4096)), model) == embd
    tied = Model(N_LAYER, tied_embeddings=True)
    assert r.choose(tensor("token_embd.weight", (32000, 4096)), tied) == output


def test_output_with_rows_that_are_not_256_blocks_is_q8_0():
    model = Model(N_LAYER, tied_embeddings=True)
    assert recipe("q4_k_m").choose(tensor("token_embd.weight", (262144, 640)), model) == T.Q8_0


def test_one_dimensional_tensors_stay_f32():
    for name in ("q4_k_m", "q8_0", "f16", "bf16"):
        assert (
            recipe(name).choose(tensor("blk.0.attn_norm.weight", (4096,), 0), Model(2, False))
            == T.F32
        )


def test_pure_gives_every_matrix_the_base_type():
    model = Model(N_LAYER, tied_embeddings=True)
    r = recipe("q4_k_m")
    for t in (
        tensor("token_embd.weight", (32000, 4096)),
        tensor("blk.0.attn_v.weight", (1024, 4096), 0),
    ):
        assert r.choose(t, model, pure=True) == T.Q4_K


@pytest.mark.parametrize(
    "ggml_type, row, expected",
    [(T.Q4_K, 4096, T.Q4_K), (T.Q4_K, 640, T.Q5_0), (T.Q5_K, 640, T.Q5_1), (T.Q6_K, 640, T.Q8_0),
     (T.Q4_K, 100, T.F16), (T.Q4_0, 100, T.F16), (T.Q8_0, 96, T.Q8_0)],
)  # fmt: skip
def test_fallbacks(ggml_type, row, expected):
    assert fallback(ggml_type, row) == expected


def test_aliases_and_unknown_types():
    assert recipe("Q4_K") is recipe("q4_k_m") and recipe("q5_k") is recipe("q5_k_m")
    with pytest.raises(errors.UnknownTypeError, match="q3_xl"):
        recipe("q3_xl")
