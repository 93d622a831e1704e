"""Saved sessions (edgeinfer.session_state): save, then load, gives the next logits of the run
that was never interrupted, bit for bit, on both engines and every cache type, with and
without ring buffers; states for another model or other cache settings are refused, and so
are truncated and corrupt files; writes are atomic; `--prompt-cache` reuses a saved prompt."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

import edgeinfer
from edgeinfer import errors, session_state
from edgeinfer.kv_cache import WINDOW_SLACK
from tests.api.conftest import ScriptedSampler
from tests.apps.conftest import assert_one_line_error, cli
from tests.kv.texts import python_help_text

NEXT = 11  # the token every continuation is fed
# the gemma3 fixture's window of 16 keeps 16 + a slack of 32 positions (kv_cache.WINDOW_SLACK)
FIXTURE_CTX, FIXTURE_BATCH = 256, 16


def _load(path, engine, **options):
    options.setdefault("n_ctx", FIXTURE_CTX)
    options.setdefault("n_batch", FIXTURE_BATCH)
    return edgeinfer.load(path, engine=engine, **options)


def _fixture_prompt(n: int = 60) -> list[int]:
    return [1 + (7 * i) % 300 for i in range(n)]


def _run_and_save(m, prompt: list[int], path) -> tuple[list[int], np.ndarray]:
    """Greedy generation after ``prompt``, the state saved, then the uninterrupted run's logits
    after NEXT; returns the tokens cached when saving and those logits."""
    out = m.generate(prompt, max_tokens=4, temperature=0)
    cached = prompt + out.tokens  # the last generated token is decoded too
    m.save_state(path)
    return cached, m.backend.forward([NEXT])


def _assert_continues(m, path, cached: list[int], want: np.ndarray) -> None:
    """Loading ``path`` restores ``cached``; the next prompt evaluates NEXT only and sees the
    uninterrupted run's logits, bit for bit."""
    assert m.load_state(path) == len(cached)
    sampler = ScriptedSampler([NEXT])
    out = m.generate(cached + [NEXT], max_tokens=1, sampler=sampler)
    assert out.stats.cached_tokens == len(cached)
    np.testing.assert_array_equal(sampler.seen[0], want)


# (writer, reader, cache type); the gemma3 fixture's local layers keep rings on the native
# engine only, so the native engine's states hold fewer rows than the numpy engine needs
# (refused below); the numpy engine, slow to start, reads one cache type here and the others
# in test_a_state_loads_in_the_other_engine
RING_CASES = [
    *[("native", "native", kv) for kv in ("f16", "q8_0", "q4_0")],
    *[("reference", "native", kv) for kv in ("f16", "q8_0", "q4_0")],
    ("reference", "reference", "f16"),
]


@pytest.mark.parametrize(("writer", "reader", "kv"), RING_CASES)
def test_load_gives_the_uninterrupted_logits_with_rings(fixture_models, tmp_path, kv, writer,
                                                        reader):  # fmt: skip
    path = tmp_path / "s.state"
    model = fixture_models["gemma3"]
    with _load(model, writer, kv_type=kv) as m:
        if writer == "native":
            assert m.backend.layer_rows(0) == 16 + WINDOW_SLACK  # it let blocks go behind it
        cached, want = _run_and_save(m, _fixture_prompt(), path)
    with _load(model, reader, kv_type=kv) as m:
        _assert_continues(m, path, cached, want)


@pytest.mark.parametrize(("k", "v"), [("f16", "f16"), ("q8_0", "q4_0"), ("q4_0", "f32")])
@pytest.mark.parametrize("writer", ["native", "reference"])
def test_a_state_loads_in_the_other_engine(fixture_models, tmp_path, k, v, writer):
    """Without rings both engines keep every position: their rows are the same bytes."""
    path = tmp_path / "s.state"
    options = {"cache_type_k": k, "cache_type_v": v}
    reader = "reference" if writer == "native" else "native"
    with _load(fixture_models["llama"], writer, **options) as m:
        cached, want = _run_and_save(m, _fixture_prompt(40), path)
    with _load(fixture_models["llama"], reader, **options) as m:
        _assert_continues(m, path, cached, want)


