"""Tensors are streamed: converting a checkpoint whose largest tensor is 200 MB (as float32)
takes far less extra memory than that tensor, measured as the peak resident size of a
separate process. (On a 1.1 GB BF16 Llama in two shards the peak was ~115 MiB.)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.converters.checkpoints import CheckpointSpec, hf_config, write_safetensors

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status"),
]

# VmHWM, the peak resident size of this process's memory: ru_maxrss would carry the parent's
# peak over the exec on Linux
PROBE = """
import json, re, sys
from edgeinfer.converters.convert import Conversion, ConvertOptions
def hwm():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1)) * 1024
conv = Conversion(sys.argv[1])
opened = hwm()
conv.write_gguf(conv.plan(ConvertOptions(type=sys.argv[3])), sys.argv[2])
print(json.dumps({"opened": opened, "peak": hwm()}))
"""


@pytest.fixture(scope="module")
def wide_checkpoint(tmp_path_factory, vocabs):
    """A one-layer Qwen 2 whose tied embedding has 65536 rows of 768 (201 MB as F32)."""
    from tests.converters.checkpoints import bpe_tokenizer_json, hf_tensors

    folder = tmp_path_factory.mktemp("wide")
    spec = CheckpointSpec("Qwen2ForCausalLM", "qwen2", "qwen2", hidden=768, ff=1536, n_layer=1,
                          n_head=12, n_head_kv=4, tied=True)  # fmt: skip
    vocab = vocabs["qwen2"]
    rows = 65536
    tensors = hf_tensors(spec, 8, seed=0)
    tensors["model.embed_tokens.weight"] = np.random.default_rng(1).standard_normal(
        (rows, 768), dtype=np.float32
    )
    write_safetensors(folder / "model.safetensors", tensors)
    del tensors
    (folder / "config.json").write_text(json.dumps(hf_config(spec, rows, dict(vocab.special_ids))))
    (folder / "tokenizer.json").write_text(
        json.dumps(bpe_tokenizer_json(vocab, "qwen2"), ensure_ascii=False)
    )
    return folder


@pytest.mark.parametrize("type_name", ["q8_0", "f16"])
def test_peak_memory_stays_below_the_largest_tensor(wide_checkpoint, tmp_path, type_name):
    largest = 65536 * 768 * 4
    out = tmp_path / "m.gguf"
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(wide_checkpoint), str(out), type_name],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rss = json.loads(result.stdout)
    extra = rss["peak"] - rss["opened"]
    print(
        f"{type_name}: peak {rss['peak'] >> 20} MiB, {extra >> 20} MiB above the opened checkpoint"
    )
    assert out.stat().st_size > largest // 4
    assert extra < largest // 2
