"""Allocation failures under an address-space limit (``resource.setrlimit`` in a child):
each is a typed OutOfMemoryError naming the bytes, and the model stays usable or closed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

LIMIT = 4_000_000 * 1024  # the `ulimit -v 4000000` of the report

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    import edgeinfer
    from edgeinfer import errors

    def attempt(fn):
        try:
            return {{"ok": repr(fn())[:80]}}
        except errors.EdgeInferError as e:
            return {{"error": type(e).__name__, "message": str(e),
                     "typed_oom": isinstance(e, errors.OutOfMemoryError)}}

    out = {{}}
    model = None
    def load():
        global model
        model = edgeinfer.load(sys.argv[1], **json.loads(sys.argv[2]))
        return model.engine
    out["load"] = attempt(load)
    if model is not None:
        gen = lambda: model.generate("Hello", max_tokens=3, temperature=0).text
        out["first"] = attempt(gen)
        out["second"] = attempt(gen)
        out["tokenize"] = attempt(lambda: model.tokenize("still usable"))
        out["close"] = attempt(model.close)
    print(json.dumps(out))
    """
)


def run_capped(gemma_path, options: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(limit=LIMIT), str(gemma_path), json.dumps(options)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_reported_context_runs_under_the_limit(gemma_path):
    """The report: n_ctx=200000 under 4 GB, the second generate used to segfault. The cache
    is now a pool of blocks allocated as the context fills, with or without the sliding-window
    layers' rings, so both generates run (the pool running out is a typed OutOfMemoryError:
    tests/kv/test_block_pool.py)."""
    for options in ({"n_ctx": 200000, "swa_full": True}, {"n_ctx": 200000}):
        out = run_capped(gemma_path, options)
        assert "ok" in out["first"] and "ok" in out["second"], out
        assert "ok" in out["tokenize"] and "ok" in out["close"], out


@pytest.mark.parametrize(
    "options",
    [
        {"kv_budget": 1 << 55},  # the pool's tables for that many blocks
        {"n_threads": 512},
        {"n_ctx": 200000, "engine": "reference"},
    ],
)
def test_other_out_of_memory_paths_are_typed(gemma_path, options):
    out = run_capped(gemma_path, options)
    failures = [v for v in out.values() if "error" in v]
    assert failures, f"nothing ran out of memory under the limit: {out}"
    for failure in failures:
        assert failure["typed_oom"], out
        assert re.search(r"\d+( bytes| [KMGT]iB)|\d+ threads", failure["message"]), out
    if "ok" in out["load"]:
        assert "ok" in out["tokenize"] and "ok" in out["close"], out


def test_logits_beyond_memory_is_typed(gemma_path):
    """logits() of a whole long context wants n_tokens x n_vocab floats up front."""
    child = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({LIMIT}, {LIMIT}))
        import edgeinfer
        from edgeinfer import errors
        m = edgeinfer.load(sys.argv[1], n_ctx=8192)
        try:
            m.logits([2] * 8000)  # 8000 x 262144 floats: 8.4 GB
        except errors.OutOfMemoryError as e:
            print("typed:", e)
        print(m.generate("Hi", max_tokens=2, temperature=0).stats.generated_tokens)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", child, str(gemma_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("typed:") and "GiB" in lines[0] and lines[1] == "2", proc.stdout
