"""`streamctl retention set|show|run --once` against a real ZooKeeper (no bookies needed).
`set` and `show` run in-process through the parser (main() would configure logging to the
captured stderr for the rest of the session); `run --once` runs as a process."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from stream.cli.main import build_parser
from stream.errors import InvalidArgumentError
from stream.metadata import CursorStore, MetadataSession, RetentionPolicy, StreamStore
from tests.unit.retention.support import NOW_MS, build_stream

pytestmark = pytest.mark.integration


def run(metadata: str, *args: str) -> int:
    parsed = build_parser().parse_args(["--metadata", metadata, "retention", *args])
    return int(parsed.handler(parsed) or 0)


def test_set_and_show_in_human_units(
    metadata_root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with MetadataSession.connect(metadata_root) as session:
        store = StreamStore(session)
        meta = build_stream(store, "orders", [(3 << 20, NOW_MS)] * 3)

        assert run(metadata_root, "set", "orders", "--max-age", "7d", "--max-bytes", "10GiB") == 0
        assert "max age 7d, max bytes 10 GiB" in capsys.readouterr().out
        assert store.get_stream_by_id(meta.id)[0].retention == RetentionPolicy(
            max_age_s=7 * 86400, max_bytes=10 << 30
        )
        # One limit changed, the other kept; 'none' removes one.
        assert run(metadata_root, "set", "orders", "--max-bytes", "5MiB") == 0
        assert store.get_stream_by_id(meta.id)[0].retention == RetentionPolicy(
            max_age_s=7 * 86400, max_bytes=5 << 20
        )
        assert run(metadata_root, "set", "orders", "--max-age", "none") == 0
        assert store.get_stream_by_id(meta.id)[0].retention == RetentionPolicy(max_bytes=5 << 20)
        capsys.readouterr()

        assert run(metadata_root, "show", "orders") == 0
        shown = capsys.readouterr().out
        assert "max bytes 5 MiB" in shown
        assert "9 MiB" in shown  # three closed fragments of 3 MiB
        assert "2 fragments" in shown  # due: only the newest 3 MiB fits 5 MiB

        # Bad input changes nothing and says why.
        for bad in (
            ["--max-age", "7 days"],
            ["--max-bytes", "-1"],
            [],
            ["--clear", "--max-age", "1d"],
        ):
            with pytest.raises(InvalidArgumentError):
                run(metadata_root, "set", "orders", *bad)
        assert store.get_stream_by_id(meta.id)[0].retention == RetentionPolicy(max_bytes=5 << 20)

        # One round now (no election): the policy applies.
        once = subprocess.run(
            [sys.executable, "-m", "stream.cli.main", "--metadata", metadata_root]
            + ["retention", "run", "--once"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert once.returncode == 0, once.stderr
        assert "deleted 2 fragments" in once.stderr
        assert [f.first_entry_id for f in store.get_fragments(meta.id)] == [20, 30]

        assert run(metadata_root, "set", "orders", "--clear") == 0
        assert store.get_stream_by_id(meta.id)[0].retention is None


def test_keep_unconsumed_set_and_shown_with_what_each_cursor_holds(
    metadata_root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with MetadataSession.connect(metadata_root) as session:
        store = StreamStore(session)
        old = int(time.time() * 1000) - 10**9  # every closed fragment is past a 1-day limit
        meta = build_stream(store, "orders", [(1 << 20, old)] * 4)
        CursorStore(session).commit(meta.id, "slow", 14)
        CursorStore(session).commit(meta.id, "fast", 29)

        assert run(metadata_root, "set", "orders", "--max-age", "1d", "--keep-unconsumed") == 0
        assert "keeping what cursors have not consumed" in capsys.readouterr().out
        policy = RetentionPolicy(max_age_s=86400, keep_unconsumed=True)
        assert store.get_stream_by_id(meta.id)[0].retention == policy
        # Another limit changed: the flag stays.
        assert run(metadata_root, "set", "orders", "--max-bytes", "1GiB") == 0
        kept = store.get_stream_by_id(meta.id)[0].retention
        assert kept is not None and kept.keep_unconsumed
        capsys.readouterr()

        assert run(metadata_root, "show", "orders", "--output", "json") == 0
        report = json.loads(capsys.readouterr().out)
        # Fragments 0..9 are consumed by both; slow (at 14) holds 10..39, fast (at 29) 30..39.
        assert report["fragments_due_for_deletion"] == 1
        assert report["fragments_held_by_cursors"] == 3
        assert report["cursors"] == {
            "slow": {"position": 14, "held_fragments": 3, "held_bytes": 3 << 20},
            "fast": {"position": 29, "held_fragments": 1, "held_bytes": 1 << 20},
        }
        assert run(metadata_root, "show", "orders") == 0
        assert "cursor slow (at 14)" in capsys.readouterr().out

        assert run(metadata_root, "set", "orders", "--no-keep-unconsumed") == 0
        kept = store.get_stream_by_id(meta.id)[0].retention
        assert kept is not None and not kept.keep_unconsumed
