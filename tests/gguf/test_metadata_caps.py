"""Each metadata value is capped by what its key can hold, and all of them by one budget, before
anything is copied: a hostile file whose bytes are really there still fails fast and small."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from edgeinfer import errors
from edgeinfer.gguf import GGUFFile, reader
from tests.gguf.craft import ARRAY, F32, I32, STRING, tiny_llama_spec

ROOT = Path(__file__).resolve().parents[2]


def _sparse_file(path: Path, head: bytes, size: int) -> Path:
    """``head`` followed by zeros up to ``size`` bytes: the bytes are there, the disk is not."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def _announcing(key: bytes, length: int) -> bytes:
    """The tiny model cut just after the length field of ``key``'s string value."""
    blob = tiny_llama_spec().build()
    at = blob.index(key) + len(key) + 4
    return blob[:at] + struct.pack("<Q", length)


def _array_announcing(key: str, etype: int, count: int) -> bytes:
    spec = tiny_llama_spec()
    spec.kv = [(k, t, v) for k, t, v in spec.kv if k != key]
    spec.n_kv = len(spec.kv) + 1
    head = spec.build()
    head = head[: head.index(b"tokenizer.ggml.unknown_token_id") + 31 + 4 + 4]
    return (
        head + struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IIQ", ARRAY, etype, count)
    )


def _refused(path: Path, *words: str) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(errors.AbsurdValueError) as e:
            GGUFFile(path)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 16 << 20, f"allocated {peak >> 20} MB before refusing"
    for word in words:
        assert word in str(e.value), str(e.value)
    return str(e.value)


def test_a_name_of_many_mib_is_refused_before_it_is_copied(tmp_path):
    length = reader.MAX_STRING_BYTES + 1
    head = _announcing(b"general.name", length)
    path = _sparse_file(tmp_path / "name.gguf", head, len(head) + length + 4096)
    _refused(path, "'general.name'", str(length), f"limit {reader.MAX_STRING_BYTES}")


def test_a_real_chat_template_fits(tmp_path):
    spec = tiny_llama_spec()
    template = "{% for m in messages %}{{ m.content }}{% endfor %}" * 20_000  # 1 MiB
    spec.add("tokenizer.chat_template", STRING, template)
    path = tmp_path / "template.gguf"
    path.write_bytes(spec.build())
    with GGUFFile(path) as f:
        assert f.metadata["tokenizer.chat_template"] == template


@pytest.mark.parametrize(
    ("key", "etype", "cap"),
    [
        ("tokenizer.ggml.tokens", STRING, reader.MAX_VOCAB),
        ("tokenizer.ggml.scores", F32, reader.MAX_VOCAB),
        ("tokenizer.ggml.token_type", I32, reader.MAX_VOCAB),
        ("tokenizer.ggml.merges", STRING, reader.MAX_VOCAB),
        ("general.tags", STRING, reader.MAX_ARRAY_ELEMENTS),
        ("llama.feed_forward_length", I32, reader.MAX_ARRAY_ELEMENTS),
    ],
)
def test_arrays_are_capped_by_their_key(tmp_path, key, etype, cap):
    head = _array_announcing(key, etype, cap + 1)
    path = _sparse_file(tmp_path / "array.gguf", head, len(head) + (cap + 1) * 8 + 4096)
    _refused(path, repr(key), str(cap + 1), f"limit {cap}")


def test_a_token_string_is_capped_like_any_string(tmp_path):
    spec = tiny_llama_spec()
    spec.kv = [(k, t, v) for k, t, v in spec.kv if k != "tokenizer.ggml.tokens"]
    spec.n_kv = len(spec.kv) + 1
    head = spec.build()
    head = head[: head.index(b"tokenizer.ggml.unknown_token_id") + 31 + 4 + 4]
    key = b"tokenizer.ggml.tokens"
    head += struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", ARRAY, STRING, 2)
    head += struct.pack("<Q", 1) + b"a" + struct.pack("<Q", reader.MAX_STRING_BYTES + 1)
    path = _sparse_file(tmp_path / "token.gguf", head, len(head) + (8 << 20))
    _refused(path, "a string of 'tokenizer.ggml.tokens'", f"limit {reader.MAX_STRING_BYTES}")


def test_all_values_together_stay_within_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "MAX_METADATA_BYTES", 1 << 20)
    spec = tiny_llama_spec()
    for i in range(3):  # each below its own cap, together past the budget
        spec.add(f"general.note{i}", STRING, "x" * (400 << 10))
    path = tmp_path / "budget.gguf"
    path.write_bytes(spec.build())
    _refused(path, "'general.note2'", "past its limit of 1048576 bytes")


_HOSTILE_NAME = """
import json, os, resource, sys
import edgeinfer
from edgeinfer import errors
from edgeinfer.gguf import GGUFFile
from edgeinfer.models import config_from_gguf
def vm_size():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
path = sys.argv[1]
# room for mapping the file and 1 GiB more: the 1.5 GB copy of the name cannot fit
limit = vm_size() + os.path.getsize(path) + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    config_from_gguf(GGUFFile(path))
    outcome = "loaded"
except errors.AbsurdValueError as e:
    outcome = "AbsurdValueError: " + str(e)
except MemoryError as e:
    outcome = "MemoryError: " + repr(e)
# VmHWM, not ru_maxrss: the latter carries the forking parent's peak across exec
with open("/proc/self/status") as f:
    peak = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
print(json.dumps({"outcome": outcome, "peak_rss": peak}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc")
def test_hostile_name_under_a_memory_limit(tmp_path):
    length = 1_500_000_000  # the bytes are there: a sparse file of 1.5 GB
    head = _announcing(b"general.name", length)
    path = _sparse_file(tmp_path / "hostile.gguf", head, len(head) + length + (1 << 20))
    run = subprocess.run(
        [sys.executable, "-c", _HOSTILE_NAME, str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["outcome"].startswith("AbsurdValueError"), result
    assert "'general.name'" in result["outcome"] and str(length) in result["outcome"]
    assert result["peak_rss"] < 400 << 20, result  # far below the 1.5 GB announced
