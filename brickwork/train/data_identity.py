"""What a run trains on, recorded in ``RUN/data.json`` when it starts and checked when it resumes.

A resumed run must go on with the data and tokenizer it started with: data replaced under it would
silently train the rest of the run on something else, and another tokenizer would give the model's
rows other meanings (and leave ``RUN/tokenizer.json``, which ``brickwork sample`` decodes with,
stale). The record holds, per data file, its size and bounded fingerprint
(brickwork/data/fingerprint.py: not a full hash), and the tokenizer's name, size and SHA-256::

    {"files": [{"option": "data.path", "file": "chars/train.bin", "size": 2000, "fingerprint": "5d0c..."}],
     "tokenizer": {"name": "bytes", "vocab_size": 256, "sha256": "9a1e..."},
     "accepted": [{"step": 200, "changes": ["'chars/train.bin' has 1,800 bytes, not the 2,000 it had"]}]}

The embedded corpus is one file named ``<embedded corpus>``; generated images have no files and no
tokenizer but ``"generated": "images"`` (their generator reads only the spec and ``train.seed``,
which config.yaml holds). A change is refused unless ``--accept-data-change`` accepts it, which
appends it to ``accepted``. A tokenizer of another size is refused even then: the model's vocabulary
rows are the ids of the tokenizer it started with. A run folder from before these records resumes
unchecked and is recorded from then on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brickwork.data.config import DataConfig
from brickwork.data.corpus import embedded_corpus
from brickwork.data.fingerprint import fingerprint
from brickwork.data.sources import data_files
from brickwork.data.tokenizer import HFTokenizer, Tokenizer, tokenizer_digest
from brickwork.errors import ConfigError
from brickwork.train.atomic_file import replacing
from brickwork.train.trained_model import TOKENIZER_FILE

RECORD_FILE = "data.json"
EMBEDDED_NAME = "<embedded corpus>"
ACCEPT_OPTION = "--accept-data-change"


@dataclass
class DataIdentity:
    """What the run trains on from now (``record``, for data.json), with its ``tokenizer``; ``notes``
    are lines for the log, and ``stale`` says data.json and tokenizer.json must be (re)written."""

    record: dict[str, Any]
    tokenizer: Tokenizer | None
    notes: list[str] = field(default_factory=list)
    stale: bool = True

    def save(self, run_dir: Path) -> None:
        """Write data.json and the tokenizer.json ``brickwork sample`` decodes with (removed for bytes
        and bare ids), each whole or not at all; nothing when the record is current."""
        if not self.stale:
            return
        if isinstance(self.tokenizer, HFTokenizer):
            with replacing(run_dir / TOKENIZER_FILE) as partial:
                self.tokenizer.save(partial)
        else:
            (run_dir / TOKENIZER_FILE).unlink(missing_ok=True)
        with replacing(run_dir / RECORD_FILE) as partial:
            partial.write_text(json.dumps(self.record, indent=1) + "\n")


def current_record(data: DataConfig, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The record of what ``data`` and ``tokenizer`` read now; ``tokenizer=None`` is generated images."""
    if tokenizer is None:
        return {"generated": "images", "files": [], "tokenizer": None, "accepted": []}
    if data.path is None:
        with embedded_corpus().open("rb") as handle:
            files = [_file_entry("data.path", EMBEDDED_NAME, *fingerprint(handle))]
    else:
        files = []
        for option, path in data_files(data):
            with open(path, "rb") as handle:
                files.append(_file_entry(option, str(path), *fingerprint(handle)))
    digest = hashlib.sha256(tokenizer_digest(tokenizer).encode()).hexdigest()
    entry = _tokenizer_entry(tokenizer.name, tokenizer.vocab_size, digest)
    return {"files": files, "tokenizer": entry, "accepted": []}


