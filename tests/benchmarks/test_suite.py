"""``brickwork.benchmarks.run``, the entry point of ``brickwork bench``: its options are checked first."""

from __future__ import annotations

import pytest

from brickwork import benchmarks
from brickwork.errors import ConfigError


@pytest.mark.parametrize("option", ["layers", "batch", "seq_len", "repeats"])
@pytest.mark.parametrize("value", [0, -2, True, 1.5])
def test_bad_sizes_are_refused_before_anything_runs(tmp_path, option, value):
    with pytest.raises(ConfigError, match=rf"{option}: must be a positive integer"):
        benchmarks.run(tmp_path, **{option: value})
    assert not any(tmp_path.iterdir())
