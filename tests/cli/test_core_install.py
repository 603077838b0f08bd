"""What ``pip install brickwork`` without extras gives: train and sample, with no optional package.

The optional packages are made unimportable in a fresh interpreter (as if not installed), so the run
shows both that nothing on the way imports them and that a feature needing one names its extra.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from brickwork.extras import EXTRAS

RUN = ["train.steps=4", "train.batch_size=4", "train.seq_len=32", "train.eval_interval=4",
       "train.eval_batches=1", "train.checkpoint_interval=4", "train.sample_tokens=4"]  # fmt: skip

SCRIPT = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # import fails as for a package not installed
from brickwork.cli import main
run = {run!r}
if main(["train", "gpt-tiny", *run, "train.out_dir=" + sys.argv[1]]) != 0:
    sys.exit("train failed")
if main(["sample", sys.argv[1], "--prompt", "Once", "--max-new-tokens", "8"]) != 0:
    sys.exit("sample failed")
open(sys.argv[2], "w").write("")
print("tokenizer:", main(["train", "gpt-tiny", *run, "data.tokenizer=" + sys.argv[2]]))
"""


@pytest.mark.timeout(240)
def test_gpt_tiny_trains_and_samples_without_any_optional_package(tmp_path: Path) -> None:
    script = SCRIPT.format(blocked=tuple(EXTRAS), run=RUN)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "run"), str(tmp_path / "tok.json")],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    assert "no loss.png" in done.stdout + done.stderr  # matplotlib's absence is said, not fatal
    assert "tokenizer: 2" in done.stdout
    error = "needs the tokenizers package, which is not installed: pip install 'brickwork[tokenizers]'"
    assert error in done.stderr
