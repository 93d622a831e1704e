"""Regression tests of the reliability report (issue 9) for the API: option ranges, paths,
non-finite logits, and the model after close()."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest

from edgeinfer import errors
from edgeinfer.gguf import GGUFFile
from tests.api.conftest import ENGINE, load


def with_tensor_values(src, dst, name: str, value: float):
    """A copy of ``src`` whose F32 tensor ``name`` holds ``value`` everywhere."""
    shutil.copy(src, dst)
    with GGUFFile(src) as f:
        info = f.tensors[name]
        assert info.ggml_type.name == "F32"
        offset, n = info.offset, info.n_elements
    with open(dst, "r+b") as out:
        out.seek(offset)
        out.write(np.full(n, value, dtype=np.float32).tobytes())
    return dst


@pytest.mark.parametrize("engine", sorted({ENGINE, "reference"}))
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_non_finite_logits_are_a_typed_error_naming_the_step(
    fixture_models, tmp_path, engine, temperature
):
    """An output_norm of +inf: greedy used to return token 0 silently, sampling to raise
    numpy's ValueError."""
    path = with_tensor_values(fixture_models["llama"], tmp_path / "inf.gguf", "output_norm.weight",
                              math.inf)  # fmt: skip
    with load(path, engine=engine) as model:
        with pytest.raises(errors.NonFiniteLogitsError, match="generated token 0"):
            model.generate("Hello", max_tokens=4, temperature=temperature)
        # the model stays usable for what does not need the logits to be finite
        assert not np.isfinite(model.logits(model.tokenize("Hello"))).all()


@pytest.mark.parametrize(
    "options",
    [dict(presence_penalty=-1e39), dict(repeat_penalty=1e-40), dict(frequency_penalty=1e308),
     dict(presence_penalty=1e300, temperature=1e-30), dict(repeat_penalty=1e30)],
)  # fmt: skip
def test_extreme_finite_penalties_sample_without_nan(fixture_model, options):
    model = fixture_model("qwen2")
    c = model.generate("the the the the", max_tokens=6, seed=1, repeat_last_n=-1, **options)
    assert c.stats.generated_tokens + (c.finish_reason == "stop") >= 1


def test_engine_name_after_close(fixture_model):
    model = fixture_model("llama")
    name = model.engine
    model.close()
    assert model.engine == name
    with pytest.raises(errors.ModelClosedError):
        _ = model.backend


def test_path_types(fixture_models, tmp_path):
    path = fixture_models["llama"]
    with load(os.fsencode(path)) as model:  # bytes paths work
        assert model.generate("Hi", max_tokens=1, temperature=0).stats.generated_tokens == 1
    for bad in (3, 2.5, None, ["x"]):
        with pytest.raises(errors.InvalidOptionError, match="path"):
            load(bad)
    with pytest.raises(errors.InvalidOptionError, match="NUL"):
        load(str(path) + "\0x")
    with pytest.raises(errors.InvalidOptionError, match="NUL"):
        load(os.fsencode(path) + b"\0")


@pytest.mark.parametrize(
    "options, match",
    [(dict(n_threads=100000), "n_threads must lie in \\[1, 512\\], got 100000"),
     (dict(n_threads=0), "n_threads"), (dict(n_batch=5000), "n_batch must lie in \\[1, 4096\\]"),
     (dict(n_ctx=-5), "n_ctx")],
)  # fmt: skip
def test_each_limit_is_named_alone(fixture_models, options, match):
    with pytest.raises(errors.InvalidOptionError, match=match) as e:
        load(fixture_models["llama"], **options)
    assert "n_seq_max" not in str(e.value)


@pytest.mark.parametrize(
    "call",
    [lambda m: m.generate("x", parse_special="yes"), lambda m: m.tokenize("x", add_special=None),
     lambda m: m.detokenize([1], remove_special=1), lambda m: m.stream("x", add_special="no"),
     lambda m: m.chat([{"role": "user", "content": "x"}], stream="yes")],
)  # fmt: skip
def test_flags_must_be_bools(fixture_model, call):
    with pytest.raises(errors.InvalidOptionError, match="must be True or False"):
        call(fixture_model("llama"))


def test_a_rendered_prompt_is_capped_by_the_context_before_tokenizing(fixture_model):
    """A template could render millions of characters, which cost tens of seconds and
    hundreds of MB to tokenize before the context check refused them."""
    from edgeinfer.api import CHARS_PER_TOKEN

    model = fixture_model("llama", n_ctx=64)
    calls = []
    tokenize = model.tokenizer.tokenize
    model.tokenizer.tokenize = lambda text, **kw: calls.append(len(text)) or tokenize(text, **kw)
    long = "word " * (CHARS_PER_TOKEN * 64 // 5 + 10)
    with pytest.raises(errors.TemplateError, match=str(CHARS_PER_TOKEN * 64)):
        model.chat([{"role": "user", "content": long}])
    assert calls == []  # refused before any tokenizing
    # what fits the cap but not the context is the usual ContextOverflowError
    with pytest.raises(errors.ContextOverflowError):
        model.chat([{"role": "user", "content": "word " * 200}])
