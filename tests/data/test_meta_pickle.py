"""meta.pkl is read without running code from it."""

from __future__ import annotations

import os
import pickle

import pytest

from brickwork.data.meta_pickle import UnsafePickleError, load_plain_pickle
from brickwork.errors import ConfigError


class _Payload:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_plain_nanogpt_meta_loads(tmp_path):
    meta = {
        "vocab_size": 3,
        "itos": {0: "\n", 1: "a", 2: "b"},
        "stoi": {"\n": 0, "a": 1, "b": 2},
        "x": [1.5, (2, None)],
    }
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        (tmp_path / "meta.pkl").write_bytes(pickle.dumps(meta, protocol=protocol))
        assert load_plain_pickle(tmp_path / "meta.pkl") == meta


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_pickle_that_runs_code_is_refused_unrun(tmp_path, protocol):
    target = tmp_path / "pwned"
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 3, "x": _Payload(str(target))}, protocol))
    with pytest.raises(UnsafePickleError, match=r"data.path: '.*meta.pkl' asks to load posix.system"):
        load_plain_pickle(tmp_path / "meta.pkl")
    assert not target.exists()


def test_other_objects_and_damaged_files_are_refused(tmp_path):
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": {1, 2}}))
    with pytest.raises(UnsafePickleError, match="holds a set"):
        load_plain_pickle(tmp_path / "meta.pkl")
    (tmp_path / "meta.pkl").write_bytes(b"\x80\x04garbage")
    with pytest.raises(ConfigError, match="is not a readable pickle"):
        load_plain_pickle(tmp_path / "meta.pkl")
