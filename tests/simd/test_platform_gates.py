"""tests/simd/platform_gates.py: a missing tool fails under CI and skips elsewhere; an
instruction set this machine lacks stays in a parameter list as a skip with its reason."""

from __future__ import annotations

import pytest

from edgeinfer import _native
from tests.simd import platform_gates


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_a_missing_tool_fails_under_ci(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="qemu-aarch64 not found"):
        platform_gates.missing_tool("qemu-aarch64 not found")


@pytest.mark.parametrize("value", [None, "", "0", "false"])
def test_a_missing_tool_skips_elsewhere(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception, match="qemu-aarch64 not found"):
        platform_gates.missing_tool("qemu-aarch64 not found")


@pytest.mark.skipif(not _native.available()[0], reason="native library unavailable")
def test_every_instruction_set_stays_in_the_list():
    params = platform_gates.isa_params(_native.ISA_NAMES)
    assert [p.values[0] for p in params] == list(_native.ISA_NAMES)
    for p, report in zip(params, _native.isa_report(), strict=True):
        (mark,) = p.marks
        assert mark.args[0] == (not report["supported"])
        if not report["supported"]:
            assert report["reason"] in mark.kwargs["reason"]
    assert platform_gates.runnable_isas(_native.ISA_NAMES) == [
        r["name"] for r in _native.isa_report() if r["supported"]
    ]
