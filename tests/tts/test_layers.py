"""The package's architecture, checked: imports flow one way (model -> frontend, codec -> inference -> data ->
eval, training; `agent` on top) and loading a voice never loads training or evaluation code."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANK = {"paths": 0, "typed_yaml": 0, "cli": 1, "model": 1, "frontend": 2, "codec": 2, "inference": 3, "data": 4, "eval": 5, "training": 6}


def _tts_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `tts.*` import in a file, function-level ones included."""
    return [(node.lineno, node.module) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tts.")]


def _layer(path: Path) -> str:
    parts = path.relative_to(ROOT / "tts").parts
    return parts[0] if len(parts) > 1 else path.stem


def test_every_module_sits_in_a_known_layer():
    for path in (ROOT / "tts").rglob("*.py"):
        if path.name != "__init__.py" or path.parent != ROOT / "tts":
            assert _layer(path) in RANK, f"{path}: not in a layer of tts/"


def test_imports_flow_one_way():
    upward = []
    for path in (ROOT / "tts").rglob("*.py"):
        if path.parent == ROOT / "tts" and path.name == "__init__.py":
            continue
        here = _layer(path)
        for line, module in _tts_imports(path):
            there = module.split(".")[1]
            if there != here and RANK[there] >= RANK[here]:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {module}")
    assert not upward, "\n".join(upward)


def test_the_rule_catches_an_upward_import(tmp_path):
    """Control: the same parse sees a function-level import of training code."""
    path = tmp_path / "synthesis.py"
    path.write_text("def f():\n    from tts.training.trainer import Trainer\n")
    assert _tts_imports(path) == [(2, "tts.training.trainer")]


@pytest.mark.parametrize("module", ["tts.inference", "tts.inference.pipeline", "tts.inference.synthesis", "agent.chat", "agent.orchestrator"])
def test_speaking_loads_no_training_or_eval_code(module):
    code = (f"import sys, {module}; "
            "print(sorted(m for m in sys.modules if m.startswith(('tts.training', 'tts.eval', 'tts.data'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
