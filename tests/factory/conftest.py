"""Fixtures of the factory tests."""

from typing import Any

import pytest
from factory_specs import TINY_SPECS


@pytest.fixture(params=sorted(TINY_SPECS))
def tiny_spec(request: pytest.FixtureRequest) -> dict[str, Any]:
    return TINY_SPECS[request.param]()
