"""Which GGML type each tensor gets: the named types and mixes of ``--type``.

The mixes follow llama.cpp's ``llama-quantize`` (src/llama-quant.cpp) for the dense
architectures we convert, so that a file made here has the types llama.cpp would give it:

* 1-D tensors (norms, biases, rope factors) stay F32;
* the output matrix (or the token embedding when it doubles as the output) becomes Q6_K in
  every quantized mix but Q8_0, and Q8_0 when its rows do not split into 256-blocks;
* ``*_m`` mixes keep attn_v and ffn_down at Q6_K on "more bits" layers (the first and last
  eighth, and every third layer between); ``q4_k_s`` raises the first attn_v and the first
  eighth of ffn_down to Q5_K;
* a type whose block does not divide a row falls back: Q4_K -> Q5_0, Q5_K -> Q5_1,
  Q6_K -> Q8_0, and F16 when even 32-blocks do not fit.

``q4_k`` and ``q5_k`` name the ``_m`` mixes, as in llama-quantize. ``pure=True`` gives every
matrix the base type (llama-quantize ``--pure``), fallbacks aside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgeinfer.converters import errors
from edgeinfer.converters.architectures.base import SourceTensor
from edgeinfer.gguf.constants import BLOCK_LAYOUTS, GGMLType

T = GGMLType

# llama_ftype values written as general.file_type
FILE_TYPES: dict[GGMLType, int] = {
    T.F32: 0, T.F16: 1, T.Q4_0: 2, T.Q4_1: 3, T.Q8_0: 7, T.Q5_0: 8, T.Q5_1: 9,
    T.Q4_K: 15, T.Q5_K: 17, T.Q6_K: 18, T.BF16: 32,
}  # fmt: skip

FALLBACKS = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0}
FLOAT_TYPES = (T.F32, T.F16, T.BF16)


@dataclass(frozen=True)
class Model:
    """What the mixes need to know about the model as a whole."""

    n_layer: int
    tied_embeddings: bool


def use_more_bits(il: int, n_layer: int) -> bool:
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def fits(ggml_type: GGMLType, row_length: int) -> bool:
    return row_length % BLOCK_LAYOUTS[ggml_type].block_size == 0


def fallback(ggml_type: GGMLType, row_length: int) -> GGMLType:
    """A type whose blocks divide ``row_length``, as llama.cpp chooses it."""
    if fits(ggml_type, row_length):
        return ggml_type
    lower = FALLBACKS.get(ggml_type, ggml_type)
    return lower if fits(lower, row_length) else T.F16


def role(name: str) -> str:
    """The role of a GGUF tensor name without its layer: "attn_v.weight", "output.weight"..."""
    return name.split(".", 2)[2] if name.startswith("blk.") else name


Rule = Callable[[SourceTensor, Model], "GGMLType | None"]


@dataclass(frozen=True)
class Recipe:
    name: str
    base: GGMLType
    file_type: int
    rules: tuple[Rule, ...] = ()  # first rule that returns a type wins

    def choose(self, t: SourceTensor, model: Model, pure: bool = False) -> GGMLType:
        if not t.is_matrix:
            return T.F32
        if self.base in FLOAT_TYPES:
            return self.base
        chosen = self.base
        if not pure:
            for rule in self.rules:
                picked = rule(t, model)
                if picked is not None:
                    chosen = picked
                    break
        return fallback(chosen, t.row_length)


def _is_output(t: SourceTensor, model: Model) -> bool:
    return t.name == "output.weight" or (model.tied_embeddings and t.name == "token_embd.weight")


def output_q6_k(t: SourceTensor, model: Model) -> GGMLType | None:
    if not _is_output(t, model):
        return None
    return T.Q6_K if fits(T.Q6_K, t.row_length) else T.Q8_0


def more_bits_q6_k(t: SourceTensor, model: Model) -> GGMLType | None:
    if role(t.name) in ("attn_v.weight", "ffn_down.weight") and use_more_bits(
        t.layer or 0, model.n_layer
    ):
        return T.Q6_K
    return None


def q4_k_s_layers(t: SourceTensor, model: Model) -> GGMLType | None:
    il = t.layer or 0
    if role(t.name) == "attn_v.weight" and il < 4:
        return T.Q5_K
    if role(t.name) == "ffn_down.weight" and il < model.n_layer // 8:
        return T.Q5_K
    return None


def _recipes() -> dict[str, Recipe]:
    out = {
        "f32": Recipe("f32", T.F32, 0),
        "f16": Recipe("f16", T.F16, 1),
        "bf16": Recipe("bf16", T.BF16, 32),
        "q8_0": Recipe("q8_0", T.Q8_0, 7),
        "q6_k": Recipe("q6_k", T.Q6_K, 18, (output_q6_k,)),
        "q4_k_m": Recipe("q4_k_m", T.Q4_K, 15, (output_q6_k, more_bits_q6_k)),
        "q4_k_s": Recipe("q4_k_s", T.Q4_K, 14, (output_q6_k, q4_k_s_layers)),
        "q5_k_m": Recipe("q5_k_m", T.Q5_K, 17, (output_q6_k, more_bits_q6_k)),
        "q5_k_s": Recipe("q5_k_s", T.Q5_K, 16, (output_q6_k,)),
    }
    for name, base, ftype in (
        ("q4_0", T.Q4_0, 2),
        ("q4_1", T.Q4_1, 3),
        ("q5_0", T.Q5_0, 8),
        ("q5_1", T.Q5_1, 9),
    ):
        out[name] = Recipe(name, base, ftype, (output_q6_k,))
    out["q4_k"], out["q5_k"] = out["q4_k_m"], out["q5_k_m"]
    return out


RECIPES = _recipes()


def recipe(name: str) -> Recipe:
    r = RECIPES.get(name.lower())
    if r is None:
        raise errors.UnknownTypeError(
            f"unknown type {name!r}; choose one of {', '.join(sorted(RECIPES))}"
        )
    return r


def type_by_name(name: str) -> GGMLType:
    """A single GGML type from its name ("q4_k", "Q8_0"), for profiles and fitting."""
    try:
        t = GGMLType[name.upper()]
    except KeyError:
        t = None
    if t is None or t not in FILE_TYPES and t not in (T.Q5_1, T.Q2_K, T.Q3_K):
        raise errors.UnknownTypeError(f"unknown tensor type {name!r}")
    return t