def test_the_engines_save_the_same_rows(fixture_models, tmp_path):
    bodies = []
    for engine in ("native", "reference"):
        with _load(fixture_models["llama"], engine, cache_type_k="q4_0", cache_type_v="q8_0") as m:
            _run_and_save(m, _fixture_prompt(40), tmp_path / engine)
        bodies.append(session_state.read(tmp_path / engine)[1])
    assert bodies[0] == bodies[1]


@pytest.fixture(scope="module")
def gemma_state(gemma_path, tmp_path_factory):
    """The real Gemma 3 (15 local layers keeping their window of 512 and a slack of 32) after a
    750-token prompt."""
    path = tmp_path_factory.mktemp("gemma") / "gemma.state"
    with edgeinfer.load(gemma_path, engine="native", n_ctx=2048, n_batch=128) as m:
        prompt = m.tokenize(python_help_text())[:750]
        cached, want = _run_and_save(m, prompt, path)
    return path, cached, want


@pytest.mark.slow
@pytest.mark.parametrize("n_batch", [128, 64, 256])
def test_gemma_rings_restore_bit_for_bit(gemma_path, gemma_state, n_batch):
    """The local layers keep the same rows whatever the batch: the state loads at any."""
    path, cached, want = gemma_state
    assert len(cached) > 700
    with edgeinfer.load(gemma_path, engine="native", n_ctx=2048, n_batch=n_batch) as m:
        _assert_continues(m, path, cached, want)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [{"engine": "native", "swa_full": True}, {"engine": "reference"}],
)  # fmt: skip
def test_gemma_caches_keeping_more_than_the_file_are_refused(gemma_path, gemma_state, options):
    with edgeinfer.load(gemma_path, n_ctx=2048, **options) as m:
        with pytest.raises(errors.StateMismatchError, match="holds the last 544 of 754"):
            m.load_state(gemma_state[0])
        assert m.backend.n_past == 0


# --- refused states --------------------------------------------------------------------------


@pytest.fixture
def llama_state(fixture_models, tmp_path):
    path = tmp_path / "llama.state"
    with _load(fixture_models["llama"], "native", n_ctx=64) as m:
        m.generate(_fixture_prompt(20), max_tokens=2, temperature=0)
        m.save_state(path)
    return path


@pytest.mark.parametrize(
    ("model", "options", "why"),
    [
        ("qwen2", {}, "saved with model"),
        ("llama", {"cache_type_k": "q8_0"}, "cache_type_k f16; this model has q8_0"),
        ("llama", {"cache_type_v": "q4_0"}, "cache_type_v f16; this model has q4_0"),
        ("llama", {"n_ctx": 128}, "n_ctx 64; this model has 128"),
        ("llama", {"context_policy": "shift", "n_keep": 4}, "context policy error"),
    ],
)
def test_states_for_other_settings_are_refused(fixture_models, llama_state, model, options, why):
    options = {"n_ctx": 64, **options}
    with _load(fixture_models[model], "native", **options) as m:
        before = m.generate(_fixture_prompt(10), max_tokens=1, temperature=0)
        n_past = m.backend.n_past
        with pytest.raises(errors.StateMismatchError, match=why):
            m.load_state(llama_state)
        assert m.backend.n_past == n_past  # refused before anything was touched
        again = m.generate(_fixture_prompt(10), max_tokens=1, temperature=0)
        assert again.tokens == before.tokens and again.stats.cached_tokens == 9


def _damaged(data: bytes) -> list[tuple[str, bytes]]:
    n_text = struct.unpack_from("<I", data, 12)[0]
    body = 16 + n_text
    cuts = [0, 5, 16, body - 1, body + 3, len(data) // 2, len(data) - 1]
    flips = [0, 9, 13, 20, body - 5, body + 2, len(data) - 40, len(data) - 1]
    out = [(f"cut at {n}", data[:n]) for n in cuts]
    out += [
        (f"byte {i} flipped", data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1 :]) for i in flips
    ]
    return [*out, ("one byte more", data + b"\0"), ("a directory", b"")]


