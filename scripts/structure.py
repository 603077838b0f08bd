"""Structural figures of the code, read from the source files alone (nothing of brickwork is imported).

- import cycles between packages: a package is ``brickwork.<x>`` (``brickwork.kernels``,
  ``brickwork.train``, ``brickwork.cli``, ...); every import counts, lazy ones inside functions too;
- import cycles between files: modules that import one another, directly or round a longer loop;
  imports under ``if TYPE_CHECKING:`` are left out here, as they never run;
- private cross-folder imports: a name starting with ``_`` (a module or what a module defines) imported
  from outside the folder that holds it, its subfolders included;
- the longest function under parallel/ and how many are over 60 lines (``def`` line to last line);
- the call sites that parse the dist config: ``ParallelConfig(...)`` and ``ParallelConfig.<name>(...)``;
- the environment reads of ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` outside
  brickwork/launch_env.py, the one module that answers them: ``environ.get(NAME)``, ``environ[NAME]``,
  ``NAME in environ`` and ``getenv(NAME)``, with the name written as a literal;
- per model kind, the source files that quote its name as a string literal, outside the HF and
  xformers adapters and the presets;
- the comparisons (``==``, ``!=``, ``in``, ...) with a string literal that is a registered task's name
  (``@register_task("name")``), alone or in a tuple, list or set literal, outside the task folder
  brickwork/train/tasks/, where each task answers for itself;
- the spec machinery's line count (factory/ without hf/, the xformers adapters and the presets, plus
  the option and registry helpers), and the lines per top-level folder.
- the files that read xformers config keys (``block_type``, ``multi_head_config``, ...: a subscript, a
  get/pop/setdefault argument or an ``in`` test), which must all lie in factory/xformers/;
- the config classes checked by a hand-written ``__post_init__``: classes decorated ``@dataclass`` or
  ``@dataclasses.dataclass`` (called or not) whose own body defines ``__post_init__``, except those
  with a base named ``PretrainedConfig``/``PreTrainedConfig`` (HF's configs, whose ``__post_init__`` is
  HF's protocol); the others derive ``CheckedConfig`` and declare checks on their fields.

Source files are those of the installed packages (setup.py's folder map), tests excluded.
``python scripts/structure.py`` prints a table; ``--json`` prints the figures for machines;
``--root DIR`` measures another checkout.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

LONG_FUNCTION = 60
DIST_CONFIG_CLASS = "ParallelConfig"
# Where the model kinds are declared: a dict (its keys) or a sequence of names under one of these.
KIND_DECLARATIONS = ("MODEL_KINDS", "MODELS")
# Files that may name every kind: the HF and xformers adapters and the presets.
KIND_EXEMPT = ("factory/hf/", "factory/xformers", "brickwork/xformers/", "preset")
SPEC_EXEMPT = ("factory/hf/", "factory/xformers", "factory/preset")
SPEC_EXTRA = (
    "components/configurable.py",
    "brickwork/registry.py",
    "brickwork/checks.py",
    "brickwork/option_types.py",
)
LAUNCH_ENV_MODULE = "brickwork/launch_env.py"
LAUNCH_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}
TASK_FOLDER = "brickwork/train/tasks/"
TASK_REGISTER = "register_task"
HF_CONFIG_BASES = {"PretrainedConfig", "PreTrainedConfig"}
SKIPPED_DIRS = {".venv", ".git", "build", "dist", "__pycache__", "node_modules"}
# Keys only an xformers factory config has (dim_model is one too, but brickwork's own specs share it).
# A file reads them when one is a subscript, a get/pop/setdefault argument or an ``in`` test's left
# side; writing a config (a dict literal, keyword arguments) is not reading it.
XFORMERS_CONFIG_KEYS = {
    "block_type", "multi_head_config", "feedforward_config", "position_encoding_config", "residual_norm_style"
}  # fmt: skip


@dataclass
class Source:
    path: str  # relative to the root, with forward slashes
    module: str  # dotted import name
    is_package: bool  # an __init__.py
    tree: ast.Module
    lines: int

    @property
    def folder(self) -> str:
        """The import name of the folder holding this file."""
        return self.module if self.is_package else self.module.rpartition(".")[0]


@dataclass
class Figures:
    package_cycles: list[dict] = field(default_factory=list)
    file_cycles: list[list[str]] = field(default_factory=list)
    private_imports: list[dict] = field(default_factory=list)
    longest_parallel_function: dict | None = None
    parallel_functions_over_60: list[dict] = field(default_factory=list)
    dist_config_parse_sites: list[str] = field(default_factory=list)
    launch_env_reads: list[str] = field(default_factory=list)
    model_kind_files: dict[str, list[str]] = field(default_factory=dict)
    task_name_comparisons: list[str] = field(default_factory=list)
    spec_machinery_lines: int = 0
    hand_checked_configs: list[str] = field(default_factory=list)
    spec_machinery_files: dict[str, int] = field(default_factory=dict)
    folder_lines: dict[str, dict[str, int]] = field(default_factory=dict)
    xformers_config_readers: list[str] = field(default_factory=list)


def package_folders(root: Path) -> dict[str, str]:
    """setup.py's ``FOLDERS`` literal: the map from import package to folder, stated there only."""
    setup = root / "setup.py"
    tree = ast.parse(setup.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FOLDERS" for t in node.targets):
            return dict(ast.literal_eval(node.value))
    raise SystemExit(f"{setup} has no FOLDERS literal mapping packages to folders")


def python_files(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.rglob("*.py") if not SKIPPED_DIRS.intersection(p.relative_to(folder).parts[:-1])
    )


def read_sources(root: Path) -> list[Source]:
    sources = []
    for package, folder in package_folders(root).items():
        base = root / folder
        if not base.is_dir():
            continue
        for path in python_files(base):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            if package == "brickwork" and parts and parts[0] in {"components", "kernels", "blocks"}:
                continue  # never the case in practice: the mapped folders are read under their own name
            text = path.read_text()
            sources.append(
                Source(
                    path.relative_to(root).as_posix(),
                    ".".join([package, *parts]),
                    is_package,
                    ast.parse(text, filename=str(path)),
                    len(text.splitlines()),
                )
            )
    return sources


@dataclass
class Import:
    source: Source
    line: int
    target: str  # the dotted name imported: a module, or module.attribute
    type_only: bool = False  # under ``if TYPE_CHECKING:``


def type_checking_imports(tree: ast.AST) -> set[int]:
    """The ids of the import nodes inside ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) bodies."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return found


def imports(source: Source, modules: set[str]) -> list[Import]:
    """Every import in the file, absolute, each imported name as its own dotted path."""
    found = []
    type_only = type_checking_imports(source.tree)
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            found += [Import(source, node.lineno, alias.name, id(node) in type_only) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = source.folder.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                name = f"{module}.{alias.name}"
                target = name if alias.name != "*" else module
                found.append(Import(source, node.lineno, target, id(node) in type_only))
    return [i for i in found if i.target == "brickwork" or i.target.startswith("brickwork.")]


def unit_of(name: str) -> str:
    """``brickwork.kernels.fused.layer_norm`` -> ``brickwork.kernels``."""
    return ".".join(name.split(".")[:2])


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def package_cycles(all_imports: list[Import], modules: set[str]) -> list[dict]:
    """Each group of packages that import one another, with the import lines that tie them."""
    graph: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], set[str]] = defaultdict(set)
    for imp in all_imports:
        a, b = unit_of(imp.source.module), unit_of(resolve(imp.target, modules))
        if a != b:
            graph[a].add(b)
            where[a, b].add(f"{imp.source.path}:{imp.line}")
    cycles = []
    for component in strongly_connected(graph):
        edges = {
            f"{a} -> {b}": sorted(where[a, b])
            for a in component
            for b in component
            if a != b and (a, b) in where
        }
        cycles.append({"packages": component, "imports": edges})
    return cycles


def file_cycles(all_imports: list[Import], modules: set[str]) -> list[list[str]]:
    """Each group of modules that import one another at run time (a package is its __init__.py)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in all_imports:
        target = resolve(imp.target, modules)
        if not imp.type_only and target != imp.source.module:
            graph[imp.source.module].add(target)
    return strongly_connected(graph)


def resolve(target: str, modules: set[str]) -> str:
    """The module a dotted import lands in: ``brickwork.kernels.layer_norm`` -> ``brickwork.kernels``."""
    while target not in modules and "." in target:
        target = target.rpartition(".")[0]
    return target


def private_imports(all_imports: list[Import], modules: set[str], packages: set[str]) -> list[dict]:
    """Imports of a ``_name`` from outside the folder that holds it."""
    found = []
    for imp in all_imports:
        parts = imp.target.split(".")
        private = [i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")]
        if not private:
            continue
        container = ".".join(parts[: private[0]])
        # A module's private name belongs to the module's folder; a package's to that package.
        owner = container if container in packages else container.rpartition(".")[0]
        folder = imp.source.folder
        if folder != owner and not folder.startswith(owner + "."):
            found.append({"file": f"{imp.source.path}:{imp.line}", "imports": imp.target})
    return found


def function_lengths(sources: list[Source], folder: str) -> list[dict]:
    lengths = []
    for source in sources:
        if not source.path.startswith(folder + "/"):
            continue
        for node in ast.walk(source.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                lengths.append(
                    {"function": node.name, "file": f"{source.path}:{node.lineno}", "lines": lines}
                )
    return sorted(lengths, key=lambda f: (-f["lines"], f["file"]))


def dist_config_parse_sites(sources: list[Source]) -> list[str]:
    sites = []
    for source in sources:
        for node in ast.walk(source.tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute):
                func = func.value
            if isinstance(func, ast.Name) and func.id == DIST_CONFIG_CLASS:
                sites.append(f"{source.path}:{node.lineno}")
    return sites


def _environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return ast.unparse(node).split(".")[-1] == "environ"


def _launch_variable(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in LAUNCH_VARIABLES


def launch_env_reads(sources: list[Source]) -> list[str]:
    """Where a file other than the launch environment's module reads RANK, WORLD_SIZE or LOCAL_RANK."""
    sites: list[tuple[str, int]] = []
    for source in sources:
        if source.path == LAUNCH_ENV_MODULE:
            continue
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Call) and node.args and _launch_variable(node.args[0]):
                func = node.func
                read = ast.unparse(func).split(".")[-1] == "getenv" or (
                    isinstance(func, ast.Attribute) and func.attr == "get" and _environ(func.value)
                )
            elif isinstance(node, ast.Subscript):
                read = _environ(node.value) and _launch_variable(node.slice)
            elif isinstance(node, ast.Compare):
                read = _launch_variable(node.left) and any(
                    isinstance(op, ast.In | ast.NotIn) and _environ(right)
                    for op, right in zip(node.ops, node.comparators)
                )
            else:
                continue
            if read:
                sites.append((source.path, node.lineno))
    return [f"{path}:{line}" for path, line in sorted(sites)]


def string_constants(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def model_kinds(sources: list[Source]) -> list[str]:
    """The kind names where they are declared: keys of a ``MODEL_KINDS``/``MODELS`` dict literal (or
    the names of a sequence literal)."""
    kinds: list[str] = []
    for source in sources:
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Assign):
                names, value = [getattr(t, "id", None) for t in node.targets], node.value
            elif isinstance(node, ast.AnnAssign):
                names, value = [getattr(node.target, "id", None)], node.value
            else:
                continue
            if value is None or not set(names) & set(KIND_DECLARATIONS):
                continue
            items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
            kinds += [k.value for k in items if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return sorted(set(kinds))


def model_kind_files(sources: list[Source]) -> dict[str, list[str]]:
    counted = [s for s in sources if not any(part in s.path for part in KIND_EXEMPT)]
    strings = {s.path: string_constants(s.tree) for s in counted}
    return {kind: sorted(p for p, found in strings.items() if kind in found) for kind in model_kinds(sources)}


def task_names(sources: list[Source]) -> set[str]:
    """The registered task names: the literal of each ``register_task("name")`` call."""
    names = set()
    for source in sources:
        for node in ast.walk(source.tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.args[0]
            if ast.unparse(node.func).split(".")[-1] == TASK_REGISTER and isinstance(name, ast.Constant):
                names.add(name.value)
    return names


def compared_strings(node: ast.Compare) -> set[str]:
    """The string literals a comparison tests against, alone or in a tuple, list or set literal."""
    found = set()
    for operand in (node.left, *node.comparators):
        items = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
        found |= {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
    return found


def task_name_comparisons(sources: list[Source]) -> list[str]:
    """Where a file outside the task folder compares a value with a registered task's name."""
    names = task_names(sources)
    return [
        f"{source.path}:{node.lineno}"
        for source in sources
        if not source.path.startswith(TASK_FOLDER)
        for node in ast.walk(source.tree)
        if isinstance(node, ast.Compare) and compared_strings(node) & names
    ]


def spec_machinery(root: Path, sources: list[Source]) -> dict[str, int]:
    files = {
        s.path: s.lines
        for s in sources
        if s.path.startswith("factory/") and not any(s.path.startswith(e) for e in SPEC_EXEMPT)
    }
    by_path = {s.path: s.lines for s in sources}
    files.update({p: by_path[p] for p in SPEC_EXTRA if p in by_path})
    return dict(sorted(files.items()))


def reads_xformers_keys(node: ast.AST) -> bool:
    """Whether ``node`` reads one of :data:`XFORMERS_CONFIG_KEYS` from a config."""

    def key(n: ast.AST) -> bool:
        return isinstance(n, ast.Constant) and n.value in XFORMERS_CONFIG_KEYS

    if isinstance(node, ast.Subscript):
        return key(node.slice)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in {"get", "pop", "setdefault"} and bool(node.args) and key(node.args[0])
    if isinstance(node, ast.Compare):
        return isinstance(node.ops[0], ast.In | ast.NotIn) and key(node.left)
    return False


def xformers_config_readers(sources: list[Source]) -> list[str]:
    """The files that read xformers config keys (the one translation of xformers configs)."""
    return sorted(s.path for s in sources if any(reads_xformers_keys(n) for n in ast.walk(s.tree)))


def _tail_name(node: ast.AST) -> str:
    """``dataclass`` for ``dataclass``, ``dataclasses.dataclass`` and ``dataclass(frozen=True)``."""
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def hand_checked_configs(sources: list[Source]) -> list[str]:
    """``path:line Class`` of each dataclass defining ``__post_init__`` by hand (HF configs aside)."""
    found = []
    for source in sources:
        for node in ast.walk(source.tree):
            if not isinstance(node, ast.ClassDef) or HF_CONFIG_BASES & {_tail_name(b) for b in node.bases}:
                continue
            dataclass = any(_tail_name(d) == "dataclass" for d in node.decorator_list)
            methods = {s.name for s in node.body if isinstance(s, ast.FunctionDef)}
            if dataclass and "__post_init__" in methods:
                found.append(f"{source.path}:{node.lineno} {node.name}")
    return found


def folder_lines(root: Path) -> dict[str, dict[str, int]]:
    """Python files and lines per top-level folder (tests, scripts and benchmarks included)."""
    table = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if folder.name in SKIPPED_DIRS or folder.name.endswith(".egg-info"):
            continue
        files = python_files(folder)
        if files:
            lines = sum(len(p.read_text().splitlines()) for p in files)
            table[folder.name] = {"files": len(files), "lines": lines}
    return table


def measure(root: Path) -> Figures:
    sources = read_sources(root)
    modules = {s.module for s in sources}
    packages = {s.module for s in sources if s.is_package}
    all_imports = [i for s in sources for i in imports(s, modules)]
    lengths = function_lengths(sources, "parallel")
    spec = spec_machinery(root, sources)
    return Figures(
        package_cycles=package_cycles(all_imports, modules),
        file_cycles=file_cycles(all_imports, modules),
        private_imports=private_imports(all_imports, modules, packages),
        longest_parallel_function=lengths[0] if lengths else None,
        parallel_functions_over_60=[f for f in lengths if f["lines"] > LONG_FUNCTION],
        dist_config_parse_sites=dist_config_parse_sites(sources),
        launch_env_reads=launch_env_reads(sources),
        model_kind_files=model_kind_files(sources),
        task_name_comparisons=task_name_comparisons(sources),
        spec_machinery_lines=sum(spec.values()),
        spec_machinery_files=spec,
        hand_checked_configs=hand_checked_configs(sources),
        folder_lines=folder_lines(root),
        xformers_config_readers=xformers_config_readers(sources),
    )


def table(f: Figures) -> str:
    rows = [("import cycles between packages", str(len(f.package_cycles)))]
    for cycle in f.package_cycles:
        rows.append(("  cycle", " <-> ".join(cycle["packages"])))
        rows += [(f"    {edge}", ", ".join(sites)) for edge, sites in cycle["imports"].items()]
    rows.append(("import cycles between files", str(len(f.file_cycles))))
    rows += [("  cycle", " <-> ".join(cycle)) for cycle in f.file_cycles]
    rows.append(("private cross-folder imports", str(len(f.private_imports))))
    rows += [(f"  {p['file']}", p["imports"]) for p in f.private_imports]
    longest = f.longest_parallel_function
    rows.append(
        (
            "longest function in parallel/",
            f"{longest['lines']} lines, {longest['function']} ({longest['file']})" if longest else "-",
        )
    )
    rows.append(
        (f"functions in parallel/ over {LONG_FUNCTION} lines", str(len(f.parallel_functions_over_60)))
    )
    rows.append(("dist config parse sites", str(len(f.dist_config_parse_sites))))
    rows += [("  at", site) for site in f.dist_config_parse_sites]
    rows.append(
        (
            f"environment reads of RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE outside {LAUNCH_ENV_MODULE}",
            str(len(f.launch_env_reads)),
        )
    )
    rows += [("  at", site) for site in f.launch_env_reads]
    rows.append(
        ("model-kind names quoted, files", "" if f.model_kind_files else f"(no {KIND_DECLARATIONS} found)")
    )
    rows += [
        (f"  {kind!r}", f"{len(paths)}: {', '.join(paths)}") for kind, paths in f.model_kind_files.items()
    ]
    rows.append(("task-name string comparisons outside the task registry", str(len(f.task_name_comparisons))))
    rows += [("  at", site) for site in f.task_name_comparisons]
    rows.append(("spec machinery, lines", str(f.spec_machinery_lines)))
    rows.append(("config classes checked by hand-written __post_init__", str(len(f.hand_checked_configs))))
    rows += [("  at", site) for site in f.hand_checked_configs]
    rows.append(("files reading xformers config keys", str(len(f.xformers_config_readers))))
    rows += [("  in", path) for path in f.xformers_config_readers]
    rows.append(("lines per top-level folder", "files / lines"))
    rows += [(f"  {name}/", f"{c['files']} / {c['lines']}") for name, c in f.folder_lines.items()]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{label:<{width}}  {value}".rstrip() for label, value in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout")
    args = parser.parse_args(argv)
    figures = measure(args.root)
    print(json.dumps(asdict(figures), indent=2) if args.json else table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
