"""`streamctl append --key/--header` and `streamctl tail` showing keys and headers (text and
`--output json`), on real processes; entries without attributes print as before."""

from __future__ import annotations

import json

import pytest

from stream.client import StreamClient
from stream.sandbox.cluster import SandboxCluster
from tests.integration.cli_support import streamctl

pytestmark = [pytest.mark.integration, pytest.mark.shared_cluster]


def test_append_with_key_and_headers_and_tail_shows_them(cluster: SandboxCluster) -> None:
    metadata = cluster.metadata
    assert streamctl(metadata, "create", "keyed").returncode == 0
    assert streamctl(metadata, "append", "keyed", "-m", "plain").returncode == 0
    appended = streamctl(
        metadata,
        *("append", "keyed", "-m", "one", "-m", "two", "--key", "user-7"),
        *("--header", "trace=abc", "--header", "trace=", "--header", "kind=a=b"),
    )
    assert appended.returncode == 0, appended.stderr
    # Entry 1 is the no-op the second writer's takeover wrote.
    assert "appended 2 entries acknowledged: 2..3" in appended.stderr
    with StreamClient.connect(metadata) as client:
        got = list(client.open_reader("keyed").read(0, 3))
    assert [(e.payload, e.key, e.headers) for e in got] == [
        (b"plain", None, ()),
        *[
            (p, b"user-7", (("trace", b"abc"), ("trace", b""), ("kind", b"a=b")))
            for p in (b"one", b"two")
        ],
    ]

    tail = ("tail", "keyed", "--from", "earliest", "--timeout", "1")
    text = streamctl(metadata, *tail)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == [
        "plain",
        "key=user-7\ttrace=abc\ttrace=\tkind=a=b\tone",
        "key=user-7\ttrace=abc\ttrace=\tkind=a=b\ttwo",
    ]
    with_ids = streamctl(metadata, *tail, "--show-ids")
    lines = [line.split("\t") for line in with_ids.stdout.splitlines()]
    assert [line[0] for line in lines] == ["0", "2", "3"]
    assert lines[0][2:] == ["plain"] and lines[1][2] == "key=user-7"

    as_json = streamctl(metadata, "--output", "json", *tail)
    assert as_json.returncode == 0, as_json.stderr
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(r["entry_id"], r["payload"], r["key"], r["headers"]) for r in rows] == [
        (0, "plain", None, []),
        (2, "one", "user-7", [["trace", "abc"], ["trace", ""], ["kind", "a=b"]]),
        (3, "two", "user-7", [["trace", "abc"], ["trace", ""], ["kind", "a=b"]]),
    ]
    assert all(isinstance(r["timestamp_ms"], int) for r in rows)


def test_a_header_without_a_name_is_a_usage_error(cluster: SandboxCluster) -> None:
    assert streamctl(cluster.metadata, "create", "strict").returncode == 0
    for bad in ("novalue", "=value"):
        result = streamctl(cluster.metadata, "append", "strict", "-m", "x", "--header", bad)
        assert result.returncode == 2
        assert "--header" in result.stderr and "name=value" in result.stderr
    with StreamClient.connect(cluster.metadata) as client:
        assert client.stream_info("strict").lac == -1