def check_data_identity(
    run_dir: Path, current: dict[str, Any], tokenizer: Tokenizer | None, resumed_at: int | None, accept: bool
) -> DataIdentity:
    """Compare ``current`` with the record in ``run_dir`` of a run resumed at step ``resumed_at``
    (None: a new run, or one that starts again from step 0, recorded as it is). Raises a ConfigError
    naming each changed file or the tokenizer unless ``accept``, and always for a tokenizer of another
    size; reads, never writes."""
    if resumed_at is None:
        return DataIdentity(current, tokenizer)
    saved = read_record(run_dir / RECORD_FILE)
    if saved is None:
        note = (
            f"{run_dir} has no {RECORD_FILE} (the run started before runs recorded their data): "
            f"resuming without checking its data, which {RECORD_FILE} records from now on"
        )
        return DataIdentity(current, tokenizer, [note])
    _check_vocabulary(saved["tokenizer"], current["tokenizer"])
    changes = _changes(saved, current)
    if not changes:
        return DataIdentity(saved, tokenizer, stale=False)
    listed = "; ".join(text for _, text in changes)
    if not accept:
        raise ConfigError(
            f"the data changed since the run started ({run_dir / RECORD_FILE}): {listed}; put back what "
            f"the run trained on, or resume with {ACCEPT_OPTION} to train on it from step {resumed_at}",
            changes[0][0],
        )
    accepted = [*saved["accepted"], {"step": resumed_at, "changes": [text for _, text in changes]}]
    note = (
        f"{ACCEPT_OPTION}: from step {resumed_at} the run trains on changed data ({listed}); "
        f"{RECORD_FILE} records it"
    )
    return DataIdentity({**current, "accepted": accepted}, tokenizer, [note])


def read_record(path: Path) -> dict[str, Any] | None:
    """The record in ``path``, None if there is none; a ConfigError if it is not one."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        for entry in record["files"]:
            _file_entry(**entry)
        if record["tokenizer"] is not None:
            _tokenizer_entry(**record["tokenizer"])
        record.setdefault("accepted", [])
        return record
    except (ValueError, KeyError, TypeError) as err:  # not JSON, or not the shape written above
        raise ConfigError(
            f"{str(path)!r} is not a data record ({type(err).__name__}: {err}); remove it to resume "
            "without checking the data (it is then recorded afresh)",
            "--resume",
        ) from None


def _file_entry(option: str, file: str, size: int, fingerprint: str) -> dict[str, Any]:
    return {"option": option, "file": file, "size": size, "fingerprint": fingerprint}


def _tokenizer_entry(name: str, vocab_size: int, sha256: str) -> dict[str, Any]:
    return {"name": name, "vocab_size": vocab_size, "sha256": sha256}


def _check_vocabulary(saved: dict[str, Any] | None, current: dict[str, Any] | None) -> None:
    """A tokenizer of another size is refused, whatever is accepted: the model's vocab_size (its
    real rows, not a vocab_multiple's padding) was set from the one the run started with."""
    if saved is None or current is None or saved["vocab_size"] == current["vocab_size"]:
        return
    raise ConfigError(
        f"{current['name']} has {current['vocab_size']:,} ids, but the run started with "
        f"{saved['name']}, of {saved['vocab_size']:,}: the model's vocabulary rows are that tokenizer's "
        f"ids, so a resumed run cannot take a tokenizer of another size, not even with {ACCEPT_OPTION}; "
        "put that tokenizer back, or start a new run",
        "data.tokenizer",
    )


def _changes(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, str]]:
    """(option, what changed) for each file that is new, gone, resized or rewritten, then the tokenizer."""
    old = {(e["option"], e["file"]): e for e in saved["files"]}
    new = {(e["option"], e["file"]): e for e in current["files"]}
    changes = []
    for key in [*old, *(k for k in new if k not in old)]:
        option, file = key
        before, now = old.get(key), new.get(key)
        if now is None:
            changes.append((option, f"{file!r} is no longer read ({before['size']:,} bytes when recorded)"))
        elif before is None:
            changes.append((option, f"{file!r} is new ({now['size']:,} bytes)"))
        elif before["size"] != now["size"]:
            changes.append((option, f"{file!r} has {now['size']:,} bytes, not the {before['size']:,} it had"))
        elif before["fingerprint"] != now["fingerprint"]:
            changes.append((option, f"{file!r} has other content (the same {now['size']:,} bytes)"))
    before, now = saved["tokenizer"], current["tokenizer"]
    if before is not None and now is not None and before["sha256"] != now["sha256"]:
        what = f"the tokenizer {now['name']} is not the one the run started with ({before['name']})"
        changes.append(("data.tokenizer", f"{what}: its contents differ"))
    return changes
