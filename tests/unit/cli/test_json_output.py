"""`--output json` for scripts (one JSON object, or one line per stream of a list) and tables
that are not folded when stdout is not a terminal."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from stream.metadata import MetadataSession
from stream.metadata.underreplication import Marker, UnderreplicationStore
from tests.unit.cli.conftest import Streamctl


@pytest.fixture
def session(metadata_root: str) -> Iterator[MetadataSession]:
    with MetadataSession.connect(metadata_root) as session:
        yield session


def _create(streamctl: Streamctl, name: str, *options: str) -> None:
    quorum = ("--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1")
    assert streamctl("create", "--allow-fewer-bookies", name, *quorum, *options) == 0


def test_streams_as_json_lines(streamctl: Streamctl, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("b", "a"):
        _create(streamctl, name)
    capsys.readouterr()
    assert streamctl("streams", "--output", "json") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == [{"name": "a"}, {"name": "b"}]
    assert streamctl("streams") == 0
    assert capsys.readouterr().out.splitlines() == ["a", "b"]


def test_info_as_one_object(streamctl: Streamctl, capsys: pytest.CaptureFixture[str]) -> None:
    _create(streamctl, "orders")
    capsys.readouterr()
    assert streamctl("--output", "json", "info", "orders") == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["name"], info["state"], info["ensemble_size"]) == ("orders", "OPEN", 1)
    assert isinstance(info["fragments"], list) and "term_history" in info


def test_retention_show_as_json_and_a_table_in_human_units(
    streamctl: Streamctl, capsys: pytest.CaptureFixture[str]
) -> None:
    _create(streamctl, "kept", "--retention-max-bytes", "80000000000")
    capsys.readouterr()
    assert streamctl("retention", "show", "kept", "--output", "json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_bytes"] == 80_000_000_000 and report["max_age_s"] is None
    assert report["fragments_due_for_deletion"] == 0 and report["writer_alive"] is False
    assert streamctl("retention", "show", "kept") == 0
    assert "74.5 GiB" in capsys.readouterr().out


def test_underreplicated_as_json(
    streamctl: Streamctl, session: MetadataSession, capsys: pytest.CaptureFixture[str]
) -> None:
    store = UnderreplicationStore(session)
    store.mark(Marker(7, 100, ("bookie-2",), "lost", marked_ms=1))
    store.set_draining("bookie-3", True)
    assert streamctl("underreplicated", "--output", "json") == 0
    report = json.loads(capsys.readouterr().out)
    (fragment,) = report["fragments"]
    assert fragment["stream"] == "#7 (gone)" and fragment["first_entry_id"] == 100
    assert fragment["replace"] == ["bookie-2"] and fragment["worker"] is None
    assert report["draining"] == ["bookie-3"]


def test_tables_are_not_folded_in_a_pipe(
    streamctl: Streamctl,
    session: MetadataSession,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    store = UnderreplicationStore(session)
    store.mark(Marker(7, 123456789, ("bookie-with-a-long-name-1",), "lost", marked_ms=1))
    assert streamctl("underreplicated") == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "123456789" in line]
    assert len(rows) == 1 and "bookie-with-a-long-name-1" in rows[0]
