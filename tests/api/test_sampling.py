"""The sampler chain on hand-made logits: each step against llama.cpp's own sampler and
against the analytic distribution, and the draws against that distribution."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from edgeinfer import errors
from edgeinfer.sampling import Sampler, SamplingParams

OFF = dict(top_k=0, top_p=1.0, min_p=0.0)  # every filter off


def sampler(**options) -> Sampler:
    return Sampler(SamplingParams(**{"temperature": 1.0, **OFF, "seed": 0, **options}))


def softmax(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def as_dict(ids: np.ndarray, probs: np.ndarray) -> dict[int, float]:
    return {int(i): float(p) for i, p in zip(ids, probs, strict=True)}


def assert_draws_follow(
    s: Sampler, logits, history, expected: dict[int, float], n: int = 20000
) -> None:
    """Empirical frequencies of ``n`` draws against ``expected``: every token within 5
    standard deviations of its binomial count, and no token drawn outside the support."""
    counts: dict[int, int] = {}
    for _ in range(n):
        t = s(logits, history)
        counts[t] = counts.get(t, 0) + 1
    assert set(counts) <= set(expected), (counts, expected)
    for token, p in expected.items():
        sd = math.sqrt(n * p * (1 - p)) + 1
        assert abs(counts.get(token, 0) - n * p) <= 5 * sd, (token, counts.get(token, 0), n * p)


LOGITS = np.array([1.0, -2.0, 3.0, 0.5, 2.0, -0.5, 2.5, 0.0], dtype=np.float32)


# --- each step, analytically -----------------------------------------------------------------


def test_greedy_is_the_argmax_and_draws_nothing():
    s = sampler(temperature=0.0)
    assert s(LOGITS, []) == 2
    state = s.rng.bit_generator.state
    s(LOGITS, [])
    assert s.rng.bit_generator.state == state


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature(temperature):
    s = sampler(temperature=temperature)
    expected = dict(enumerate(softmax(LOGITS / temperature)))
    got = as_dict(*s.distribution(LOGITS, []))
    assert got.keys() == expected.keys()
    for token, p in expected.items():
        assert got[token] == pytest.approx(p, rel=1e-9)
    assert_draws_follow(s, LOGITS, [], expected)


def test_tiny_temperature_is_nearly_greedy_without_overflow():
    s = sampler(temperature=1e-30)
    ids, probs = s.distribution(LOGITS * 1e6, [])
    assert np.isfinite(probs).all() and probs[0] == 1.0 and ids[0] == 2
    assert s(LOGITS, []) == 2


def test_top_k():
    s = sampler(top_k=3, temperature=1.5)
    kept = [2, 6, 4]  # the three largest logits
    expected = dict(zip(kept, softmax(LOGITS[kept] / 1.5), strict=True))
    assert as_dict(*s.distribution(LOGITS, [])) == pytest.approx(expected)
    assert_draws_follow(s, LOGITS, [], expected)
    assert sampler(top_k=1)(LOGITS, []) == 2
    # k larger than the vocabulary keeps everything
    assert len(sampler(top_k=1000).distribution(LOGITS, [])[0]) == len(LOGITS)


PROBS = np.array([0.5, 0.3, 0.15, 0.05])  # logits log(p): softmax gives p back


@pytest.mark.parametrize("top_p, kept", [(0.4, 1), (0.75, 2), (0.85, 3), (0.96, 4), (1.0, 4)])
def test_top_p(top_p, kept):
    s = sampler(top_p=top_p)
    logits = np.log(PROBS).astype(np.float32)
    ids, probs = s.distribution(logits, [])
    assert list(ids) == list(range(kept))
    expected = PROBS[:kept] / PROBS[:kept].sum()
    np.testing.assert_allclose(probs, expected, rtol=1e-6)
    if kept > 1:
        assert_draws_follow(s, logits, [], dict(enumerate(expected)))


@pytest.mark.parametrize("min_p, kept", [(0.05, 4), (0.2, 3), (0.5, 2), (0.7, 1), (1.0, 1)])
def test_min_p(min_p, kept):
    s = sampler(min_p=min_p)
    logits = np.log(PROBS).astype(np.float32)
    ids, probs = s.distribution(logits, [])
    assert list(ids) == list(range(kept))
    np.testing.assert_allclose(probs, PROBS[:kept] / PROBS[:kept].sum(), rtol=1e-6)


def test_filters_see_untempered_probabilities():
    """llama.cpp's order: top-p and min-p decide on the plain softmax, temperature comes last."""
    logits = np.log(PROBS).astype(np.float32)
    s = sampler(top_p=0.75, temperature=3.0)
    ids, probs = s.distribution(logits, [])
    assert list(ids) == [0, 1]  # a hot softmax would have needed three tokens for 0.75
    expected = softmax(np.log(PROBS[:2]) / 3.0)
    np.testing.assert_allclose(probs, expected, rtol=1e-6)
    assert_draws_follow(s, logits, [], dict(enumerate(expected)))