def test_truncated_and_corrupt_files_are_refused(fixture_models, llama_state, tmp_path):
    data = llama_state.read_bytes()
    bad = tmp_path / "bad.state"
    with _load(fixture_models["llama"], "native", n_ctx=64) as m:
        m.load_state(llama_state)  # the intact file loads
        for what, damaged in _damaged(data):
            if what == "a directory":
                bad.unlink()
                bad.mkdir()
            else:
                bad.write_bytes(damaged)
            with pytest.raises(errors.StateFileError) as caught:
                m.load_state(bad)
            assert not isinstance(caught.value, errors.StateMismatchError), what
        with pytest.raises(errors.StateFileError, match="cannot read"):
            m.load_state(tmp_path / "missing.state")


def _resealed(data: bytes, **changes) -> bytes:
    """The file with header fields changed and a valid checksum: only the checks of the
    header's own consistency stand between it and the engine."""
    n_text = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[16 : 16 + n_text])
    header.update(changes)
    text = json.dumps(header).encode()
    out = data[:12] + struct.pack("<I", len(text)) + text + data[16 + n_text : -32]
    return out + hashlib.sha256(out).digest()


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"n_past": 65, "n_history": 65}, "more than its context"),
        ({"n_past": 23}, "tokens evaluated"),
        ({"hole": 3}, "dropped run"),
        ({"kept": [64]}, "windows but 1 layers"),
        ({"k_row_bytes": 257}, "truncated"),
        ({"n_ctx": True}, "not an integer"),
        ({"extra": 1}, r"\[.extra.\] too many"),
    ],
)
def test_inconsistent_headers_are_refused(fixture_models, llama_state, tmp_path, changes, why):
    bad = tmp_path / "bad.state"
    bad.write_bytes(_resealed(llama_state.read_bytes(), **changes))
    with (
        _load(fixture_models["llama"], "native", n_ctx=64) as m,
        pytest.raises(errors.StateFileError, match=why),
    ):
        m.load_state(bad)


def test_a_failed_save_leaves_the_old_file(fixture_models, llama_state, monkeypatch):
    """An interrupt in the middle of writing (Ctrl-C) leaves neither a partial file nor a
    temporary one, and the previous state stays as it was."""
    old = llama_state.read_bytes()
    with _load(fixture_models["llama"], "native", n_ctx=64) as m:
        m.generate(_fixture_prompt(30), max_tokens=1, temperature=0)
        read_rows = m.backend.read_rows

        def interrupted(layer, *args, **kw):
            if layer == 1:
                raise KeyboardInterrupt
            return read_rows(layer, *args, **kw)

        monkeypatch.setattr(m.backend, "read_rows", interrupted)
        with pytest.raises(KeyboardInterrupt):
            m.save_state(llama_state)
    assert llama_state.read_bytes() == old
    assert [p.name for p in llama_state.parent.iterdir()] == [llama_state.name]


# --- the CLI ---------------------------------------------------------------------------------


