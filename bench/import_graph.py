"""Print which nsqpy subpackage imports which (the package layering), and nsqd's modules.

Reads every module under src/nsqpy with `ast` (nothing is imported or run) and
prints, for each subpackage, the other subpackages it imports from and how many
names it takes from each; then any import loops between two modules of one
package that sit at module level; then, for each module of nsqd, the nsqd modules
it imports (``*`` marks a type-only import, under ``TYPE_CHECKING``) and the
cycles among them, type-only imports included but for back-pointers to
``nsqd.nsqd``, the daemon that owns everything (tests/test_import_graph.py
guards the same rule).

    python bench/import_graph.py [src/nsqpy]
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(
    tree: ast.Module,
    module: str,
    is_package: bool,
    modules: set[str] | dict[str, Path],
    type_only: bool = False,
) -> list[tuple[str, bool]]:
    """(absolute module name, imported at module level) for each import in `tree`; with
    `type_only`, the imports under ``TYPE_CHECKING`` instead."""
    found: list[tuple[str, bool]] = []
    top_level = {id(node) for node in tree.body}
    type_checking = {
        id(inner)
        for node in tree.body
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if (id(node) in type_checking) != type_only:
            continue  # type-only imports are back-pointers for the type checker, not run

        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                if not is_package:
                    package = package[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            # `from pkg import mod` imports pkg.mod; `from pkg import name` imports pkg
            found += [
                (
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base,
                    id(node) in top_level,
                )
                for alias in node.names
            ]
    return found


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "src/nsqpy")
    modules = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    package_edges: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    # (importer, imported) -> imported at module level?
    module_edges: dict[tuple[str, str], bool] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        own = name.split(".")[1] if "." in name else "nsqpy"
        for target, top in imported_modules(tree, name, path.name == "__init__.py", modules):
            if target not in modules or target == name:
                continue
            other = target.split(".")[1] if "." in target else "nsqpy"
            if other != own:
                package_edges[own][other] += 1
            else:
                module_edges[(name, target)] = module_edges.get((name, target), False) or top
    print("package -> packages it imports from (names imported)")
    for package in sorted(package_edges):
        targets = ", ".join(f"{t}({n})" for t, n in sorted(package_edges[package].items()))
        print(f"  {package:12} -> {targets}")
    print("import loops between two modules of one package (TYPE_CHECKING imports left out)")
    loops = sorted((a, b) for a, b in module_edges if a < b and (b, a) in module_edges)
    for a, b in loops:
        where = [
            "module" if module_edges[(a, b)] else "function",
            "module" if module_edges[(b, a)] else "function",
        ]
        print(f"  {a} ({where[0]}-level) <-> {b} ({where[1]}-level)")
    if not loops:
        print("  none")
    print_nsqd_modules(root, modules)


def print_nsqd_modules(root: Path, modules: dict[str, Path]) -> None:
    package = f"{root.name}.nsqd"
    owner = f"{package}.nsqd"
    edges: dict[str, set[str]] = defaultdict(set)
    print(f"{package}: module -> the {package} modules it imports (* type-only)")
    for name, path in modules.items():
        if not name.startswith(f"{package}."):
            continue
        tree = ast.parse(path.read_text())
        is_package = path.name == "__init__.py"
        runtime = {t for t, _ in imported_modules(tree, name, is_package, modules)}
        typing = {t for t, _ in imported_modules(tree, name, is_package, modules, True)}
        own = sorted(t for t in runtime | typing if t.startswith(f"{package}.") and t != name)
        if not own:
            continue
        shown = [t[len(package) + 1 :] + ("" if t in runtime else "*") for t in own]
        print(f"  {name[len(package) + 1 :]:28} -> {', '.join(shown)}")
        edges[name] = {t for t in own if t in runtime or t != owner}
    cycles = [c for c in _strongly_connected(edges) if len(c) > 1]
    print(f"cycles among {package}'s modules (type-only back-pointers to {owner} left out)")
    for cycle in cycles:
        print("  " + " <-> ".join(sorted(m[len(package) + 1 :] for m in cycle)))
    if not cycles:
        print("  none")


def _strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of the graph ``edges``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            found.append(component)

    for node in list(edges):
        if node not in index:
            visit(node)
    return found


if __name__ == "__main__":
    main()
