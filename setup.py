"""Builds the gRPC/protobuf modules in stream/wire/ from proto/ (never edited by hand)."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
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


setup(cmdclass={"build_py": BuildWithProto})