def test_prompt_cache_reuses_the_saved_prompt(fixture_models, tmp_path):
    cache = tmp_path / "prompt.state"
    args = ("run", fixture_models["llama"], "-p", "Once upon a time there was a small model",
            "-n", "4", "--temp", "0", "--engine", "native", "--prompt-cache", cache)  # fmt: skip
    first, second = cli(*args), cli(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "cached" not in first.stderr and cache.exists()
    n_prompt = int(first.stderr.split("prompt ")[1].split(" tok")[0])
    assert f"prompt {n_prompt} tok ({n_prompt - 1} cached)" in second.stderr
    assert second.stdout == first.stdout
    other = cli(*args, "-ctk", "q8_0")
    assert "cache_type_k f16; this model has q8_0" in assert_one_line_error(other)
    cache.write_bytes(cache.read_bytes()[:-1])
    assert "truncated" in assert_one_line_error(cli(*args))


def test_prompt_cache_with_a_kivi_cache(fixture_models, tmp_path):
    """A prompt long enough to quantize groups (R 0, G 32): the second run reads them back."""
    cache = tmp_path / "prompt.state"
    prompt = " ".join(["Once upon a time there was a small model that read"] * 12)
    args = ("run", fixture_models["llama"], "-p", prompt, "-n", "4", "--temp", "0",
            "-ctk", "kivi4", "-ctv", "kivi4", "--kivi-residual", "0", "--prompt-cache",
            cache)  # fmt: skip
    first, second = cli(*args), cli(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert session_state.read(cache)[0].n_groups >= 2
    n_prompt = int(first.stderr.split("prompt ")[1].split(" tok")[0])
    assert f"prompt {n_prompt} tok ({n_prompt - 1} cached)" in second.stderr
    assert second.stdout == first.stdout
    other = cli(*args[:-2], "--kivi-group", "64", *args[-2:])
    assert "kivi_group 32; this model has 64" in assert_one_line_error(other)


def test_chat_saves_its_prompt_cache_at_the_end(fixture_models, tmp_path):
    cache = tmp_path / "chat.state"
    args = ("chat", fixture_models["llama"], "-s", "You are a terse assistant.", "-n", "3",
            "--temp", "0", "--engine", "native", "--prompt-cache", cache)  # fmt: skip
    first = cli(*args, input="Hello\n")
    assert first.returncode == 0 and "cached" not in first.stderr, first.stderr
    second = cli(*args, input="Hello again\n")
    assert second.returncode == 0 and " cached)" in second.stderr, second.stderr


@pytest.mark.parametrize("kv", ["f16", "q4_0"])
@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_state_past_the_context_keeps_its_dropped_run(fixture_models, tmp_path, engine, kv):
    """Under streaming, positions were dropped behind the sinks: the restored session knows
    the run, so the next turn (the whole history and more) still evaluates only what is new.
    q4_0 keys moved as they were: the file keeps their shifts (simd/common/key_shifts.h)."""
    path = tmp_path / "s.state"
    options = {"n_ctx": 64, "context_policy": "streaming", "n_sink": 4, "kv_type": kv}
    prompt = _fixture_prompt(40)
    with _load(fixture_models["llama"], engine, **options) as m:
        out = m.generate(prompt, max_tokens=40, temperature=0)
        history = prompt + out.tokens
        n_past = m.backend.n_past
        assert len(history) > 64 and n_past < len(history) - 4
        shifts = m.backend.key_shifts()
        assert shifts.any() == (kv == "q4_0")
        m.save_state(path)
        sampler = ScriptedSampler([NEXT])
        m.generate(history + [NEXT], max_tokens=1, sampler=sampler)
    with _load(fixture_models["llama"], "native", **options) as m:
        assert m.load_state(path) == n_past
        again = ScriptedSampler([NEXT])
        assert m.backend.key_shifts().tolist() == shifts.tolist()
        restored = m.generate(history + [NEXT], max_tokens=1, sampler=again)
        assert restored.stats.cached_tokens == len(history)
    np.testing.assert_array_equal(again.seen[0], sampler.seen[0])


def _shifted_state(fixture_models, tmp_path, kv: str = "q4_0"):
    """A state of the llama fixture past its context under streaming, and its options."""
    path = tmp_path / f"{kv}.state"
    options = {"n_ctx": 64, "context_policy": "streaming", "n_sink": 4, "kv_type": kv}
    with _load(fixture_models["llama"], "native", **options) as m:
        m.generate(_fixture_prompt(40), max_tokens=40, temperature=0)
        m.save_state(path)
    return path, options


def _shifts_span(data: bytes) -> tuple[int, int]:
    """Where a state file's key shifts lie: (first byte, end)."""
    n_text = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[16 : 16 + n_text])
    at = 16 + n_text + 4 * header["n_history"]
    return at, at + 4 * header["n_past"]


def _with_shifts(data: bytes, change) -> bytes:
    """The file with its key shifts changed by ``change`` (in place on an int32 array) and
    its checksum made good again."""
    at, end = _shifts_span(data)
    shifts = np.frombuffer(data, "<i4", (end - at) // 4, at).copy()
    change(shifts)
    out = data[:at] + shifts.tobytes() + data[end:-32]
    return out + hashlib.sha256(out).digest()


def _set(index: int, value: int):
    def change(shifts: np.ndarray) -> None:
        shifts[index] = value

    return change


@pytest.mark.parametrize(
    ("kv", "change", "why"),
    [
        ("q4_0", _set(-1, 64), "rotated 64 positions ahead"),
        ("q4_0", _set(0, -2), "rotated -2 positions ahead"),
        ("f16", _set(5, 1), "shifted keys, but its f16 key cache rotates"),
    ],
)
def test_impossible_key_shifts_are_refused(fixture_models, tmp_path, kv, change, why):
    path, options = _shifted_state(fixture_models, tmp_path, kv)
    bad = tmp_path / "bad.state"
    bad.write_bytes(_with_shifts(path.read_bytes(), change))
    with _load(fixture_models["llama"], "native", **options) as m:
        with pytest.raises(errors.StateFileError, match=why):
            m.load_state(bad)
        assert m.backend.n_past == 0


def test_a_version_2_state_loads_with_unshifted_keys(fixture_models, llama_state, tmp_path):
    """Version 2 files (before the key shifts) hold keys rotated where they are."""
    data = llama_state.read_bytes()
    at, end = _shifts_span(data)
    old = struct.pack("<8sI", session_state.MAGIC, 2) + data[12:at] + data[end:-32]
    path = tmp_path / "v2.state"
    path.write_bytes(old + hashlib.sha256(old).digest())
    with _load(fixture_models["llama"], "native", n_ctx=64) as m:
        want = _load_and_next(m, llama_state)
        assert _load_and_next(m, path).tolist() == want.tolist()
        assert not m.backend.key_shifts().any()
    future = struct.pack("<8sI", session_state.MAGIC, 5) + data[12:-32]
    path.write_bytes(future + hashlib.sha256(future).digest())
    with (
        _load(fixture_models["llama"], "native", n_ctx=64) as m,
        pytest.raises(errors.StateFileError, match="version 5; this edgeinfer reads versions 2, 3"),
    ):
        m.load_state(path)


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_an_older_state_of_quantized_rows_is_refused(fixture_models, tmp_path, engine):
    """Before version 4, q8_0 / q4_0 rows were stored unrotated: such a file's rows are not
    what this cache holds (Walsh-Hadamard rotated), so it is refused, and the sequence is left
    empty; the same file as version 4 loads."""
    path, options = _shifted_state(fixture_models, tmp_path, "q4_0")
    data = path.read_bytes()
    n_text = struct.unpack_from("<I", data, 12)[0]
    for version in (2, 3):
        body = data[16:-32] if version == 3 else _without_shifts(data)
        old = struct.pack("<8sII", session_state.MAGIC, version, n_text) + body
        bad = tmp_path / f"v{version}.state"
        bad.write_bytes(old + hashlib.sha256(old).digest())
        with _load(fixture_models["llama"], engine, **options) as m:
            why = f"version {version} holds q4_0/q4_0 rows unrotated"
            with pytest.raises(errors.StateFileError, match=why):
                m.load_state(bad)
            assert m.backend.n_past == 0
            m.load_state(path)
            assert m.backend.n_past > 0


def _without_shifts(data: bytes) -> bytes:
    """The body of a state file (after its prefix, before its checksum) without its shifts."""
    at, end = _shifts_span(data)
    return data[16:at] + data[end:-32]


def _load_and_next(m, path) -> np.ndarray:
    m.load_state(path)
    return m.backend.forward([NEXT])


def test_the_native_rows_call_refuses_what_the_layer_does_not_hold(fixture_models):
    """The C entry points return statuses for impossible requests (and never touch memory)."""
    from edgeinfer import _native

    lib = _native.library()
    with _load(fixture_models["gemma3"], "native") as m:  # layer 0 keeps 16 + 32 positions
        handle = m.backend._handle
        assert (
            lib.ei_engine_layer_rows(handle, 0) == 48 and lib.ei_engine_layer_rows(handle, 6) == -1
        )
        assert lib.ei_engine_row_bytes(handle, None, None) == 1
        buf = np.zeros(64 * 256, dtype=np.uint8)
        ptr = buf.ctypes.data
        assert lib.ei_engine_seq_rows(handle, 0, 0, 0, 1, ptr, ptr, 0) == 1  # no cache yet
        for seq, layer, pos0, n in [(1, 0, 0, 1), (0, 6, 0, 1), (0, 0, -1, 1), (0, 0, 0, 49),
                                    (0, 5, FIXTURE_CTX - 1, 2), (0, 0, 0, -1)]:  # fmt: skip
            assert lib.ei_engine_seq_rows(handle, seq, layer, pos0, n, ptr, ptr, 1) == 1
        m.generate(_fixture_prompt(100), max_tokens=1, temperature=0)
        with pytest.raises(errors.InvalidOptionError, match=r"holds positions \[53, 101\)"):
            m.backend.read_rows(0, 52, 4)  # older than the window's blocks hold
        assert len(m.backend.read_rows(0, 53, 48)[0]) == 48 * m.backend.cache_row_bytes()[0]


# --- KIVI caches: the quantized groups and the f16 residual ----------------------------------

# (fixture, options, prompt length): gemma3's local layers (window 16 > R 8) keep a ring of
# quantized groups and of residual rows on the native engine; llama's layers keep every group
KIVI_CASES = {
    "gemma3 kivi4 G32 R8": ("gemma3", {"kv_type": "kivi4", "kivi_group": 32, "kivi_residual": 8},
                            110),
    "llama kivi2 G64 R0": ("llama", {"kv_type": "kivi2", "kivi_group": 64, "kivi_residual": 0},
                           150),
    "llama kivi4 G32 R40": ("llama", {"kv_type": "kivi4", "kivi_residual": 40}, 120),
}  # fmt: skip


@pytest.mark.parametrize(
    ("writer", "reader"),
    [("native", "native"), ("reference", "native"), ("native", "reference")],
)
@pytest.mark.parametrize("case", list(KIVI_CASES))
def test_kivi_states_continue_bit_for_bit(fixture_models, tmp_path, case, writer, reader):
    """The groups are saved as quantized (not made again from rows the residual no longer
    holds), so the next queries read the bits they would have read."""
    arch, options, n_prompt = KIVI_CASES[case]
    path = tmp_path / "s.state"
    with _load(fixture_models[arch], writer, **options) as m:
        cached, want = _run_and_save(m, _fixture_prompt(n_prompt), path)
        n_groups = m.backend.quantized_groups()
    group, residual = options.get("kivi_group", 32), options["kivi_residual"]
    assert n_groups == (len(cached) - residual) // group >= 2
    header = session_state.read(path)[0]
    assert (header.kivi_group, header.kivi_residual, header.n_groups) == (group, residual, n_groups)
    with _load(fixture_models[arch], reader, **options) as m:
        if (arch, writer, reader) == ("gemma3", "native", "reference"):
            # the native rings hold none of the groups behind the window; numpy keeps them all
            with pytest.raises(errors.StateMismatchError, match="last 0 of 3 KIVI groups"):
                m.load_state(path)
            return
        _assert_continues(m, path, cached, want)
        assert m.backend.quantized_groups() == n_groups
        if reader != "native":
            return
        # and goes on: later groups are made from the restored residual
        sampler = ScriptedSampler([NEXT] * 40)
        m.generate(cached + [NEXT], max_tokens=40, sampler=sampler)
        assert m.backend.quantized_groups() > n_groups
    with _load(fixture_models[arch], "reference", **options) as m:
        sampler_ref = ScriptedSampler([NEXT] * 40)
        m.generate(cached + [NEXT], max_tokens=40, sampler=sampler_ref)
    np.testing.assert_array_equal(np.array(sampler.seen), np.array(sampler_ref.seen))


def test_the_engines_save_the_same_kivi_groups(fixture_models, tmp_path):
    bodies = []
    arch, options, n_prompt = KIVI_CASES["gemma3 kivi4 G32 R8"]
    for engine in ("native", "reference"):
        with _load(fixture_models[arch], engine, swa_full=engine == "native", **options) as m:
            _run_and_save(m, _fixture_prompt(n_prompt), tmp_path / engine)
        bodies.append(session_state.read(tmp_path / engine))
    (native, body_n), (ref, body_r) = bodies
    assert native.n_groups == ref.n_groups >= 2 and native.group_k_bytes == ref.group_k_bytes
    # every layer keeps its groups whole in both; the residual is a ring on the native engine
    groups_at = 4 * native.n_history + sum(
        native.held(il) * (native.k_row_bytes + native.v_row_bytes) for il in range(6)
    )
    groups_ref = 4 * ref.n_history + sum(
        ref.held(il) * (ref.k_row_bytes + ref.v_row_bytes) for il in range(6)
    )
    assert body_n[groups_at:] == body_r[groups_ref:] and len(body_n) > groups_at


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_kivi_state_past_the_context(fixture_models, tmp_path, engine):
    """Under streaming the groups were made again from the moved rows: the restored cache
    holds those, and the next turn evaluates only what is new."""
    path = tmp_path / "s.state"
    options = {"n_ctx": 128, "context_policy": "streaming", "kv_type": "kivi4",
               "kivi_residual": 16}  # fmt: skip
    prompt = _fixture_prompt(100)
    with _load(fixture_models["llama"], engine, **options) as m:
        out = m.generate(prompt, max_tokens=60, temperature=0)
        history = prompt + out.tokens
        assert m.backend.n_past < len(history) - 4 and m.backend.quantized_groups() >= 2
        m.save_state(path)
        sampler = ScriptedSampler([NEXT])
        m.generate(history + [NEXT], max_tokens=1, sampler=sampler)
    with _load(fixture_models["llama"], "native", **options) as m:
        m.load_state(path)
        again = ScriptedSampler([NEXT])
        restored = m.generate(history + [NEXT], max_tokens=1, sampler=again)
        assert restored.stats.cached_tokens == len(history)
    np.testing.assert_array_equal(again.seen[0], sampler.seen[0])


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"kv_type": "kivi4", "kivi_residual": 16}, "kivi_residual 40; this model has 16"),
        ({"kv_type": "kivi4", "kivi_residual": 40, "kivi_group": 64}, "kivi_group 32"),
        ({"kv_type": "kivi2", "kivi_residual": 40}, "cache_type_k kivi4; this model has kivi2"),
        ({"kv_type": "f16"}, "cache_type_k kivi4; this model has f16"),
    ],
)
def test_kivi_states_for_other_settings_are_refused(fixture_models, tmp_path, options, why):
    path = tmp_path / "s.state"
    with _load(fixture_models["llama"], "native", kv_type="kivi4", kivi_residual=40) as m:
        _run_and_save(m, _fixture_prompt(120), path)
    with _load(fixture_models["llama"], "native", **options) as m:
        with pytest.raises(errors.StateMismatchError, match=why):
            m.load_state(path)
        assert m.backend.n_past == 0


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"n_groups": 40}, "beyond the"),
        ({"kivi_group": 48}, "KIVI groups of 48"),
        ({"group_kept": [0]}, "layers of groups"),
        ({"kivi_group": 0}, "KIVI groups in a cache of rows"),
        ({"group_k_bytes": 7}, "truncated|longer"),
    ],
)
def test_inconsistent_kivi_headers_are_refused(fixture_models, tmp_path, changes, why):
    path, bad = tmp_path / "s.state", tmp_path / "bad.state"
    with _load(fixture_models["llama"], "native", kv_type="kivi4", kivi_residual=40) as m:
        _run_and_save(m, _fixture_prompt(120), path)
        bad.write_bytes(_resealed(path.read_bytes(), **changes))
        with pytest.raises(errors.StateFileError, match=why):
            m.load_state(bad)


