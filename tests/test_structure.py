"""The structural figures of scripts/structure.py: the checker on a small made-up tree, then the
figures that must hold on this code."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_checker():
    spec = importlib.util.spec_from_file_location("structure", ROOT / "scripts" / "structure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


structure = _load_checker()


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> structure.Figures:
    """A tree with one cycle, private imports across and within folders, and a long parallel function."""
    root = tmp_path_factory.mktemp("toy")
    long_body = "".join(f"    x{i} = {i}\n" for i in range(70))
    _write(
        root,
        {
            "setup.py": 'FOLDERS = {"brickwork": "brickwork", "brickwork.kernels": "kernels", '
            '"brickwork.parallel": "parallel", "brickwork.factory": "factory", '
            '"brickwork.components": "components"}\n',
            "brickwork/__init__.py": "",
            "brickwork/registry.py": "REGISTRY = {}\n",
            "brickwork/launch_env.py": "import os\nRANK = os.environ.get('RANK')\n",
            "brickwork/ranks.py": (
                "import os\nfrom os import environ, getenv\n"
                "a = os.environ.get('RANK', '0')\nb = environ['WORLD_SIZE']\n"
                "c = 'LOCAL_RANK' not in os.environ\nd = getenv('RANK')\n"
                "e = os.environ.get('OMP_NUM_THREADS')\nf = {'RANK': 1}['RANK']\n"
            ),
            "brickwork/train/__init__.py": "from brickwork.data import batches\n",
            "brickwork/data/__init__.py": "def batches():\n    from brickwork.train import loop\n",
            "brickwork/train/tasks/lm.py": "@register_task('lm')\nclass LM:\n    same = 'lm' == 'lm'\n",
            "brickwork/train/rates.py": (
                "def rate(task, unit):\n    a = task == 'lm'\n    b = task.name not in ('other', 'lm')\n"
                "    c = 'lm'\n    d = unit == 'tokens'\n    return {'lm': 1}[task]\n"
            ),
            "kernels/__init__.py": "from ._runtime import use_triton\nfrom .fused._launch import grid\n",
            "kernels/_runtime.py": "def use_triton():\n    pass\n",
            "kernels/fused/__init__.py": "",
            "kernels/fused/_launch.py": "grid = 1\n",
            "kernels/fused/op.py": "from ._launch import grid\nfrom .._runtime import use_triton\n",
            "components/__init__.py": "",
            "components/mlp.py": "from brickwork.kernels._runtime import use_triton\nKIND = 'decoder_lm'\n",
            "components/attention/__init__.py": "",
            "components/attention/sparse.py": "def _flex():\n    pass\n",
            "components/attention/user.py": "from .sparse import _flex\n",
            "parallel/__init__.py": "",
            "parallel/state.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .experts import E\n"
            ),
            "parallel/experts.py": "from brickwork.parallel.state import layout\n",
            "parallel/tensor/__init__.py": "",
            "parallel/tensor/apply.py": (
                "def long():\n" + long_body + "    return ParallelConfig(dist)\n\n"
                "def short():\n    return ParallelConfig.from_dict({})\n"
            ),
            "factory/__init__.py": "",
            "factory/schema.py": "MODEL_KINDS = {'decoder_lm': 1, 'encoder': 2}\n",
            "factory/presets.py": "P = {'model': 'decoder_lm'}\n",
            "factory/hf/__init__.py": "K = 'encoder'\n",
            "factory/xformers/read.py": (
                "def read(c):\n    return c.get('block_type'), c['multi_head_config']\n"
            ),
            "brickwork/xformers/write.py": (
                "C = {'block_type': 1, 'feedforward_config': dict(residual_norm_style=1)}\n"
            ),
            "brickwork/xformers/build.py": (
                "def build(c, spec):\n    a = 'residual_norm_style' in c\n    return spec['dim_model']\n"
            ),
            "brickwork/configs.py": """\
                @dataclass
                class Hand:
                    def __post_init__(self): ...
                @dataclasses.dataclass(frozen=True)
                class CalledHand:
                    def __post_init__(self): ...
                @dataclass
                class Checked(CheckedConfig):
                    def check_options(self): ...
                class NoDataclass:
                    def __post_init__(self): ...
                @dataclass
                class HF(transformers.PreTrainedConfig):
                    def __post_init__(self, **kwargs): ...
                """,
        },
    )
    return structure.measure(root)


def test_a_cycle_between_two_packages_is_found_with_its_import_lines(toy):
    (cycle,) = toy.package_cycles
    assert cycle["packages"] == ["brickwork.data", "brickwork.train"]
    assert cycle["imports"] == {
        "brickwork.data -> brickwork.train": ["brickwork/data/__init__.py:2"],
        "brickwork.train -> brickwork.data": ["brickwork/train/__init__.py:1"],
    }


def test_private_names_may_be_imported_within_their_folder_only(toy):
    found = {(p["file"], p["imports"]) for p in toy.private_imports}
    assert found == {
        ("components/mlp.py:1", "brickwork.kernels._runtime.use_triton"),
        ("kernels/__init__.py:2", "brickwork.kernels.fused._launch.grid"),
    }


def test_parallel_function_lengths_and_dist_config_parse_sites(toy):
    assert toy.longest_parallel_function["function"] == "long"
    assert toy.longest_parallel_function["lines"] == 72
    assert [f["function"] for f in toy.parallel_functions_over_60] == ["long"]
    assert toy.dist_config_parse_sites == ["parallel/tensor/apply.py:72", "parallel/tensor/apply.py:75"]


def test_launch_variables_read_outside_their_module_are_found(toy):
    # os.environ.get, environ[...], "not in os.environ", getenv; not another variable, not a dict.
    assert toy.launch_env_reads == [f"brickwork/ranks.py:{line}" for line in (3, 4, 5, 6)]


def test_task_names_compared_outside_the_task_folder_are_found(toy):
    # == and a tuple under not in; not a bare literal, a dict key, another string or the task's own file.
    assert toy.task_name_comparisons == ["brickwork/train/rates.py:2", "brickwork/train/rates.py:3"]


def test_model_kinds_are_counted_outside_the_adapters_and_presets(toy):
    assert toy.model_kind_files == {
        "decoder_lm": ["components/mlp.py", "factory/schema.py"],
        "encoder": ["factory/schema.py"],
    }


def test_spec_machinery_and_folder_lines(toy):
    assert toy.spec_machinery_files == {
        "brickwork/registry.py": 1,
        "factory/__init__.py": 0,
        "factory/schema.py": 1,
    }
    assert toy.folder_lines["parallel"] == {"files": 5, "lines": 79}


def test_dataclasses_with_a_hand_written_post_init_are_found(toy):
    # Plain and called decorators count; a CheckedConfig's check_options, a plain class and HF's do not.
    assert toy.hand_checked_configs == ["brickwork/configs.py:2 Hand", "brickwork/configs.py:5 CalledHand"]


def test_files_reading_xformers_config_keys_are_found(toy):
    # A get, a subscript and an `in` test read; a dict literal, keyword arguments and dim_model do not.
    assert toy.xformers_config_readers == ["brickwork/xformers/build.py", "factory/xformers/read.py"]


def test_json_output_round_trips(capsys):
    structure.main(["--json", "--root", str(ROOT)])
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == set(structure.Figures.__dataclass_fields__)


@pytest.fixture(scope="module")
def figures() -> structure.Figures:
    return structure.measure(ROOT)


def test_file_cycles_are_found_and_type_only_imports_are_not_cycles(toy):
    assert toy.file_cycles == [["brickwork.data", "brickwork.train"]]


def test_no_import_cycles_between_files(figures):
    assert figures.file_cycles == []


def test_no_private_names_cross_folders(figures):
    assert figures.private_imports == []


def test_no_import_cycles_between_packages(figures):
    # train sits on parallel, parallel on the factory; the checkpoint format (brickwork.checkpoint) and
    # the layout declarations (brickwork.layout) sit below all three.
    assert figures.package_cycles == []


def test_parallel_functions_stay_short_and_the_dist_dict_is_parsed_in_two_places(figures):
    assert figures.parallel_functions_over_60 == []
    # parallel/mesh.py for a launched world, parallel/planner/layout.py for a planned one.
    assert len(figures.dist_config_parse_sites) <= 2, figures.dist_config_parse_sites


def test_rank_and_world_size_are_read_from_the_environment_in_one_module(figures):
    assert figures.launch_env_reads == []


def test_only_the_tasks_compare_task_names(figures):
    # The trainer, evaluation, data and checks ask the task object (brickwork/train/tasks/).
    assert figures.task_name_comparisons == []


def test_each_model_kind_is_named_in_at_most_three_files(figures):
    for kind, files in figures.model_kind_files.items():
        assert len(files) <= 3, (kind, files)


def test_xformers_configs_are_read_in_one_folder(figures):
    # factory/xformers/ is the one translation; brickwork.xformers' classes call it.
    readers = figures.xformers_config_readers
    assert readers and all(path.startswith("factory/xformers/") for path in readers), readers


def test_every_config_class_checks_its_fields_through_checked_config(figures):
    assert figures.hand_checked_configs == []


def test_the_spec_machinery_stays_under_its_line_budget(figures):
    # factory/ without its adapters and preset data, plus configurable, registry and checks: the code
    # between a spec and the components must stay smaller than the components it builds.
    assert figures.spec_machinery_lines < 1300, figures.spec_machinery_files
