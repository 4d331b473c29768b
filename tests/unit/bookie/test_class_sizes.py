"""No class of the bookie package holds more than ~400 lines (issue 21): a class that grows
past it usually holds two jobs (STYLE.md), as `StreamStorage` (1,273 lines) and `BookieCore`
(506) did before they were split by job. Read with `ast`, so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import stream.bookie

BOOKIE_DIR = Path(stream.bookie.__file__).parent
MAX_CLASS_LINES = 400


def class_sizes(root: Path) -> dict[str, int]:
    """Returns the length in lines of every class under `root`, by `path:ClassName`."""
    sizes: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                name = f"{path.relative_to(root)}:{node.name}"
                sizes[name] = node.end_lineno - node.lineno + 1
    return sizes


def test_no_bookie_class_over_the_bound() -> None:
    sizes = class_sizes(BOOKIE_DIR)
    assert "storage/storage.py:StreamStorage" in sizes  # the walk sees the package
    too_big = {name: lines for name, lines in sizes.items() if lines > MAX_CLASS_LINES}
    assert not too_big, f"classes over {MAX_CLASS_LINES} lines: {too_big}"
