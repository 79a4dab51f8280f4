"""pipelines/ -> components/ -> trainer/, one direction, read from the source: no import against the
direction, no cycle in the trainer, and the names the compiled components import still exist."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _module_level_imports(path: Path, known: set[str]) -> set[str]:
    """The trainer modules `path` imports when it is imported (not inside functions)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n in known}


def test_trainer_never_imports_kfp_components_or_pipelines():
    for path in (REPO / "trainer").rglob("*.py"):
        bad = imported_modules(path) & {"kfp", "components", "pipelines"}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_components_never_import_pipelines():
    for path in (REPO / "components").rglob("*.py"):
        assert "pipelines" not in imported_modules(path), path


def test_trainer_has_no_import_cycle():
    """No trainer module imports, at module level, one that imports it back (directly or not)."""
    modules = {}
    for path in (REPO / "trainer").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: _module_level_imports(path, set(modules)) - {name} for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> None:
        if name in stack:
            raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(name) :], name]))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*stack, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_names_the_compiled_components_import_still_exist():
    """Compiled component YAML embeds each component's body, imports included: the image must
    serve every trainer name those published files import."""
    import importlib
    import re

    import yaml

    def strings(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from strings(v)
        elif isinstance(node, list):
            for v in node:
                yield from strings(v)

    found = set()
    for path in (REPO / "compiled").rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            for text in strings(doc):
                for module, names in re.findall(r"from (trainer[\w.]*) import ([\w, ]+)", text):
                    found |= {(module, n.split(" as ")[0].strip()) for n in names.split(",") if n.strip()}
    assert ("trainer.pipeline_steps", "select_backend") in found and ("trainer.launch.byo", "byo_job") in found
    for module, name in sorted(found):
        assert hasattr(importlib.import_module(module), name), f"compiled YAML imports {module}.{name}"
