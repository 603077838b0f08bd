"""Plain brickwork never imports transformers: building, running, generating, saving and loading a
model work where it is not installed (a process whose imports of it fail), and only ``brickwork.hf``
needs it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys


    class NoTransformers:
        '''Finds no transformers, as where it is not installed.'''

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "transformers":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None


    sys.meta_path.insert(0, NoTransformers())

    import tempfile

    import torch

    import brickwork
    from brickwork.factory import build_model, from_pretrained, save_pretrained
    from brickwork.sampling import sample_ids

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("gpt-tiny").eval()
    ids = torch.randint(0, 256, (2, 5))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    out = model.generate(ids, 3, attention_mask=mask, top_k=5, temperature=0.5)
    assert out.shape == (2, 8)
    assert model(ids, labels=ids).logits is not None
    sample_ids(model, ids[0], 3, window=16)
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder)
        assert torch.equal(from_pretrained(folder).eval()(ids), model(ids))
    assert not [m for m in sys.modules if m.split(".")[0] == "transformers"]
    try:
        import brickwork.hf
    except ModuleNotFoundError as err:
        assert err.name == "transformers" and "pip install 'brickwork[hf]'" in str(err), err
    else:
        raise AssertionError("brickwork.hf imported without transformers")
    print("ok")
    """
)


@pytest.mark.slow  # a fresh interpreter imports torch and brickwork: 10-20 s on a busy CPU
def test_brickwork_runs_where_transformers_is_not_installed() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
