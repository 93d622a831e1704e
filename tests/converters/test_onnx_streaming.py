"""The ONNX export streams tensors as the GGUF one does: on the checkpoint of test_streaming
(a tied 65536 x 768 embedding, 201 MB as float32) the peak resident size of the converting
process stays far below that tensor, measured after the checkpoint is opened and onnx
imported. (Float32 matrices other than the embedding are transposed whole for MatMul: twice
the largest of them at most.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.converters.test_streaming import wide_checkpoint  # noqa: F401 (a fixture)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status"),
]
pytest.importorskip("onnx")

PROBE = """
import json, re, sys
from edgeinfer.converters.convert import Conversion, ConvertOptions
from edgeinfer.converters.onnx import decoder, export
def hwm():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1)) * 1024
conv = Conversion(sys.argv[1])
opened = hwm()
options = ConvertOptions(type=sys.argv[3], format="onnx", n_ctx=512)
export.export_onnx(conv, sys.argv[2], options, lambda *a: None)
print(json.dumps({"opened": opened, "peak": hwm()}))
"""


@pytest.mark.parametrize("type_name", ["int4", "f32"])
def test_peak_memory_stays_below_the_largest_tensor(wide_checkpoint, tmp_path, type_name):  # noqa: F811 (the imported fixture)
    largest = 65536 * 768 * 4
    out = tmp_path / "onnx"
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(wide_checkpoint), str(out), type_name],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rss = json.loads(result.stdout)
    extra = rss["peak"] - rss["opened"]
    size = (out / "model.onnx.data").stat().st_size
    print(f"{type_name}: peak {rss['peak'] >> 20} MiB, {extra >> 20} MiB above the opened "
          f"checkpoint; weights {size >> 20} MiB")  # fmt: skip
    assert size > largest // 8
    assert extra < largest // 2
