"""The Python examples in README.md and docs/ run as written.

Every ```python block is read. A block is complete when each name it reads is one it defines or
imports (or a builtin); a complete block runs as a script of its own, in a scratch folder holding
the repository's configs/. A fragment (it reads names an earlier block or the prose sets up, such
as ``model`` or ``ids``) is only compiled. The torchrun example of docs/parallel.md runs as the docs
say, on four gloo ranks, and README.md's ``brickwork plan`` console example prints what it shows.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
TORCHRUN_EXAMPLE = "Save as `train_parallel.py` and run `torchrun --nproc_per_node=4 train_parallel.py`"
# Complete blocks that are not run in this process, and why.
NOT_RUN_HERE = {
    "import torch\nimport torch.distributed as dist\n": "the torchrun example: run on four ranks below",
    "from brickwork.factory import build_model, from_pretrained, save_pretrained\n": (
        "names a run folder, an export file and an HF folder of the reader's "
        "(tests/factory/test_pretrained.py loads each)"
    ),
}


def blocks() -> list[tuple[str, str]]:
    """(``file:line``, code) of every python block, dedented."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 2
            code = match.group(1)
            indent = min(len(s) - len(s.lstrip()) for s in code.splitlines() if s.strip())
            code = "\n".join(s[indent:] for s in code.splitlines()) + "\n"
            found.append((f"{doc.relative_to(ROOT)}:{line}", code))
    return found


def free_names(tree: ast.AST) -> set[str]:
    """Names the code reads without binding them anywhere (a flat check: enough for examples)."""
    bound, read = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound


EXAMPLES = blocks()


def test_the_docs_hold_examples() -> None:
    assert len(EXAMPLES) >= 20
    complete = [where for where, code in EXAMPLES if not free_names(parse(code, where))]
    assert len(complete) >= 6, complete


def parse(code: str, where: str) -> ast.Module:
    # A fragment may be a function's body (it returns): it is compiled as one.
    try:
        compile(code, where, "exec")
        return ast.parse(code, filename=where)
    except SyntaxError:
        return ast.parse("def _example():\n" + "".join(f"    {s}\n" for s in code.splitlines()), where)


@pytest.mark.parametrize(("where", "code"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_a_documented_example_runs(where: str, code: str, tmp_path: Path) -> None:
    tree = parse(code, where)
    if free_names(tree) or any(code.startswith(prefix) for prefix in NOT_RUN_HERE):
        return
    # A script of its own, as a reader runs it: what it does to sys.modules (the xformers example
    # aliases a package) stays in its process.
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    (tmp_path / "example.py").write_text(code)
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"{where}:\n{done.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_the_torchrun_example_trains_on_four_ranks(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "parallel.md").read_text()
    assert TORCHRUN_EXAMPLE in text
    code = BLOCK.search(text, text.index(TORCHRUN_EXAMPLE)).group(1)
    script = tmp_path / "train_parallel.py"
    script.write_text(code)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", str(script)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = re.findall(r"step (\d): loss (\d+\.\d+)", done.stdout)
    assert [s for s, _ in losses] == ["0", "1", "2"], done.stdout
    assert all(0.0 < float(loss) < 10.0 for _, loss in losses)
    assert re.search(r"^\d+ tensors; \d+ values$", done.stdout, re.M), done.stdout


def test_the_readme_plan_example_prints_what_the_readme_shows(tmp_path: Path, monkeypatch, capsys) -> None:
    """README.md's ``brickwork plan`` console block, run as written: the same table and lines (the
    planner is deterministic, so a change to it shows here until the README is brought up to date)."""
    from brickwork.cli import main

    text = (ROOT / "README.md").read_text()
    block = re.search(r"^```console\n\$ brickwork plan (.*?)\n(.*?)^```", text, re.S | re.M)
    assert block, "README.md has no `brickwork plan` console example"
    monkeypatch.chdir(tmp_path)
    assert main(["plan", *block.group(1).split()]) == 0
    printed = capsys.readouterr().out
    assert printed.strip().splitlines() == block.group(2).strip().splitlines()
    assert (tmp_path / "dist.yaml").exists()
