"""stream/protocol stays pure: no I/O modules, no clock, no global randomness, no wire code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stream.protocol

PROTOCOL_DIR = Path(stream.protocol.__file__).parent
SOURCES = sorted(PROTOCOL_DIR.glob("*.py"))
FORBIDDEN_MODULES = {
    "asyncio",
    "datetime",
    "grpc",
    "kazoo",
    "lmdb",
    "os",
    "socket",
    "structlog",
    "subprocess",
    "threading",
    "time",
}


def test_sources_found() -> None:
    assert len(SOURCES) >= 12


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_io_imports_or_global_randomness(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN_MODULES, (path.name, name)
            assert not name.startswith("stream.wire"), (path.name, name)
        # `random` may only be named for its `Random` type; randomness is passed in.
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "random"
        ):
            assert node.attr == "Random", (path.name, node.attr)
        if isinstance(node, ast.ImportFrom) and node.module == "random":
            raise AssertionError(f"{path.name}: from random import ...")
