"""Layers point down only (docs/architecture.md §1): no module under cupyglm/ imports a layer above its own.

Every import counts: module level, inside functions, relative, and importlib.import_module of a literal name.
LAYERS is the doc's list, top first; the doc's §1 block names the same layers in the same order (checked here).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# (the doc's name, the modules it holds), top first. "pkg.*" is a subtree; a bare name is that module only, and
# wins over any subtree (the ops half of backend/ sits above kernels/, the numerics half below).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cli/", ("cupyglm", "cupyglm.cli.*")),
    ("server/", ("cupyglm.server.*",)),
    ("engine/", ("cupyglm.engine.*",)),
    ("model/", ("cupyglm.model.*",)),
    ("distributed/", ("cupyglm.distributed.*",)),
    ("kv/", ("cupyglm.kv.*",)),
    ("memory.py", ("cupyglm.memory",)),
    ("checkpoint/", ("cupyglm.checkpoint.*",)),
    ("vision/", ("cupyglm.vision.*",)),
    ("contract/", ("cupyglm.contract.*",)),
    ("backend/", ("cupyglm.backend", "cupyglm.backend._dispatch", "cupyglm.backend.sim_ops",
                  "cupyglm.backend.cuda_ops")),
    ("kernels/", ("cupyglm.kernels.*",)),
    ("backend/", ("cupyglm.backend.*",)),
    ("config.py", ("cupyglm.config", "cupyglm.config_hf", "cupyglm.config_vision")),
    ("settings.py", ("cupyglm.settings", "cupyglm.settings_flags")),
    ("env.py", ("cupyglm.env",)),
)


def layer_of(module: str) -> int | None:
    """Index in LAYERS of a cupyglm module (exact names first, then the longest subtree), None outside cupyglm."""
    if module != "cupyglm" and not module.startswith("cupyglm."):
        return None
    for i, (_, mods) in enumerate(LAYERS):
        if module in mods:
            return i
    best, best_len = None, -1
    for i, (_, mods) in enumerate(LAYERS):
        for m in mods:
            base = m[:-2] if m.endswith(".*") else None
            if base and (module == base or module.startswith(base + ".")) and len(base) > best_len:
                best, best_len = i, len(base)
    return best


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(root: Path, node: ast.AST, module: str, is_pkg: bool) -> list[str]:
    """The modules an import node names; `from a import b` names a.b when b is a module file, else a."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_pkg else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            src = ".".join(base + ([node.module] if node.module else []))
        else:
            src = node.module or ""
        out = []
        for a in node.names:
            sub = root.joinpath(*f"{src}.{a.name}".split("."))
            out.append(f"{src}.{a.name}" if sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                       else src)
        return out
    if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return [node.args[0].value]
    return []


def upward_imports(root: Path) -> list[str]:
    """'module (layer) imports target (layer above) at line n' for every upward import under root/cupyglm."""
    bad = []
    for path in sorted((root / "cupyglm").rglob("*.py")):
        module = _module_name(root, path)
        own = layer_of(module)
        if own is None:
            bad.append(f"{module}: in no layer of LAYERS")
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(root, node, module, path.name == "__init__.py"):
                up = layer_of(target)
                if up is not None and up < own:
                    bad.append(f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[up][0]}, above) at line "
                               f"{node.lineno}")
    return bad


def test_layers_point_down_only():
    assert upward_imports(REPO) == []


def test_the_doc_lists_the_same_layers_in_the_same_order():
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index("## 1. Layers"):text.index("## 2.")]
    block = section[section.index("```\ncupyglm/"):].split("```")[1]
    names = re.findall(r"^  (\S+/|\S+\.py)\s", block, flags=re.M)
    assert names == [name for name, _ in LAYERS]
    assert "tests/unit/test_layers.py" in section


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, src in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src)
    return tmp_path


@pytest.mark.parametrize("planted", [
    "from cupyglm.engine import sampling\n",
    "def f():\n    from cupyglm.engine.sampling import draw\n    return draw\n",
    "import cupyglm.engine.sampling\n",
    "from ..engine import sampling\n",
    "import importlib\nM = importlib.import_module('cupyglm.engine.sampling')\n",
])
def test_a_planted_upward_import_is_caught(tmp_path, planted):
    root = _tree(tmp_path, {"cupyglm/__init__.py": "", "cupyglm/engine/__init__.py": "",
                            "cupyglm/engine/sampling.py": "from cupyglm.kernels import ops\n",
                            "cupyglm/kernels/__init__.py": "", "cupyglm/kernels/ops.py": planted})
    bad = upward_imports(root)
    assert len(bad) == 1 and bad[0].startswith("cupyglm.kernels.ops (kernels/) imports cupyglm.engine")


def test_the_backend_halves_sit_on_either_side_of_kernels():
    assert layer_of("cupyglm.backend.sim_ops") < layer_of("cupyglm.kernels.ops") < layer_of("cupyglm.backend.lanes")
    assert layer_of("cupyglm.backend") < layer_of("cupyglm.kernels") and layer_of("numpy") is None


def test_a_module_in_no_layer_is_named(tmp_path):
    root = _tree(tmp_path, {"cupyglm/__init__.py": "", "cupyglm/newpkg/__init__.py": ""})
    assert upward_imports(root) == ["cupyglm.newpkg: in no layer of LAYERS"]
