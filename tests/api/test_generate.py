"""Generation through the API: llama.cpp's greedy tokens, seeds, stops, limits, cancellation,
full contexts, statistics and streamed text."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgeinfer import errors
from tests.api.conftest import ARCHS, ScriptedSampler, greedy_with_margins, load
from tests.conftest import llama_cpp_model

# Gemma 3 270M continuations whose greedy path has no near-tie (the smallest gap between the
# two best logits is >= 0.05 along the way). The as-shipped Q4_K_M weights make llama.cpp's
# own batched and one-by-one logits differ by a few hundredths, so a prompt with a closer
# race could legitimately go either way; these cannot.
GEMMA_PROMPTS = [
    "def fibonacci(n):\n",
    "1, 2, 3, 4, 5,",
    "The three primary colors are",
]


def llama_cpp_greedy(llm, prompt: list[int], n: int, is_eog) -> list[int]:
    llm.reset()
    out: list[int] = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        if is_eog(token) or len(out) == n:
            break
        out.append(token)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("prompt", GEMMA_PROMPTS)
def test_gemma_greedy_equals_llama_cpp(gemma, gemma_llama_cpp, prompt):
    ids = gemma.tokenize(prompt)
    margins: list[float] = []
    ours = gemma.generate(ids, max_tokens=32, sampler=greedy_with_margins(margins))
    ref = llama_cpp_greedy(gemma_llama_cpp, ids, 32, gemma.tokenizer.is_eog)
    assert len(ref) == 32
    assert ours.tokens == ref, f"smallest top-2 gap on our side: {min(margins):.3f}"
    assert ours.text == gemma_llama_cpp.detokenize(ref).decode()


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_greedy_equals_llama_cpp_exactly(fixture_models_f32, arch):
    """F32 weights and cache: both engines compute the same numbers, so 64 greedy tokens
    agree even through the near-ties that random weights are full of."""
    import llama_cpp

    path = fixture_models_f32[arch]
    f32 = llama_cpp.GGML_TYPE_F32
    llm = llama_cpp_model(path, n_ctx=256, type_k=f32, type_v=f32)
    with load(path, n_ctx=256, kv_type="f32") as model:
        for prompt in ["Hello world, this is a test", "日本語のテキスト 😀 and code: x = [1, 2]"]:
            ids = model.tokenize(prompt)
            ours = model.generate(ids, max_tokens=64, temperature=0)
            assert ours.tokens == llama_cpp_greedy(llm, ids, 64, model.tokenizer.is_eog)
    llm.close()


# --- sampling ----------------------------------------------------------------------------------

SAMPLING = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


@pytest.mark.slow
def test_gemma_same_seed_same_text_other_seed_other_text(gemma):
    runs = {seed: gemma.generate("My favourite animal is", max_tokens=12, seed=seed, **SAMPLING)
            for seed in (1, 2)}  # fmt: skip
    again = gemma.generate("My favourite animal is", max_tokens=12, seed=1, **SAMPLING)
    assert again.tokens == runs[1].tokens and again.text == runs[1].text
    assert runs[1].text != runs[2].text


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_seeds(fixture_model, arch):
    model = fixture_model(arch)
    texts = [model.generate("Once", max_tokens=24, seed=s, **SAMPLING).tokens for s in range(4)]
    assert len({tuple(t) for t in texts}) == 4
    assert model.generate("Once", max_tokens=24, seed=2, **SAMPLING).tokens == texts[2]
    # with no seed, two runs draw from fresh randomness
    free = [model.generate("Once", max_tokens=24, **SAMPLING).tokens for _ in range(2)]
    assert free[0] != free[1]


def test_sampling_options_reach_the_sampler(fixture_model):
    model = fixture_model("llama")
    greedy = model.generate("Hello", max_tokens=16, temperature=0).tokens
    # top_k=1 leaves only the best token however hot the temperature
    assert model.generate("Hello", max_tokens=16, temperature=5.0, top_k=1, seed=3).tokens == greedy
    # a huge repeat penalty forbids every token seen so far (prompt included)
    tokens = model.generate("Hello", max_tokens=40, temperature=0, repeat_penalty=1e6,
                            repeat_last_n=-1).tokens  # fmt: skip
    prompt = model.tokenize("Hello")
    assert len(set(tokens)) == len(tokens) and not set(tokens) & set(prompt)


# --- stop strings ------------------------------------------------------------------------------


def _scripted(model, texts: list[str], then: int | None = None) -> ScriptedSampler:
    """A sampler spelling the given pieces, each tokenized on its own, then ``then``."""
    ids = [t for text in texts for t in model.tokenize(text, add_special=False)]
    return ScriptedSampler(ids, then=model.tokenizer.eos_id if then is None else then)


@pytest.mark.parametrize(
    "pieces, stop, expected",
    [
        (["Hello", ", world. ", "ST", "OP", " after"], "STOP", "Hello, world. "),
        (["one two", " three"], ["two", "one t"], ""),  # the earliest match wins
        (["abc", "END", "xyz"], ["zz", "END"], "abc"),
        (["no stop here", " at all"], "STOPPER", "no stop here at all"),
        (["almost S", "TO", "P", "PED", "!"], "STOPPED", "almost "),
        (["S", "TOMP ", "done"], "STOP", "STOMP done"),  # a prefix that never completes
        (["line 1\n", "line 2\n\n", "line 3"], "\n\n", "line 1\nline 2"),
        (["x" * 10, "ST"], "STOP", "x" * 10 + "ST"),  # ends mid-prefix: the prefix comes out
    ],
)
def test_stop_strings_are_never_streamed(fixture_model, pieces, stop, expected):
    model = fixture_model("llama")
    sampler = _scripted(model, pieces)
    stream = model.stream("Hi", max_tokens=100, stop=stop, sampler=sampler)
    emitted = ""
    stops = [stop] if isinstance(stop, str) else stop
    for piece in stream:
        emitted += piece
        assert piece
        # what is out can never be taken back: it must be the start of the final text
        assert expected.startswith(emitted), (emitted, expected)
        assert not any(s in emitted for s in stops)
    assert emitted == stream.text == expected
    assert stream.finish_reason == "stop"  # the stop string, or else the scripted EOS
    # no token was asked for after the one that completed a stop string
    script = sampler.script
    done = [
        k
        for k in range(1, len(script) + 1)
        if any(s in model.detokenize(script[:k]) for s in stops)
    ]
    assert sampler.calls == (done[0] if done else len(script) + 1)


def test_stop_string_inside_one_token(fixture_model):
    model = fixture_model("llama")
    word = model.tokenize(" return", add_special=False)
    assert len(word) == 1
    say = model.tokenize("say", add_special=False)
    sampler = ScriptedSampler(say + word * 3, then=0)
    c = model.generate("x", stop="etu", sampler=sampler, max_tokens=20)
    assert c.text == "say r" and c.finish_reason == "stop"
    assert sampler.calls == len(say) + 1


@pytest.mark.slow
def test_gemma_stop_string_on_real_output(gemma):
    c = gemma.generate("1, 2, 3, 4, 5,", max_tokens=32, temperature=0, stop=["9"])
    assert c.text == " 6, 7, 8, "
    assert c.finish_reason == "stop"
    pieces = list(gemma.stream("1, 2, 3, 4, 5,", max_tokens=32, temperature=0, stop=", 8"))
    assert "".join(pieces) == " 6, 7"


# --- limits ------------------------------------------------------------------------------------


def test_max_tokens(fixture_model):
    model = fixture_model("qwen3")
    never = ScriptedSampler([], then=model.tokenize("a", add_special=False)[0])
    for n in (0, 1, 7):
        c = model.generate("Hi", max_tokens=n, sampler=never)
        assert c.finish_reason == "length"
        assert len(c.tokens) == c.stats.generated_tokens == n


@pytest.mark.parametrize("arch", ARCHS)
def test_end_of_generation_tokens_stop(fixture_model, arch):
    model = fixture_model(arch)
    tok = model.tokenizer
    assert tok.eos_id in tok.eog_ids
    word = model.tokenize(" end", add_special=False)
    for eog in sorted(tok.eog_ids):
        c = model.generate("Hi", max_tokens=50, sampler=ScriptedSampler(word + [eog], then=0))
        assert c.finish_reason == "stop"
        assert c.tokens == word
        assert c.text == model.detokenize(word)


def test_gemma_end_of_turn_ends_a_reply(gemma):
    tok = gemma.tokenizer
    end_of_turn = tok.vocab.token_to_id["<end_of_turn>"]
    assert tok.is_eog(end_of_turn) and tok.is_eog(tok.eos_id)
    sampler = ScriptedSampler(gemma.tokenize("Paris.", add_special=False) + [end_of_turn])
    c = gemma.chat([{"role": "user", "content": "Capital of France?"}], sampler=sampler)
    assert (c.text, c.finish_reason) == ("Paris.", "stop")


def test_prompt_longer_than_the_context(fixture_model):
    model = fixture_model("llama", n_ctx=32)
    long_prompt = " ".join(["word"] * 40)
    assert len(model.tokenize(long_prompt)) > 32
    with pytest.raises(errors.ContextOverflowError):
        model.generate(long_prompt)
    with pytest.raises(errors.ContextOverflowError):
        model.stream(long_prompt)  # raised at once, not at the first piece
    with pytest.raises(errors.ContextOverflowError):
        model.chat([{"role": "user", "content": long_prompt}])
    # a prompt that fills the context exactly leaves no room for a token either
    with pytest.raises(errors.ContextOverflowError):
        model.generate(list(range(100, 132)))
    assert model.generate("short", max_tokens=2).stats.generated_tokens == 2


@pytest.mark.parametrize("max_tokens", [-1, 1000])
@pytest.mark.parametrize("arch", ARCHS)
def test_generation_filling_the_context_stops_with_length(fixture_model, arch, max_tokens):
    model = fixture_model(arch, n_ctx=48)
    prompt = model.tokenize("The context of this model is small")
    c = model.generate(prompt, max_tokens=max_tokens, temperature=0)
    assert c.finish_reason == "length"
    # every position of the context was used; the last token needs no position of its own
    assert len(prompt) + len(c.tokens) - 1 == 48
    # the next request starts normally (the cache is reused or rewound, never overrun)
    again = model.generate(prompt, max_tokens=-1, temperature=0)
    assert again.tokens == c.tokens
    assert again.stats.cached_tokens == len(prompt) - 1
    # and so does a continuation of everything, which no longer fits
    with pytest.raises(errors.ContextOverflowError):
        model.generate(prompt + c.tokens)


def test_prompt_one_short_of_the_context(fixture_model):
    model = fixture_model("qwen2", n_ctx=20)
    c = model.generate(list(range(300, 319)), max_tokens=10, temperature=0)
    assert (len(c.tokens), c.finish_reason) == (2, "length")


# --- cancellation ------------------------------------------------------------------------------


def test_cancel_from_another_thread_mid_stream(fixture_model):
    model = fixture_model("gemma3")
    stream = model.stream("Tell me a long story", max_tokens=1000, temperature=0)
    reached, cancelled = threading.Event(), threading.Event()

    def canceller() -> None:
        reached.wait(30)
        model.cancel()
        cancelled.set()

    thread = threading.Thread(target=canceller)
    thread.start()
    n_at_cancel = None
    for i, _ in enumerate(stream):
        if i == 4:
            reached.set()
            assert cancelled.wait(30)
            n_at_cancel = len(stream.tokens)
    thread.join()
    assert stream.finish_reason == "cancelled"
    assert n_at_cancel is not None and len(stream.tokens) == n_at_cancel
    # the next request is not affected by the old cancellation
    assert model.generate("Again", max_tokens=3, temperature=0).finish_reason == "length"


def test_cancel_while_generating_in_another_thread(fixture_model):
    """The other way round: generation runs in a worker thread, the caller cancels."""
    model = fixture_model("qwen3")
    started = threading.Event()
    result = {}

    def worker() -> None:
        stream = model.stream("Go", max_tokens=1000, temperature=0)
        for _ in stream:
            started.set()
        result["reason"] = stream.finish_reason
        result["n"] = len(stream.tokens)

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(30)
    model.cancel()
    thread.join(30)
    assert not thread.is_alive()
    assert result["reason"] == "cancelled" and result["n"] < 1000


def test_cancel_between_prompt_chunks(fixture_model):
    model = fixture_model("llama", n_batch=8)
    engine = model._engine
    calls = []
    decode = engine.decode  # every generation's steps run through the batcher's decode

    def decode_then_cancel(batch):
        calls.append(len(batch))
        model.cancel()  # arrives while the first chunk is being evaluated
        return decode(batch)

    engine.decode = decode_then_cancel
    prompt = model.tokenize(" ".join(["chunk"] * 60))
    c = model.generate(prompt, max_tokens=10, temperature=0)
    assert c.finish_reason == "cancelled" and c.text == "" and c.tokens == []
    assert calls == [8]
    engine.decode = decode
    # the cache kept what was evaluated; the next request picks up from there
    c = model.generate(prompt, max_tokens=2, temperature=0)
    assert c.stats.cached_tokens == 8 and c.finish_reason == "length"


def test_cancel_when_idle_does_not_affect_the_next_request(fixture_model):
    model = fixture_model("llama")
    model.cancel()
    assert model.generate("Hi", max_tokens=3, temperature=0).finish_reason == "length"


def test_closing_a_stream_frees_the_model(fixture_model):
    model = fixture_model("llama")
    stream = model.stream("Hi", max_tokens=100, temperature=0)
    next(stream)
    stream.close()
    assert stream.finish_reason == "cancelled"
    assert model.generate("Hi", max_tokens=3, temperature=0).stats.generated_tokens == 3
    # a stream left half-way by this thread does not block its next request either, and
    # read again later it goes on where it was (re-evaluating its context first)
    left = model.stream("Hi", max_tokens=8, temperature=0)
    first = next(left)
    assert model.generate("Other text", max_tokens=3, temperature=0).stats.generated_tokens == 3
    rest = list(left)
    assert left.finish_reason == "length" and len(left.tokens) == 8
    expected = model.generate("Hi", max_tokens=8, temperature=0)
    assert first + "".join(rest) == expected.text and left.tokens == expected.tokens


def test_requests_from_two_threads_take_turns(fixture_model):
    model = fixture_model("qwen2")
    expected = model.generate("Turns", max_tokens=20, temperature=0).tokens
    results, errors_seen = [], []

    def worker() -> None:
        try:
            results.append(model.generate("Turns", max_tokens=20, temperature=0).tokens)
        except BaseException as e:
            errors_seen.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors_seen == [] and results == [expected] * 3


# --- statistics --------------------------------------------------------------------------------


def test_stats(fixture_model):
    model = fixture_model("gemma3")
    prompt = model.tokenize("Statistics of a generation")
    c = model.generate(prompt, max_tokens=12, temperature=0)
    s = c.stats
    assert s.prompt_tokens == len(prompt)
    assert s.generated_tokens == len(c.tokens) == 12
    assert s.cached_tokens == 0
    assert s.ttft_s > 0 and s.prompt_s > 0 and s.decode_s > 0
    assert s.prompt_tok_s > 0 and s.gen_tok_s > 0
    assert s.ttft_s >= s.prompt_s
    d = s.as_dict()
    assert d["prompt_tokens"] == len(prompt) and d["generated_tokens"] == 12
    assert d["finish_reason"] == "length" and d["gen_tok_s"] > 0 and d["ttft_s"] > 0
    # the same prompt again: all but its last token come from the cache
    s2 = model.generate(prompt, max_tokens=2, temperature=0).stats
    assert s2.cached_tokens == len(prompt) - 1 and s2.prompt_tok_s > 0


@pytest.mark.slow
def test_gemma_stats(gemma):
    c = gemma.generate("Statistics:", max_tokens=4, temperature=0)
    s = c.stats
    assert (s.prompt_tokens, s.generated_tokens) == (len(gemma.tokenize("Statistics:")), 4)
    assert s.gen_tok_s > 0 and s.ttft_s > 0 and s.prompt_tok_s > 0


# --- streamed text -----------------------------------------------------------------------------

SPLIT_TEXT = "😀 你好, 世界! こんにちは 🇯🇵 café ∑"


@pytest.mark.parametrize("arch", ARCHS)
def test_stream_yields_whole_characters_when_tokens_split_them(fixture_model, arch):
    model = fixture_model(arch)
    tok = model.tokenizer
    # spell the text one UTF-8 byte at a time (byte-level BPE has a token for every byte,
    # SentencePiece its <0xXX> fallback tokens)
    ids = [_byte_token(tok, byte) for byte in SPLIT_TEXT.encode()]
    stream = model.stream("x", max_tokens=200, sampler=ScriptedSampler(ids, then=tok.eos_id))
    pieces = list(stream)
    assert "".join(pieces) == SPLIT_TEXT
    for piece in pieces:
        assert "\ufffd" not in piece
        piece.encode("utf-8")  # no lone surrogates either
    # each piece ends where a character ends, so there are at most as many as characters
    assert len(pieces) <= len(SPLIT_TEXT)


_BYTE_TOKENS: dict[int, dict[int, int]] = {}


def _byte_token(tok, byte: int) -> int:
    table = _BYTE_TOKENS.get(id(tok))
    if table is None:
        table = {}
        for i in range(tok.n_vocab):
            piece = tok.token_to_piece(i)
            if len(piece) == 1 and piece[0] not in table:
                table[piece[0]] = i
        _BYTE_TOKENS[id(tok)] = table
    return table[byte]


@pytest.mark.parametrize("arch", ARCHS)
def test_random_generation_streams_what_batch_decoding_gives(fixture_model, arch):
    """Hot sampling on random weights produces arbitrary byte sequences; streaming must give
    exactly the batch decoding (invalid bytes become U+FFFD there too), never more U+FFFD."""
    model = fixture_model(arch)
    for seed in range(3):
        stream = model.stream("日本", max_tokens=80, seed=seed, temperature=2.0, top_k=0,
                              top_p=1.0, min_p=0.0)  # fmt: skip
        pieces = list(stream)
        raw = b"".join(model.tokenizer.token_to_piece(t) for t in stream.tokens)
        assert "".join(pieces) == raw.decode("utf-8", "replace")
        for piece in pieces:
            piece.encode("utf-8")


def test_generate_and_stream_agree(fixture_model):
    model = fixture_model("qwen3")
    c = model.generate("Agree", max_tokens=30, seed=5, temperature=0.9)
    stream = model.stream("Agree", max_tokens=30, seed=5, temperature=0.9)
    assert "".join(stream) == c.text and stream.tokens == c.tokens
    assert stream.stats.finish_reason == c.finish_reason
    assert c.text == model.detokenize(c.tokens)


def test_text_and_token_prompts_agree(fixture_model):
    model = fixture_model("llama")
    ids = model.tokenize("Same prompt")
    assert model.generate(ids, max_tokens=8, temperature=0).tokens == \
        model.generate("Same prompt", max_tokens=8, temperature=0).tokens  # fmt: skip
    special = model.tokenize("<|start_header_id|>user", parse_special=True)
    plain = model.tokenize("<|start_header_id|>user")
    assert len(special) < len(plain)
    c = model.generate("<|start_header_id|>user", max_tokens=1, parse_special=True, temperature=0)
    assert c.stats.prompt_tokens == len(special)
    c = model.generate("x", max_tokens=1, add_special=False, temperature=0)
    assert c.stats.prompt_tokens == 1


def test_logits_seen_by_the_sampler_are_the_models(fixture_model):
    model = fixture_model("qwen2")
    prompt = model.tokenize("Which logits?")
    sampler = ScriptedSampler(
        model.tokenize(" a b", add_special=False), then=model.tokenizer.eos_id
    )
    c = model.generate(prompt, max_tokens=10, sampler=sampler)
    full = model.logits(prompt + c.tokens)
    for i, seen in enumerate(sampler.seen[:-1]):
        np.testing.assert_array_equal(seen, full[len(prompt) - 1 + i])


@pytest.mark.parametrize("bad", [-1, 10**9, 2.0, "7", None, True])
def test_a_sampler_returning_no_token_id(fixture_model, bad):
    model = fixture_model("llama")
    with pytest.raises(errors.InvalidOptionError, match="sampler returned"):
        model.generate("Hi", max_tokens=5, sampler=lambda logits, history: bad)
    assert model.generate("Hi", max_tokens=2, temperature=0).stats.generated_tokens == 2
    # numpy integers are token ids too
    c = model.generate(
        "Hi", max_tokens=2, sampler=lambda logits, history: np.int64(np.argmax(logits))
    )
    assert c.tokens == model.generate("Hi", max_tokens=2, temperature=0).tokens