def test_repeat_penalty():
    s = sampler(repeat_penalty=2.0, temperature=0.0)
    history = [0, 1, 1, 2]
    out = s._penalize(LOGITS, history)
    expected = LOGITS.copy()
    expected[0] = 1.0 / 2  # positive logits are divided
    expected[1] = -2.0 * 2  # negative ones multiplied, once however often seen
    expected[2] = 3.0 / 2
    np.testing.assert_array_equal(out, expected)
    # the penalty changes the greedy choice: 2 fell to 1.5, 6 (2.5) now leads
    assert s(LOGITS, history) == 6


def test_presence_and_frequency_penalties():
    s = sampler(presence_penalty=0.5, frequency_penalty=0.25)
    history = [4, 4, 4, 6, 3]
    out = s._penalize(LOGITS, history)
    expected = LOGITS.astype(np.float64)
    expected[4] -= 3 * 0.25 + 0.5
    expected[6] -= 1 * 0.25 + 0.5
    expected[3] -= 1 * 0.25 + 0.5
    np.testing.assert_allclose(out, expected, rtol=1e-7)
    assert_draws_follow(s, LOGITS, history, dict(enumerate(softmax(expected))))


@pytest.mark.parametrize(
    "last_n, penalized", [(0, set()), (2, {3, 6}), (3, {3, 4, 6}), (-1, {0, 3, 4, 6})]
)
def test_penalty_window(last_n, penalized):
    s = sampler(repeat_penalty=4.0, repeat_last_n=last_n)
    history = [0, 4, 6, 3]
    out = s._penalize(LOGITS, history)
    changed = {i for i in range(len(LOGITS)) if out[i] != LOGITS[i]}
    assert changed == penalized


def test_penalties_ignore_ids_outside_the_logits():
    s = sampler(repeat_penalty=2.0, presence_penalty=1.0)
    out = s._penalize(LOGITS, [-1, len(LOGITS), 10**6])
    np.testing.assert_array_equal(out, LOGITS)


def test_the_input_logits_are_not_modified():
    logits = LOGITS.copy()
    sampler(repeat_penalty=3.0, frequency_penalty=1.0)(logits, [0, 1, 2, 3])
    np.testing.assert_array_equal(logits, LOGITS)


# --- seeds -----------------------------------------------------------------------------------


def test_same_seed_same_draws_other_seed_other_draws():
    logits = np.zeros(1000, dtype=np.float32)
    a = sampler(seed=7)
    b = sampler(seed=7)
    c = sampler(seed=8)
    seq_a = [a(logits, []) for _ in range(50)]
    assert seq_a == [b(logits, []) for _ in range(50)]
    assert seq_a != [c(logits, []) for _ in range(50)]
    # no seed: fresh randomness each time
    assert [sampler(seed=None)(logits, []) for _ in range(50)] != [
        sampler(seed=None)(logits, []) for _ in range(50)
    ]


# --- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        dict(top_p=0.0), dict(top_p=1.01), dict(min_p=1.5), dict(min_p=-1e-9), dict(top_k=-1),
        dict(repeat_penalty=0.0), dict(repeat_penalty=-1.0), dict(repeat_last_n=-5),
        dict(temperature=math.nan), dict(frequency_penalty=math.inf), dict(seed=-1),
        dict(seed=2**64), dict(temperature="0.5"), dict(top_k=3.0), dict(seed=True),
        dict(top_p=None), dict(temperature=-1.0), dict(temperature=-1e-30),
    ],
)  # fmt: skip
def test_invalid_params(options):
    with pytest.raises(errors.InvalidOptionError):
        SamplingParams(**options)


def test_numpy_numbers_are_accepted():
    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(5), seed=np.uint64(3))
    assert (p.temperature, p.top_k, p.seed) == (0.5, 5, 3)
    assert type(p.top_k) is int


