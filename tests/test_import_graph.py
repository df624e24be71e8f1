"""nsqpy's import structure: nsqd's modules form no import cycle, each imports alone, and
the packages keep their layers.

The graph is read from the source with ``ast`` (nothing is imported), so a cycle is caught
even where Python would tolerate it: a cycle through imports inside functions or under
``TYPE_CHECKING`` still means two modules that cannot be read, changed or tested apart.
One kind of edge is left out: a type-only back-pointer to the owner of most objects, a
module's ``TYPE_CHECKING`` import of ``nsqpy.nsqd.nsqd``. Any other owner is named by a
protocol of what is asked of it (as the channel's ``ChannelTopic``). The imports inside the
disk queue package are checked apart from the rest.
"""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
NSQD = "nsqpy.nsqd"
DISKQUEUE = "nsqpy.nsqd.diskqueue"

#: The one module a type-only import may name though it closes a cycle
OWNER = f"{NSQD}.nsqd"

#: The layers: protocol <- internal <- {nsqd, nsqlookupd, nsqadmin, client} <- {apps, spark,
#: pipeline, chaos}: the sans-IO protocol knows no daemon, and a daemon no other daemon. The
#: package root (version strings) sits below everything; ``testing`` starts daemons as
#: processes and sits with them; ``demo`` sits with the applications.
LAYERS = {
    "nsqpy": 0,
    "protocol": 1,
    "internal": 2,
    "nsqd": 3,
    "nsqlookupd": 3,
    "nsqadmin": 3,
    "client": 3,
    "testing": 3,
    "apps": 4,
    "spark": 4,
    "pipeline": 4,
    "chaos": 4,
    "demo": 4,
}
#: the applications' layer is the top one: they may use one another
TOP_LAYER = 4


@dataclass(frozen=True)
class Import:
    target: str  # absolute module name
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules(package: str = "nsqpy") -> dict[str, Path]:
    root = SRC.joinpath(*package.split("."))
    return {module_name(path): path for path in sorted(root.rglob("*.py"))}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _walk(node: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node under ``node`` with whether it sits under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if _is_type_checking(child):
            assert isinstance(child, ast.If)
            for inner in child.body:
                yield inner, True
                yield from _walk(inner, True)
            for inner in child.orelse:
                yield inner, type_only
                yield from _walk(inner, type_only)
        else:
            yield child, type_only
            yield from _walk(child, type_only)


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The imports of module ``name`` that name a module of ``modules`` (itself left out);
    ``from pkg import mod`` is an import of ``pkg.mod``, ``from pkg import obj`` of ``pkg``."""
    found: list[Import] = []
    for node, type_only in _walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
            line = node.lineno
        elif isinstance(node, ast.ImportFrom):
            line = node.lineno
            base = node.module or ""
            if node.level:
                package = name.split(".")
                if path.name != "__init__.py":
                    package.pop()
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.append(full if full in modules else base)
        found += [
            Import(target, line, type_only)
            for target in targets
            if target in modules and target != name
        ]
    return found


def in_diskqueue(name: str) -> bool:
    return name.startswith(DISKQUEUE + ".") or name == DISKQUEUE


def nsqd_graph(inside_diskqueue: bool) -> dict[str, dict[str, list[Import]]]:
    """importer -> imported -> the imports that make the edge, among nsqd's modules: the
    imports between two modules of the disk queue package, or all the others."""
    modules = all_modules(NSQD)
    graph: dict[str, dict[str, list[Import]]] = {name: {} for name in modules}
    for name, path in modules.items():
        for imp in imports_of(name, path, modules):
            if (in_diskqueue(name) and in_diskqueue(imp.target)) != inside_diskqueue:
                continue
            if imp.type_only and imp.target == OWNER:
                continue
            graph[name].setdefault(imp.target, []).append(imp)
    return graph


def find_cycle(graph: dict[str, dict[str, list[Import]]]) -> list[str]:
    """One cycle of ``graph`` as a path that returns to its start, or [] if it has none."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str]:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph[node]):
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return []

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return []


def describe(cycle: list[str], graph: dict[str, dict[str, list[Import]]]) -> str:
    lines = []
    for importer, imported in itertools.pairwise(cycle):
        where = ", ".join(
            f"line {imp.line}{' (TYPE_CHECKING)' if imp.type_only else ''}"
            for imp in graph[importer][imported]
        )
        lines.append(f"  {importer} -> {imported}: {where}")
    return "\n".join(lines)


def test_nsqd_modules_import_no_cycle() -> None:
    graph = nsqd_graph(inside_diskqueue=False)
    assert len(graph) > 30  # the walk found nsqd's modules
    cycle = find_cycle(graph)
    assert not cycle, "nsqd import cycle:\n" + describe(cycle, graph)


def test_disk_queue_modules_import_no_cycle() -> None:
    graph = nsqd_graph(inside_diskqueue=True)
    cycle = find_cycle(graph)
    assert not cycle, "disk queue import cycle:\n" + describe(cycle, graph)


def test_the_cycle_check_sees_a_cycle() -> None:
    graph: dict[str, dict[str, list[Import]]] = {
        "a": {"b": [Import("b", 1, False)]},
        "b": {"c": [Import("c", 2, True)]},
        "c": {"a": [Import("a", 3, False)]},
        "d": {"a": [Import("a", 4, False)]},
    }
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    del graph["c"]["a"]
    assert find_cycle(graph) == []


#: Imports each module named on stdin in a forked child of an interpreter that has imported
#: no nsqpy module, so each child is a fresh start for nsqpy; third-party packages are
#: imported once up front, which keeps the many children fast.
_IMPORT_EACH_ALONE = textwrap.dedent(
    """
    import importlib, os, sys, traceback
    import aiohttp, yarl  # noqa: F401 - shared third-party imports, loaded once
    assert not any(m == "nsqpy" or m.startswith("nsqpy.") for m in sys.modules)
    for name in sys.stdin.read().split():
        pid = os.fork()
        if pid == 0:
            try:
                importlib.import_module(name)
            except BaseException:
                sys.stdout.write(f"--- {name}\\n{traceback.format_exc()}")
                sys.stdout.flush()
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            sys.stdout.write(f"--- {name}: exit status {status}\\n")
    """
)


def test_each_nsqd_module_imports_alone() -> None:
    names = sorted(name for name in all_modules(NSQD) if not name.endswith(".__main__"))
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH_ALONE],
        input="\n".join(names),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


def test_packages_keep_the_layers() -> None:
    """A package imports only from lower layers; the daemons and the client never import one
    another; only the applications' layer may use its own members."""
    modules = all_modules()
    wrong: list[str] = []
    for name, path in modules.items():
        own = name.split(".")[1] if "." in name else "nsqpy"
        assert own in LAYERS, f"{own} has no layer: add it to LAYERS"
        for imp in imports_of(name, path, modules):
            other = imp.target.split(".")[1] if "." in imp.target else "nsqpy"
            if other == own:
                continue
            if LAYERS[other] > LAYERS[own] or (LAYERS[other] == LAYERS[own] != TOP_LAYER):
                wrong.append(f"{name}:{imp.line} imports {imp.target}")
    assert not wrong, "\n".join(wrong)
