"""`streamctl bookies`: one row per bookie that joined, from its registration in ZooKeeper."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from stream.metadata import BookieRegistration, BookieRegistry, MetadataSession
from stream.metadata.underreplication import UnderreplicationStore
from tests.unit.cli.conftest import Streamctl


@pytest.fixture
def registry(metadata_root: str) -> Iterator[BookieRegistry]:
    """Three registered bookies (one read-only without the journal, one draining) and one that
    joined once and is down now."""
    with MetadataSession.connect(metadata_root) as session:
        registry = BookieRegistry(session)
        registry.register("bookie-1", BookieRegistration("127.0.0.1:3181", free_bytes=80 << 30))
        registry.register(
            "bookie-2",
            BookieRegistration("127.0.0.1:3182", read_only=True, journal_write_data=False),
        )
        registry.register("bookie-3", BookieRegistration("127.0.0.1:3183", read_only=True))
        for bookie_id in ("bookie-1", "bookie-2", "bookie-3", "bookie-4"):
            registry.write_cookie(bookie_id, b"cookie", None)
        UnderreplicationStore(session).set_draining("bookie-3", True)
        yield registry


def test_bookies_as_json_lines(
    registry: BookieRegistry, streamctl: Streamctl, capsys: pytest.CaptureFixture[str]
) -> None:
    assert streamctl("bookies", "--output", "json") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["bookie_id"], r["state"]) for r in rows] == [
        ("bookie-1", "available"),
        ("bookie-2", "read-only"),
        ("bookie-3", "draining"),
        ("bookie-4", "down"),
    ]
    assert rows[0]["address"] == "127.0.0.1:3181" and rows[0]["free_bytes"] == 80 << 30
    assert rows[1]["journal_write_data"] is False and rows[2]["draining"] is True
    assert rows[3]["address"] is None


def test_bookies_table(
    registry: BookieRegistry, streamctl: Streamctl, capsys: pytest.CaptureFixture[str]
) -> None:
    assert streamctl("bookies") == 0
    out = capsys.readouterr().out
    (first,) = [line for line in out.splitlines() if "bookie-1" in line]
    assert "127.0.0.1:3181" in first and "available" in first and "80 GiB" in first
    (second,) = [line for line in out.splitlines() if "bookie-2" in line]
    assert "read-only" in second and "off" in second
