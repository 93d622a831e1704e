"""Fuzz target: the converters' Hugging Face folder reader, as ``edgeinfer convert`` opens one.

Each input picks one of the tiny fixture checkpoints (tests/converters/checkpoints.py, one per
architecture, made smaller still) and edits its files: replaces one with fuzzed bytes, patches
bytes into one, truncates or deletes one, or creates one the folder lacks (an index, a
tokenizer.model next to a tokenizer.json, a chat template). The folder is then opened the way
``edgeinfer convert`` opens it, up to writing: config, architecture, tensor headers and shapes,
vocabulary, the plan of types and the GGUF layout of the metadata.

An input, read with :class:`atheris.FuzzedDataProvider`: one byte choosing the checkpoint,
then up to :data:`MAX_EDITS` edits, each one byte ``kind << 5 | file`` followed by its
arguments (little-endian): replace ``u32 length, bytes``; patch ``u32 offset, u16 length,
bytes``; truncate ``u32 length``; delete nothing; set a JSON value (kinds 4 to 7) ``u16 object,
u8 key, u8 value`` (a value past :data:`JSON_VALUES`: ``u8 length, JSON text``). Seeds are
each checkpoint as it is and each with one of its files "replaced" by itself, so that
mutations start from real files.

    python -m tests.fuzz.fuzz_hf_folder --runs 1000000 --corpus DIR --artifacts DIR
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import atheris

with atheris.instrument_imports(include=["edgeinfer"]):
    from edgeinfer.converters.convert import Conversion, ConvertOptions

from tests.converters.checkpoints import SPECS
from tests.fuzz import harness

FILE_NAMES = (
    "config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json",
    "tokenizer.model", "model.safetensors", "model.safetensors.index.json",
    "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    "chat_template.jinja", "chat_template.json",
)  # fmt: skip
REPLACE, PATCH, TRUNCATE, DELETE, SET_JSON = range(5)
MAX_EDITS = 4
# values a JSON edit sets: each type, signs, limits and the non-finite numbers json writes
JSON_VALUES: tuple[Any, ...] = (
    None, True, False, 0, 1, 2, 3, -1, 7, 1 << 24, 1 << 31, 1 << 63, 10**40, 0.5, -0.0, 1e308,
    float("nan"), float("inf"), -float("inf"), "", "x", "default", "llama3", "linear",
    "LlamaForCausalLM", "\ud800", [], [0], [1, 2], ["LlamaForCausalLM"], [None], {}, {"a": 1},
    {"type": "Sequence"}, {"full_attention": {}}, {"rope_type": "llama3"}, [[1]],
)  # fmt: skip
# keys the converters read that the fixtures' files may lack (the files' own keys come too)
EXTRA_KEYS = (
    "head_dim", "rope_scaling", "rope_parameters", "rope_local_base_freq", "layer_types",
    "sliding_window_pattern", "added_tokens_decoder", "added_tokens", "chat_template",
    "add_prefix_space", "attention_bias", "final_logit_softcapping", "attn_logit_softcapping",
    "use_sliding_window", "sliding_window", "query_pre_attn_scalar", "hidden_activation",
)  # fmt: skip
# each architecture's checkpoint at a size where one input takes milliseconds
SMALL = {"hidden": 16, "ff": 32, "n_layer": 1, "n_head": 4, "n_head_kv": 2}
OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen3": {"head_dim": 8},
    "gemma3": {"head_dim": 8, "n_head_kv": 1, "n_layer": 2, "config": {
        **SPECS["gemma3"].config, "query_pre_attn_scalar": 8}},
}  # fmt: skip

_SHM = "/dev/shm" if Path("/dev/shm").is_dir() else None
_SCRATCH = Path(tempfile.mkdtemp(prefix="fuzz-hf-", dir=_SHM)) / "checkpoint"
atexit.register(shutil.rmtree, _SCRATCH.parent, ignore_errors=True)


def _small_bpe(style: str):
    """The fixtures' trained BPE vocabulary cut to its bytes, 64 merges and its specials."""
    from dataclasses import replace

    from tests.fixtures.vocab import bpe_vocab

    full = bpe_vocab(style)
    typed = list(zip(full.tokens, full.token_types, strict=True))
    normal = [t for t, kind in typed if kind == 1][: 256 + 64]
    special = [(t, kind) for t, kind in typed if kind != 1]
    tokens = normal + [t for t, _ in special]
    kept = set(tokens)
    merges = [m for m in full.merges if m.replace(" ", "") in kept and set(m.split()) <= kept]
    ids = {role: tokens.index(full.tokens[i]) for role, i in full.special_ids.items()}
    types = [1] * len(normal) + [kind for _, kind in special]
    return replace(full, tokens=tokens, token_types=types, merges=merges, special_ids=ids)


