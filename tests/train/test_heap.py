"""brickwork/train/heap.py: the fixed heap thresholds are set on Linux with glibc, unless the user set
glibc's own."""

from __future__ import annotations

import os
import platform
import sys

import pytest

from brickwork.train.heap import keep_freed_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="needs glibc"
)
def test_the_thresholds_are_set_under_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    for name in [n for n in os.environ if n.startswith("MALLOC_")]:
        monkeypatch.delenv(name)
    assert keep_freed_memory()


@pytest.mark.parametrize("variable", ["MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"])
def test_glibc_settings_the_user_made_are_kept(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, "glibc.malloc.trim_threshold=1" if variable == "GLIBC_TUNABLES" else "1")
    assert not keep_freed_memory()
