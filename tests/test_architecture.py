"""The package's shape, read from its source with `ast`: no import cycles, layers that import
only downward (commands -> engine -> models -> kernels), and small modules.

Import names follow pyproject's package-dir: msa_cli/ is `msa`, models/ is `msa.models`,
kernels/ is `msa.kernels`. Every import counts, at module level or inside a function (a
function-level import is the usual way to hide a cycle), `if TYPE_CHECKING:` ones included;
relative imports are resolved against the importing module's package.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"msa": "msa_cli", "msa.models": "models", "msa.kernels": "kernels"}
MAX_LINES = 300
# the engine is a library: it yields events and never draws a terminal
TERMINAL_LIBRARIES = {"typer", "click", "rich", "prompt_toolkit"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # a module of the package, or a top-level third-party name
    line: int


def _modules(root: Path, packages: dict[str, str]) -> dict[str, Path]:
    """Module name -> file, for every .py file under the packages' folders."""
    modules = {}
    for name, folder in packages.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((name, *parts))] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The longest known module that `name` starts with (`a.b.attr` -> `a.b`), or the
    top-level name of a third-party module."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return parts[0]


def read_imports(modules: dict[str, Path]) -> list[Import]:
    imports = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import sub` imports the submodule when there is one
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                imports.append(Import(module, _resolve(target, modules), node.lineno))
    return imports


def find_cycles(imports: list[Import], modules: dict[str, Path]) -> list[list[Import]]:
    """One cycle, as its chain of imports, for each strongly connected group of modules."""
    edges: dict[str, dict[str, Import]] = {m: {} for m in modules}
    for imp in imports:
        if imp.target in modules and imp.target != imp.source:
            edges[imp.source].setdefault(imp.target, imp)
    # Tarjan's strongly connected components, iteratively (no recursion limit)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for start in modules:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return [_cycle_in(group, edges) for group in groups]


def _cycle_in(group: set[str], edges: dict[str, dict[str, Import]]) -> list[Import]:
    """The shortest cycle through the group's first module (breadth-first)."""
    start = min(group)
    paths = {start: []}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child, imp in sorted(edges[node].items()):
            if child == start:
                return paths[node] + [imp]
            if child in group and child not in paths:
                paths[child] = paths[node] + [imp]
                queue.append(child)
    raise AssertionError(f"no cycle in strongly connected group {sorted(group)}")


def _where(imp: Import, modules: dict[str, Path], root: Path) -> str:
    return f"{modules[imp.source].relative_to(root)}:{imp.line}"


def _describe(cycle: list[Import], modules: dict[str, Path], root: Path) -> str:
    chain = " -> ".join([cycle[0].source] + [imp.target for imp in cycle])
    lines = ", ".join(_where(imp, modules, root) for imp in cycle)
    return f"import cycle {chain} ({lines})"


MODULES = _modules(REPO, PACKAGES)
IMPORTS = read_imports(MODULES)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _layer(module: str) -> str:
    if _within(module, "msa.kernels"):
        return "kernels"
    if _within(module, "msa.models"):
        return "models"
    return "msa"


def _violations(source_layer: str, forbidden) -> list[str]:
    return [
        f"{_where(imp, MODULES, REPO)}: {imp.source} imports {imp.target}"
        for imp in IMPORTS
        if _layer(imp.source) == source_layer and imp.target in MODULES and forbidden(imp.target)
    ]


def test_the_reader_finds_a_planted_cycle(tmp_path):
    """The graph reader itself: a cycle through a relative, function-level import is found and
    named with its files and lines; the same tree without it has none."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from .sub import b\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "b.py").write_text(
        "import os\n\n\ndef f():\n    from .. import a\n"
    )
    modules = _modules(tmp_path, {"p": "pkg"})
    assert set(modules) == {"p", "p.a", "p.sub", "p.sub.b"}
    imports = read_imports(modules)
    cycles = [_describe(c, modules, tmp_path) for c in find_cycles(imports, modules)]
    assert cycles == ["import cycle p.a -> p.sub.b -> p.a (pkg/a.py:1, pkg/sub/b.py:5)"]
    (tmp_path / "pkg" / "sub" / "b.py").write_text("import os\n")
    assert find_cycles(read_imports(modules), modules) == []


def test_the_package_is_read_whole():
    assert {"msa", "msa.app", "msa.models", "msa.kernels"} <= set(MODULES)
    assert any(imp.source.startswith("msa.models") for imp in IMPORTS)


def test_no_import_cycles():
    cycles = [_describe(cycle, MODULES, REPO) for cycle in find_cycles(IMPORTS, MODULES)]
    assert not cycles, "\n".join(cycles)


def test_kernels_import_neither_models_nor_the_cli():
    bad = _violations("kernels", lambda target: _layer(target) != "kernels")
    assert not bad, "\n".join(bad)


def test_models_do_not_import_the_cli():
    bad = _violations("models", lambda target: _layer(target) == "msa")
    assert not bad, "\n".join(bad)


def test_the_engine_imports_no_command_and_no_terminal_library():
    if not (REPO / "msa_cli" / "engine").is_dir():
        pytest.skip("no engine layer (msa_cli/engine/) yet")
    bad = [
        f"{_where(imp, MODULES, REPO)}: {imp.source} imports {imp.target}"
        for imp in IMPORTS
        if _within(imp.source, "msa.engine")
        and (_within(imp.target, "msa.commands") or imp.target in TERMINAL_LIBRARIES)
    ]
    assert not bad, "\n".join(bad)


# The command groups (README's usage), one module each under msa_cli/commands/; the root app
# (commands/app.py) registers them. Every other module there is shared by the commands (options,
# errors, output, the REPL, the --server client) or serves one of them.
COMMANDS = ("ask", "chat", "serve", "eval", "bench", "cache", "models")


def _command(module: str) -> str | None:
    """The command group a module is (`msa.commands.ask` -> `ask`); None for any other."""
    parts = module.split(".")
    if parts[:2] == ["msa", "commands"] and len(parts) == 3 and parts[2] in COMMANDS:
        return parts[2]
    return None


def test_command_modules_do_not_import_one_another():
    """No command imports another, and no shared module imports a command: the root app alone
    knows them all."""
    if not (REPO / "msa_cli" / "commands").is_dir():
        pytest.skip("no commands subpackage (msa_cli/commands/) yet")
    bad = [
        f"{_where(imp, MODULES, REPO)}: {imp.source} imports {imp.target}"
        for imp in IMPORTS
        if _within(imp.source, "msa.commands")
        and imp.source != "msa.commands.app"
        and _command(imp.target)
        and _command(imp.source) != _command(imp.target)
    ]
    assert not bad, "\n".join(bad)


def test_every_module_is_at_most_300_lines():
    long = [
        f"{path.relative_to(REPO)}: {n} lines"
        for path in MODULES.values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, f"modules over {MAX_LINES} lines:\n" + "\n".join(long)
