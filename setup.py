"""Builds the gRPC/protobuf modules in stream/wire/ from proto/ (never edited by hand) and the
compiled walker of ReadRange answers, stream/framing/_native.c (docs/operations.md)."""

from __future__ import annotations

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent.resolve()


def generate_wire_modules() -> None:
    import grpc_tools
    from grpc_tools import protoc  # build dependency (pyproject [build-system])

    include = Path(grpc_tools.__file__).parent / "_proto"
    for proto in sorted((ROOT / "proto" / "streamkeeper" / "v1").glob("*.proto")):
        # Map the proto directory onto the package path so imports read `stream.wire.X_pb2`.
        args = [
            "grpc_tools.protoc",
            f"-I{include}",
            f"-Istream/wire={proto.parent}",
            f"--python_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            f"--pyi_out={ROOT}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")


class BuildWithProto(build_py):
    def run(self) -> None:
        generate_wire_modules()
        super().run()


# Plain C against the CPython API, no third-party build tool: gcc and the Python headers are
# all it needs. No -march: it runs on any x86-64; the crc32c instruction is used where the
# processor has it (checked at import), a table elsewhere.
NATIVE = Extension(
    "stream.framing._native",
    sources=["stream/framing/_native.c"],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Werror=implicit"],
)

setup(cmdclass={"build_py": BuildWithProto}, ext_modules=[NATIVE])
