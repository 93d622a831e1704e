"""What `doctor` and the default thread count see of the machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgeinfer import _native, system
from edgeinfer.engines import ENGINES
from tests.api.conftest import load


def test_physical_cores_within_what_the_process_may_use():
    assert 1 <= system.physical_cores() <= system.usable_cpus() <= (os.cpu_count() or 1)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this OS")
def test_affinity_caps_the_thread_count(monkeypatch, fixture_models):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert system.usable_cpus() == 1 and system.physical_cores() == 1
    with load(fixture_models["llama"]) as model:
        assert model.n_threads == 1


@pytest.mark.parametrize(
    "content, cap", [("150000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", None)]
)
def test_cgroup_quota_caps_the_usable_cpus(monkeypatch, tmp_path, content, cap):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    quota = tmp_path / "cpu.max"
    quota.write_text(content)
    monkeypatch.setattr(system, "CGROUP_CPU_MAX", str(quota))
    assert system.usable_cpus() == (cap or 64)


def test_doctor_report_shape():
    report = system.doctor()
    keys = {"edgeinfer", "python", "os", "cpu", "memory", "backends", "gpus", "frozen"}
    assert set(report) == keys
    assert set(report["gpus"]) == {"devices", "none"}  # tests/gpu compare them with vulkaninfo
    assert report["frozen"] == ""  # not a PyInstaller bundle
    names = [b["name"] for b in report["backends"]]
    assert names == list(ENGINES)  # doctor reads the one registry
    assert all(b["formats"] and b["detail"] for b in report["backends"])
    native = report["backends"][0]
    if native["available"]:
        chosen = [v for v in native["isa"] if v["chosen"]]
        assert len(chosen) == 1 and chosen[0]["supported"]
        assert chosen[0]["name"] in native["detail"]
        assert Path(native["library"]) == _native.library_path_looked_for()  # the file loaded
    else:
        assert native["detail"]  # says why not