# --- against llama.cpp's samplers ------------------------------------------------------------


def _llama_cpp_chain(
    logits: np.ndarray, history: list[int], p: SamplingParams
) -> tuple[list[int], np.ndarray]:
    """Candidates and probabilities after llama.cpp's penalties, top-k, top-p, min-p, temp."""
    import llama_cpp as L

    n = len(logits)
    data = (L.llama_token_data * n)()
    for i, v in enumerate(logits):
        data[i].id, data[i].logit, data[i].p = i, float(v), 0.0
    array = L.llama_token_data_array(
        data=ctypes.cast(data, ctypes.POINTER(L.llama_token_data)),
        size=n,
        selected=-1,
        sorted=False,
    )
    last_n = len(history) if p.repeat_last_n == -1 else p.repeat_last_n
    steps = [
        L.llama_sampler_init_penalties(
            n, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
        ),
        L.llama_sampler_init_top_k(p.top_k),
        L.llama_sampler_init_top_p(p.top_p, 0),
        L.llama_sampler_init_min_p(p.min_p, 0),
        L.llama_sampler_init_temp(p.temperature),
    ]
    for t in history:
        L.llama_sampler_accept(steps[0], t)
    for step in steps:
        L.llama_sampler_apply(step, ctypes.byref(array))
        L.llama_sampler_free(step)
    kept = sorted(
        ((array.data[i].logit, array.data[i].id) for i in range(array.size)), reverse=True
    )
    return [t for _, t in kept], softmax([v for v, _ in kept])


def test_llama_cpp_penalties_binding_as_used_here():
    """The binding's argument order (n_vocab first), checked on a case worked out by hand."""
    p = SamplingParams(temperature=1.0, **OFF, repeat_penalty=2.0, repeat_last_n=64,
                       frequency_penalty=0.5, presence_penalty=0.25)  # fmt: skip
    ids, probs = _llama_cpp_chain(LOGITS[:5], [0, 1, 1, 4], p)
    expected = LOGITS[:5].astype(np.float64)
    expected[0] = 1.0 / 2 - 0.5 - 0.25
    expected[1] = -2.0 * 2 - 1.0 - 0.25
    expected[4] = 2.0 / 2 - 0.5 - 0.25
    assert as_dict(np.array(ids), probs) == pytest.approx(
        dict(enumerate(softmax(expected))), rel=1e-6
    )


def _random_case(rng: np.random.Generator) -> tuple[np.ndarray, list[int], SamplingParams]:
    n = int(rng.integers(2, 300))
    logits = (rng.standard_normal(n) * rng.uniform(0.5, 4)).astype(np.float32)
    history = rng.integers(0, n, size=int(rng.integers(0, 40))).tolist()
    params = SamplingParams(
        temperature=float(rng.choice([0.3, 0.8, 1.0, 1.7])),
        top_k=int(rng.choice([0, 1, 5, 40, 1000])),
        top_p=float(rng.choice([1.0, 0.95, 0.7, 0.3])),
        min_p=float(rng.choice([0.0, 0.05, 0.2])),
        repeat_penalty=float(rng.choice([1.0, 1.1, 1.5])),
        repeat_last_n=int(rng.choice([-1, 0, 8, 64])),
        presence_penalty=float(rng.choice([0.0, 0.3])),
        frequency_penalty=float(rng.choice([0.0, 0.2])),
    )
    return logits, history, params


def test_whole_chain_matches_llama_cpp_on_random_cases():
    rng = np.random.default_rng(1234)
    for case in range(300):
        logits, history, params = _random_case(rng)
        ids, probs = Sampler(params).distribution(logits, history)
        ref_ids, ref_probs = _llama_cpp_chain(logits, history, params)
        assert list(ids) == ref_ids, (case, params)
        np.testing.assert_allclose(
            probs, ref_probs, rtol=1e-4, atol=1e-7, err_msg=str((case, params))
        )


def test_draws_follow_the_chain_on_a_random_case():
    rng = np.random.default_rng(99)
    logits, history, _ = _random_case(rng)
    params = SamplingParams(temperature=0.9, top_k=8, top_p=0.9, min_p=0.02, repeat_penalty=1.3,
                            presence_penalty=0.2, seed=5)  # fmt: skip
    s = Sampler(params)
    ids, probs = s.distribution(logits, history)
    assert len(ids) > 2
    assert_draws_follow(s, logits, history, as_dict(ids, probs))