def _small_spm():
    """A SentencePiece vocabulary: control and byte pieces, then a few scored words."""
    from tests.converters.checkpoints import CONTROL, NORMAL, UNKNOWN, SpmVocab

    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN, CONTROL, CONTROL]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # BYTE
    words = ["\u2581the", "\u2581a", "ing", "\u2581of", "er", "\u2581", "e", "t", "s", "\u2581to"]
    pieces += words
    types += [NORMAL] * len(words)
    scores = [0.0] * (len(pieces) - len(words)) + [-float(i) for i in range(len(words))]
    return SpmVocab(pieces, scores, types, {p: pieces.index(p) for p in pieces[:4]})


@functools.cache
def checkpoints() -> tuple[dict[str, bytes], ...]:
    """Every fixture architecture's folder, as file name -> content."""
    from tests.converters.checkpoints import write_checkpoint

    vocabs = {"llama3": _small_bpe("llama3"), "qwen2": _small_bpe("qwen2"), "spm": _small_spm()}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in SPECS:
            folder = Path(tmp) / arch
            write_checkpoint(folder, arch, vocabs, **{**SMALL, **OVERRIDES.get(arch, {})})
            out.append({p.name: p.read_bytes() for p in sorted(folder.iterdir())})
    return tuple(out)


def _objects(node: Any, depth: int = 0) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``node``, outermost first, to a depth of 4."""
    if depth > 4:
        return
    if isinstance(node, dict):
        yield node
        children = list(node.values())
    else:
        children = node if isinstance(node, list) else []
    for child in children[:64]:
        yield from _objects(child, depth + 1)


def _set_json(old: bytes, fdp: atheris.FuzzedDataProvider) -> bytes:
    """``old`` as JSON with one key of one object set to a value of :data:`JSON_VALUES`, or to
    fuzzed JSON text; the key is one the object has, or one of :data:`EXTRA_KEYS`."""
    try:
        doc = json.loads(old)
    except (ValueError, RecursionError):
        doc = {}
    objects = list(_objects(doc)) or [doc := {}]
    target = objects[fdp.ConsumeUInt(2) % len(objects)]
    keys = [*target, *EXTRA_KEYS]
    key = keys[fdp.ConsumeUInt(1) % len(keys)]
    pick = fdp.ConsumeUInt(1)
    if pick < len(JSON_VALUES):
        target[key] = JSON_VALUES[pick]
    else:
        try:
            target[key] = json.loads(fdp.ConsumeBytes(fdp.ConsumeUInt(1)))
        except (ValueError, RecursionError):
            target[key] = None
    try:
        return json.dumps(doc).encode()
    except (ValueError, RecursionError):  # a document as deep as the encoder goes
        return old


def _edit(files: dict[str, bytes], fdp: atheris.FuzzedDataProvider) -> None:
    op = fdp.ConsumeUInt(1)
    name, kind = FILE_NAMES[(op & 0x1F) % len(FILE_NAMES)], op >> 5
    old = files.get(name, b"")
    if kind == REPLACE:
        files[name] = fdp.ConsumeBytes(fdp.ConsumeUInt(4))
    elif kind == PATCH:
        at = fdp.ConsumeUInt(4) % (len(old) + 1)
        patch = fdp.ConsumeBytes(fdp.ConsumeUInt(2))
        files[name] = old[:at] + patch + old[at + len(patch) :]
    elif kind == TRUNCATE:
        files[name] = old[: fdp.ConsumeUInt(4) % (len(old) + 1)]
    elif kind == DELETE:
        files.pop(name, None)
    else:
        files[name] = _set_json(old, fdp)


def folder_of(data: bytes) -> dict[str, bytes]:
    """The files of the folder an input stands for (see the module's docstring)."""
    fdp = atheris.FuzzedDataProvider(data)
    bases = checkpoints()
    files = dict(bases[fdp.ConsumeUInt(1) % len(bases)])
    for _ in range(MAX_EDITS):
        if not fdp.remaining_bytes():
            break
        _edit(files, fdp)
    return files


def one_input(data: bytes) -> None:
    files = folder_of(data)
    shutil.rmtree(_SCRATCH, ignore_errors=True)
    _SCRATCH.mkdir()
    for name, content in files.items():
        (_SCRATCH / name).write_bytes(content)
    conversion = Conversion(_SCRATCH)
    conversion.plan(ConvertOptions(type="f16"))


def replace_input(base: int, name: str, content: bytes) -> bytes:
    """The input that replaces (or creates) ``name`` in checkpoint ``base``."""
    op = REPLACE << 5 | FILE_NAMES.index(name)
    return bytes([base, op]) + struct.pack("<I", len(content)) + content


def seeds() -> Iterator[bytes]:
    for base, files in enumerate(checkpoints()):
        yield bytes([base])
        for name, content in files.items():
            if name in FILE_NAMES:
                yield replace_input(base, name, content)
    # a sharded checkpoint's index next to a single-file checkpoint
    sharded = next(i for i, f in enumerate(checkpoints()) if FILE_NAMES[6] in f)
    single = next(i for i, f in enumerate(checkpoints()) if FILE_NAMES[5] in f)
    yield replace_input(single, FILE_NAMES[6], checkpoints()[sharded][FILE_NAMES[6]])


if __name__ == "__main__":
    harness.main(one_input, seeds)
