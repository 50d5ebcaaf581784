"""The first-party packages import one way: `agent -> llm, tts, audio_io`, `llm -> audio_io`, `tts -> audio_io`
(the user-error type lives in `audio_io/errors.py`, below them all). Every import counts, function-level ones too."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "llm", "tts", "audio_io")
ALLOWED = {("agent", "llm"), ("agent", "tts"), ("agent", "audio_io"), ("llm", "audio_io"), ("tts", "audio_io")}


def package_edges(root: Path) -> dict[tuple[str, str], list[str]]:
    """(importer, imported) package pairs -> where each import is (file:line)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in PACKAGES and top != package:
                        edges.setdefault((package, top), []).append(f"{path.relative_to(root)}:{node.lineno}")
    return edges


def cycle(edges) -> list[str] | None:
    """A cycle among the packages (as a path that returns to its start), or None."""
    graph = {p: {b for a, b in edges if a == p} for p in PACKAGES}

    def visit(node: str, path: list[str]) -> list[str] | None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            found = visit(nxt, path + [nxt])
            if found:
                return found
        return None

    return next((found for start in PACKAGES if (found := visit(start, [start]))), None)


def test_packages_import_one_way_and_never_in_a_cycle():
    edges = package_edges(ROOT)
    wrong = {pair: where for pair, where in edges.items() if pair not in ALLOWED}
    assert not wrong, wrong
    assert cycle(edges) is None


def test_a_planted_cycle_is_caught(tmp_path):
    """Control: a copy of the rule over a tree where audio_io imports tts (inside a function) and tts audio_io."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "tts" / "a.py").write_text("from audio_io.errors import UserError\n")
    (tmp_path / "audio_io" / "b.py").write_text("def f():\n    import tts.inference.streaming\n")
    edges = package_edges(tmp_path)
    assert edges[("audio_io", "tts")] == ["audio_io/b.py:2"] and ("audio_io", "tts") not in ALLOWED
    assert cycle(edges) in (["audio_io", "tts", "audio_io"], ["tts", "audio_io", "tts"])


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_edges(root: Path) -> dict[str, set[str]]:
    """First-party module -> the first-party modules it imports, every import counted (in functions, and under
    `TYPE_CHECKING` too: a type-only circle still ties the two modules together for a reader)."""
    modules = {module_name(root, path): path for package in PACKAGES for path in (root / package).rglob("*.py")}
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                while target and target not in modules:  # `from pkg import name`: the module, else the package
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    edges[name].add(target)
    return edges


def module_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle among modules (a path back to its start), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        for nxt in sorted(edges.get(node, ())):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        done.add(node)
        return None

    return next((found for start in sorted(edges) if (found := visit(start, [start]))), None)


def test_no_module_imports_itself_through_others():
    assert module_cycle(module_edges(ROOT)) is None


def test_a_planted_module_cycle_is_caught(tmp_path):
    """Control: a.py imports b at runtime, b.py imports a only for type checking: still a circle."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "tts" / "__init__.py").write_text("")
    (tmp_path / "tts" / "a.py").write_text("from tts.b import thing\n")
    (tmp_path / "tts" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    assert module_cycle(module_edges(tmp_path)) in (["tts.a", "tts.b", "tts.a"], ["tts.b", "tts.a", "tts.b"])
