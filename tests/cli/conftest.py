"""Fixtures for the CLI tests: one scratch folder per test module, where the runs are written."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli")