def test_the_native_groups_call_refuses_what_it_does_not_hold(fixture_models):
    from edgeinfer import _native

    lib = _native.library()
    with _load(fixture_models["gemma3"], "native", kv_type="kivi4", kivi_residual=8) as m:
        handle, buf = m.backend._handle, np.zeros(1 << 16, dtype=np.uint8)
        ptr = buf.ctypes.data
        local, full = lib.ei_engine_layer_groups(handle, 0), lib.ei_engine_layer_groups(handle, 5)
        assert 0 < local < full == FIXTURE_CTX and lib.ei_engine_layer_groups(handle, 6) == -1
        assert lib.ei_engine_seq_groups(handle, 0, 0, 0, 1, ptr, ptr, 0) == 1  # nothing held
        for seq, layer, g0, n in [(1, 0, 0, 1), (0, 6, 0, 1), (0, 0, -1, 1), (0, 0, 7, 2),
                                  (0, 0, 0, -1)]:  # fmt: skip
            assert lib.ei_engine_seq_groups(handle, seq, layer, g0, n, ptr, ptr, 1) == 1
    with _load(fixture_models["llama"], "native", kv_type="f16") as m:
        assert lib.ei_engine_seq_groups(m.backend._handle, 0, 0, 0, 1, ptr, ptr, 0) == 1
        with pytest.raises(errors.InvalidOptionError, match="not KIVI groups"):
            m.backend.group_bytes()
