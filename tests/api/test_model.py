"""The Model object: loading, closing, tokens, logits and option checking."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from edgeinfer import errors
from tests.api.conftest import ARCHS, ENGINE, ScriptedSampler, load
from tests.conftest import llama_cpp_model

# --- lifetime --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_load_describes_the_model(fixture_models, arch):
    with load(fixture_models[arch], n_ctx=256, n_threads=1) as model:
        assert model.config.arch == arch
        assert model.n_ctx == 256
        assert model.n_threads == 1
        assert (
            model.n_vocab == model.tokenizer.n_vocab == len(model.metadata["tokenizer.ggml.tokens"])
        )
        assert (
            model.engine == ENGINE if ENGINE != "auto" else model.engine in ("native", "reference")
        )
        assert model.load_s > 0


def test_default_context_is_capped_by_the_training_context(fixture_models):
    # the fixtures are trained for 2048 positions; the default cap (4096) is larger
    with load(fixture_models["llama"]) as model:
        assert model.n_ctx == 2048


def test_close_is_idempotent_and_every_use_afterwards_raises(fixture_models):
    model = load(fixture_models["llama"])
    model.close()
    model.close()
    uses = [
        lambda: model.tokenize("hello"),
        lambda: model.detokenize([1, 2]),
        lambda: model.logits([1, 2]),
        lambda: model.generate("hello", max_tokens=2),
        lambda: model.stream("hello", max_tokens=2),
        lambda: model.chat([{"role": "user", "content": "hi"}]),
        lambda: model.render_chat([{"role": "user", "content": "hi"}]),
        model.reset,
    ]
    for use in uses:
        with pytest.raises(errors.ModelClosedError):
            use()


def test_context_manager_closes_even_on_error(fixture_models):
    with pytest.raises(RuntimeError), load(fixture_models["qwen2"]) as model:
        raise RuntimeError("boom")
    with pytest.raises(errors.ModelClosedError):
        model.generate("x")


def test_close_stops_an_open_stream(fixture_model):
    model = fixture_model("llama")
    stream = model.stream("Hello", max_tokens=50, temperature=0)
    first = next(stream)
    assert isinstance(first, str)
    model.close()
    assert list(stream) == []
    assert stream.finish_reason == "cancelled"


def test_close_from_another_thread_while_streaming(fixture_model):
    model = fixture_model("gemma3")
    word = model.tokenize(" word", add_special=False)[0]

    def slow_sampler(logits, history):
        time.sleep(0.02)
        return word

    stream = model.stream("Hello", max_tokens=2000, sampler=slow_sampler)
    next(stream)
    failures = []

    def close() -> None:
        time.sleep(0.05)  # lands while the stream is inside the sampler
        try:
            model.close()
        except BaseException as e:
            failures.append(e)

    closer = threading.Thread(target=close)
    closer.start()
    rest = list(stream)  # keeps pulling while the other thread closes
    closer.join(timeout=30)
    assert not closer.is_alive()
    assert failures == []
    assert stream.finish_reason == "cancelled"
    assert len(rest) < 1999
    with pytest.raises(errors.ModelClosedError):
        model.generate("again")


@pytest.mark.parametrize(
    "options",
    [
        dict(n_ctx=0),
        dict(n_ctx=-5),
        dict(n_ctx=1 << 22),
        dict(n_ctx="big"),
        dict(n_threads=0),
        dict(n_threads=2.5),
        dict(n_batch=0),
        dict(engine="gpu"),
        dict(kv_type="q5_1"),
        dict(cache_type_v="q9"),
        dict(kv_type="f16", cache_type_k="q4_0"),  # the shorthand disagrees with an explicit one
        dict(swa_full="no"),
        dict(flash_attention=True),
    ],
)
def test_bad_load_options(fixture_models, options):
    with pytest.raises(errors.InvalidOptionError):
        load(fixture_models["llama"], **options)


# --- tokens ----------------------------------------------------------------------------------

ROUND_TRIP = [
    "Hello, world!",
    "  leading spaces and\ttabs\nand newlines\n\n",
    "日本語のテキストと中文字符",
    "emoji 😀🚀 and a family 👨‍👩‍👧",
    "accents: café, naïve, Ångström",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_tokenize_detokenize_round_trip_on_gemma(gemma, text):
    ids = gemma.tokenize(text)
    assert ids[0] == gemma.tokenizer.bos_id
    assert gemma.detokenize(ids, remove_special=True) == text
    assert gemma.detokenize(gemma.tokenize(text, add_special=False)) == text


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenize_detokenize_round_trip_on_fixtures(fixture_models, fixture_model, arch):
    model = fixture_model(arch)
    llm = llama_cpp_model(fixture_models[arch], vocab_only=True)
    for text in ROUND_TRIP:
        ids = model.tokenize(text)
        assert ids == llm.tokenize(text.encode(), add_bos=True, special=False)
        back = model.detokenize(ids, remove_special=True)
        if arch == "gemma3":
            # the cut-down SentencePiece vocabulary lacks "▁", so a space before a character
            # it spells in bytes stays a literal "▁", in llama.cpp as well
            assert back.encode() == llm.detokenize(ids[1:])
        else:
            assert back == text
    llm.close()


def test_tokenize_matches_llama_cpp_flags(gemma, gemma_llama_cpp):
    text = "<start_of_turn>user\nhi<end_of_turn>"
    for add_special in (True, False):
        for parse_special in (True, False):
            ours = gemma.tokenize(text, add_special=add_special, parse_special=parse_special)
            ref = gemma_llama_cpp.tokenize(
                text.encode(), add_bos=add_special, special=parse_special
            )
            assert ours == ref, (add_special, parse_special)


# --- logits ----------------------------------------------------------------------------------


def test_logits_shape_and_prefill_equality_on_gemma(gemma):
    tokens = gemma.tokenize("The quick brown fox jumps over the lazy dog")
    logits = gemma.logits(tokens)
    assert logits.shape == (len(tokens), gemma.n_vocab)
    assert logits.dtype == np.float32
    assert np.isfinite(logits).all()
    # generation from scratch evaluates the prompt as one batch
    gemma.reset()
    sampler = ScriptedSampler([gemma.tokenizer.eos_id])
    gemma.generate(tokens, max_tokens=1, sampler=sampler)
    assert np.array_equal(sampler.seen[0], logits[-1])
    # every position's logits are those a prompt ending there gets
    for end in (1, len(tokens) // 2):
        gemma.reset()
        sampler = ScriptedSampler([gemma.tokenizer.eos_id])
        gemma.generate(tokens[:end], max_tokens=1, sampler=sampler)
        assert np.array_equal(sampler.seen[0], logits[end - 1])


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_do_not_depend_on_batching_or_cache(fixture_models, arch):
    path = fixture_models[arch]
    with load(path, n_ctx=128) as a, load(path, n_ctx=128, n_batch=5) as b:
        tokens = a.tokenize("Batch invariance: chunks of five tokens give the same numbers.")
        full = a.logits(tokens)
        assert np.array_equal(full, b.logits(tokens))
        # the last prompt token evaluated alone on top of the cached prefix
        sampler = ScriptedSampler([a.tokenizer.eos_id])
        stream = a.stream(tokens, max_tokens=1, sampler=sampler)
        list(stream)
        assert stream.stats.cached_tokens == len(tokens) - 1
        assert np.array_equal(sampler.seen[0], full[-1])


def test_logits_is_a_fresh_sequence(fixture_model):
    model = fixture_model("qwen3")
    a = model.tokenize("first text")
    b = model.tokenize("second, different text")
    ref = model.logits(b)
    model.logits(a)
    assert np.array_equal(model.logits(b), ref)


def test_logits_at_the_context_limit(fixture_model):
    model = fixture_model("llama", n_ctx=16)
    tokens = list(range(100, 116))
    assert model.logits(tokens).shape == (16, model.n_vocab)
    with pytest.raises(errors.ContextOverflowError):
        model.logits(tokens + [5])


# --- option checking -------------------------------------------------------------------------

BAD_SAMPLING = [
    dict(top_p=0.0),
    dict(top_p=1.5),
    dict(min_p=2.0),
    dict(min_p=-0.1),
    dict(top_k=-1),
    dict(top_k=2.5),
    dict(top_k=None),
    dict(repeat_penalty=0.0),
    dict(repeat_penalty=float("inf")),
    dict(repeat_last_n=-2),
    dict(seed=-1),
    dict(seed=1.5),
    dict(seed="7"),
    dict(temperature=float("nan")),
    dict(temperature=float("inf")),
    dict(temperature="hot"),
    dict(presence_penalty=float("nan")),
    dict(max_tokens=-2),
    dict(max_tokens=2.5),
    dict(max_tokens="10"),
    dict(stop=""),
    dict(stop=["ok", ""]),
    dict(stop=[1]),
    dict(stop=None),
    dict(temprature=0.5),  # a typo is an unknown option, not silently ignored
    dict(stream=True),
]


@pytest.mark.parametrize("options", BAD_SAMPLING, ids=lambda o: repr(o))
def test_invalid_generation_options(fixture_model, options):
    model = fixture_model("llama")
    with pytest.raises(errors.InvalidOptionError):
        model.generate("Hello", **options)
    with pytest.raises(errors.InvalidOptionError):
        model.stream("Hello", **options)
    # the model is not left busy by a rejected request
    assert model.generate("Hello", max_tokens=2, temperature=0).stats.generated_tokens == 2


def test_sampler_and_sampling_options_exclude_each_other(fixture_model):
    model = fixture_model("llama")
    with pytest.raises(errors.InvalidOptionError):
        model.generate("Hello", sampler=ScriptedSampler([1]), temperature=0.5)


BAD_PROMPTS = [[], [-1], [10**9], [1, 2.5], ["a"], [None], b"bytes are not text", None, 42, [True]]


@pytest.mark.parametrize("prompt", BAD_PROMPTS, ids=repr)
def test_invalid_prompts(fixture_model, prompt):
    model = fixture_model("qwen2")
    with pytest.raises(errors.InvalidOptionError):
        model.generate(prompt, max_tokens=1)
    if prompt is not None and not isinstance(prompt, (bytes, int)):
        with pytest.raises(errors.InvalidOptionError):
            model.logits(prompt)


def test_vocabulary_edge_ids_are_accepted(fixture_model):
    model = fixture_model("qwen2")
    logits = model.logits([0, model.n_vocab - 1])
    assert logits.shape == (2, model.n_vocab)
    assert (
        model.generate(np.array([0, model.n_vocab - 1]), max_tokens=1).stats.generated_tokens == 1
    )


def test_negative_temperature_is_refused_and_zero_is_greedy(fixture_model):
    model = fixture_model("qwen3")
    with pytest.raises(errors.InvalidOptionError, match="temperature"):
        model.generate("Hello there", max_tokens=12, temperature=-1.0)
    greedy = model.generate("Hello there", max_tokens=12, temperature=0)
    argmax = [int(np.argmax(row)) for row in model.logits(model.tokenize("Hello there"))[-1:]]
    assert greedy.tokens[0] == argmax[0]


def test_empty_text_prompt_still_has_bos(fixture_model):
    model = fixture_model("llama")  # llama3-style vocabulary: BOS added
    assert model.generate("", max_tokens=3, temperature=0).stats.prompt_tokens == 1
    qwen = fixture_model("qwen2")  # no BOS: nothing to start from
    with pytest.raises(errors.InvalidOptionError):
        qwen.generate("", max_tokens=3)
