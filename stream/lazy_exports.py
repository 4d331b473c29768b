"""Names a package re-exports, loaded on first use (PEP 562): importing one light module of the
package does not import the heavy ones (grpc, kazoo) the package's other names live in."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, sources: Mapping[str, str]) -> Callable[[str], Any]:
    """Returns the module `__getattr__` of `package` for `sources`, {name: "module"} or
    {name: "module:name there"}; each name is imported once, then kept in the package."""

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = source.partition(":")
        value = getattr(importlib.import_module(module), attribute or name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
