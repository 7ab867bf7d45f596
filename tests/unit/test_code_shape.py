"""The code's shape: no module under cupyglm/ over MAX_FILE_LINES lines, no function or method over
MAX_FUNC_LINES lines (from its `def` to its last line, nested functions included in their parent). KNOWN holds
the few files allowed past a limit for now, each with its reason; an entry that no longer breaks a limit fails
too, so the list only shrinks."""
from __future__ import annotations

import ast
from pathlib import Path

import cupyglm

MAX_FILE_LINES = 400
MAX_FUNC_LINES = 80
ROOT = Path(cupyglm.__file__).parent

# file (relative to cupyglm/) -> why it may break a limit for now
KNOWN: dict[str, str] = {}


def shape_problems(source: str, max_file: int = MAX_FILE_LINES, max_func: int = MAX_FUNC_LINES) -> list[str]:
    """What in `source` breaks a limit: the file's length, each function (by qualified name) over max_func."""
    out = []
    n = len(source.splitlines())
    if n > max_file:
        out.append(f"{n} lines (at most {max_file})")

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = child.end_lineno - child.lineno + 1
                    if length > max_func:
                        out.append(f"{name}() is {length} lines (at most {max_func})")
                walk(child, f"{name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return out


def _function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}():\n{body}"


def test_a_function_past_the_limit_is_named():
    ok = _function("fits", MAX_FUNC_LINES - 1)
    assert shape_problems(ok) == []
    long = _function("too_long", MAX_FUNC_LINES)
    assert shape_problems(long) == [f"too_long() is {MAX_FUNC_LINES + 1} lines (at most {MAX_FUNC_LINES})"]


def test_methods_and_nested_functions_are_measured_with_their_names():
    method = "class C:\n" + _function("m", MAX_FUNC_LINES, indent="    ")
    assert shape_problems(method) == [f"C.m() is {MAX_FUNC_LINES + 1} lines (at most {MAX_FUNC_LINES})"]
    nested = "async def outer():\n" + _function("inner", 3, indent="    ") + "    x = 1\n" * (MAX_FUNC_LINES - 4)
    assert shape_problems(nested) == [f"outer() is {MAX_FUNC_LINES + 1} lines (at most {MAX_FUNC_LINES})"]


def test_a_file_past_the_limit_is_named():
    assert shape_problems("x = 1\n" * MAX_FILE_LINES) == []
    assert shape_problems("x = 1\n" * (MAX_FILE_LINES + 1)) == [f"{MAX_FILE_LINES + 1} lines (at most "
                                                                f"{MAX_FILE_LINES})"]


def test_every_module_keeps_the_limits():
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        problems = shape_problems(path.read_text(encoding="utf-8"))
        if problems:
            found[rel] = problems
    broken = {rel: p for rel, p in found.items() if rel not in KNOWN}
    assert not broken, "split these by concept or into named helpers:\n" + "\n".join(
        f"  cupyglm/{rel}: {'; '.join(p)}" for rel, p in broken.items())
    stale = sorted(set(KNOWN) - set(found))
    assert not stale, f"these keep the limits now; remove them from KNOWN: {stale}"
