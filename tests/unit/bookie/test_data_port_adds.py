"""The data port's Add streams over the real storage engine (in tmp_path), in-process: answers
in request order once durable, a batch whose term is checked against metadata holding the
later ones back, the in-flight bound stopping the reads, the writer's end closing the stream
after its answers, and a failed journal sync answered INTERNAL."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from stream.bookie.access import AccessControl
from stream.bookie.data_port import DataPort
from stream.bookie.storage import StreamStorage
from stream.bookie.storage.journal import Journal
from stream.bookie.terms import MetadataTerms, StreamFacts
from stream.client.ports import answered_codes
from stream.sandbox.ports import free_port
from stream.wire import bookie_pb2 as pb
from stream.wire import frames

from ..polling import holds_for, until
from .test_server import Harness, add, start

_TIMEOUT_S = 10.0


class JournalSteps:
    """Holds each of the real journal thread's group commits until `allow` lets it go, one
    commit per call; `let_go` lets every commit go from then on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._permits = threading.Semaphore(0)
        self.free = False
        self.held = 0  # commits that reached the hold
        original = Journal._commit_group
        steps = self

        def held_commit(journal: Journal, items: list[tuple[int, object]], fut: Any) -> None:
            steps.held += 1
            if not steps.free and not steps._permits.acquire(timeout=30):
                raise TimeoutError("journal commit never allowed")
            original(journal, items, fut)

        monkeypatch.setattr(Journal, "_commit_group", held_commit)

    def allow(self, commits: int = 1) -> None:
        self._permits.release(commits)

    def let_go(self) -> None:
        self.free = True
        self._permits.release(1000)


class Writer:
    """A writer's end of one data port connection (asyncio streams)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: DataPort
    ) -> None:
        self.reader, self.writer, self.port = reader, writer, port

    def add(self, request: pb.AddRequest) -> None:
        self.writer.write(frames.frame(request.SerializeToString()))

    async def answer(self) -> pb.AddResponse | None:
        """The next answer; None once the bookie closed the connection."""
        try:
            head = await asyncio.wait_for(self.reader.readexactly(frames.LENGTH.size), _TIMEOUT_S)
        except asyncio.IncompleteReadError:
            return None
        (size,) = frames.LENGTH.unpack(head)
        body = await asyncio.wait_for(self.reader.readexactly(size), _TIMEOUT_S)
        assert body[:1] == frames.ANSWER, body
        return pb.AddResponse.FromString(body[1:])

    async def nothing_for(self, seconds: float) -> bool:
        """Returns whether no byte came for `seconds`."""
        try:
            await asyncio.wait_for(self.reader.read(1), seconds)
        except TimeoutError:
            return True
        return False


def run_port(
    tmp_path: Path,
    body: Callable[[Harness, Writer], Awaitable[None]],
    *,
    metadata_terms: Callable[[StreamStorage], MetadataTerms] | None = None,
    steps: JournalSteps | None = None,
    preamble: bytes = frames.PREAMBLE,
    **overrides: Any,
) -> None:
    """Runs `body` against a service over the real storage, with one writer connected to its
    data port with `preamble` (the protocol's version); `overrides` are config keys. `steps`
    is let go at the end, pass or fail."""
    overrides.setdefault("data_listen", f"127.0.0.1:{free_port()}")

    async def main() -> None:
        h, server = await start(tmp_path, metadata_terms=metadata_terms, **overrides)
        config = h.service._config
        port = DataPort.bind(config, AccessControl(config), None)
        assert port is not None
        await port.start(h.service)
        host, number = config.data_listen.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(number))
        writer.write(preamble + frames.frame(config.bookie_id.encode()))
        try:
            await asyncio.wait_for(body(h, Writer(reader, writer, port)), 30)
        finally:
            if steps is not None:
                steps.let_go()
            writer.close()
            await port.stop(1.0)
            await h.channel.close()
            await server.stop(0)
            h.storage.close()

    asyncio.run(main())


def _stored_up_to(h: Harness, stream_id: int) -> int:
    state = h.storage.stream_state(stream_id)
    return -1 if state is None else state.last_entry_id


def test_pipelined_batches_are_answered_in_order_once_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = JournalSteps(monkeypatch)

    async def body(h: Harness, w: Writer) -> None:
        w.add(add(1, 1, range(0, 10), rid=0))
        await until(lambda: steps.held == 1)  # the journal thread holds batch 0's group
        # The later batches reach the storage (a second group) before any is durable...
        for i in range(1, 20):
            w.add(add(1, 1, range(i * 10, i * 10 + 10), rid=i))
        await until(lambda: _stored_up_to(h, 1) == 199)
        assert await w.nothing_for(0.2)
        # ...and only the first group's batch is answered when only its commit completes.
        steps.allow()
        first = await w.answer()
        assert first is not None and first.request_id == 0
        assert await w.nothing_for(0.2)
        steps.allow()
        answers = [first] + [await w.answer() for _ in range(19)]
        assert [a.request_id for a in answers if a] == list(range(20))
        for i, a in enumerate(answers):
            assert a is not None
            # Version 2: the ids as a range, one code for all of them.
            assert (a.first_entry_id, a.entry_count, list(a.entry_ids)) == (i * 10, 10, [])
            assert list(a.codes) == [pb.OK]

    run_port(tmp_path, body, steps=steps)


@pytest.mark.parametrize("preamble", [frames.PREAMBLE, frames.PREAMBLE_V1])
def test_answers_name_ranges_in_version_2_and_every_id_in_version_1(
    tmp_path: Path, preamble: bytes
) -> None:
    ranged = preamble == frames.PREAMBLE

    async def body(h: Harness, w: Writer) -> None:
        w.add(add(1, 1, range(0, 5), rid=0))
        w.add(add(1, 1, [5, 7, 6], rid=1))  # not consecutive in order: every id, either way
        w.add(add(1, 1, range(8, 10), rid=2, lac=-2))  # a LAC below -1: refused whole
        w.add(add(1, 1, [], rid=3))  # an explicit LAC: one code, no id
        answers = [await w.answer() for _ in range(4)]
        assert all(a is not None for a in answers)
        whole, unordered, refused, explicit = answers
        assert whole is not None and unordered is not None
        assert refused is not None and explicit is not None
        if ranged:
            assert (whole.first_entry_id, whole.entry_count, list(whole.entry_ids)) == (0, 5, [])
            assert list(whole.codes) == [pb.OK]
            assert (refused.entry_count, list(refused.codes)) == (2, [pb.BAD_REQUEST])
        else:
            assert (whole.entry_count, list(whole.entry_ids)) == (0, [0, 1, 2, 3, 4])
            assert list(whole.codes) == [pb.OK] * 5
            assert list(refused.codes) == [pb.BAD_REQUEST] * 2
        assert (unordered.entry_count, list(unordered.entry_ids)) == (0, [5, 7, 6])
        assert list(unordered.codes) == [pb.OK] * 3
        assert (explicit.entry_count, list(explicit.entry_ids), len(explicit.codes)) == (0, [], 1)

    run_port(tmp_path, body, preamble=preamble)


def test_a_full_window_stops_the_reads_until_answers_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = JournalSteps(monkeypatch)

    async def body(h: Harness, w: Writer) -> None:
        for i in range(10):
            w.add(add(1, 1, range(i * 10, i * 10 + 10), rid=i))
        # Three batches in flight, the bound: the rest wait in the socket, not in the storage.
        await until(lambda: _stored_up_to(h, 1) == 29)
        assert await holds_for(0.2, lambda: _stored_up_to(h, 1) == 29)
        steps.let_go()
        answers = [await w.answer() for _ in range(10)]
        assert [a.request_id for a in answers if a] == list(range(10))
        assert all(answered_codes(a) == [pb.OK] * 10 for a in answers if a)
        assert _stored_up_to(h, 1) == 99

    run_port(tmp_path, body, steps=steps, add_max_inflight_batches=3)


class SlowMetadata:
    """Metadata holding stream 3 at term 2, whose reads wait until `release` is set, and
    stream 5 at term 1, read at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.reads: list[int] = []

    async def read_facts(self, stream_id: int) -> StreamFacts | None:
        self.reads.append(stream_id)
        if stream_id == 3:
            await self.release.wait()
            return StreamFacts(2, 0)
        return StreamFacts(1, 0) if stream_id == 5 else None


def test_a_batch_whose_term_is_checked_holds_the_later_batches(tmp_path: Path) -> None:
    metadata = SlowMetadata()

    async def body(h: Harness, w: Writer) -> None:
        w.add(add(5, 1, range(0, 2), rid=1))
        first = await w.answer()
        assert first is not None and answered_codes(first) == [pb.OK] * 2
        # A term the bookie has not seen is checked against metadata first; the batches behind
        # it are not taken meanwhile, even one that needs no check (its answer comes after).
        w.add(add(3, 2, range(0, 2), rid=2))
        w.add(add(5, 1, range(2, 4), lac=1, rid=3))
        w.add(add(3, 2, range(2, 4), lac=0, rid=4))
        await until(lambda: metadata.reads == [5, 3])
        assert await w.nothing_for(0.2)
        assert h.storage.stream_state(3) is None
        assert _stored_up_to(h, 5) == 1
        metadata.release.set()
        answers = [await w.answer() for _ in range(3)]
        assert [a.request_id for a in answers if a] == [2, 3, 4]
        assert all(answered_codes(a) == [pb.OK] * 2 for a in answers if a)
        assert metadata.reads == [5, 3]  # once per stream: the later batches found it checked

    run_port(
        tmp_path, body, metadata_terms=lambda storage: MetadataTerms(storage, metadata.read_facts)
    )


def test_the_writers_end_closes_the_stream_after_its_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = JournalSteps(monkeypatch)

    async def body(h: Harness, w: Writer) -> None:
        for i in range(3):
            w.add(add(1, 1, range(i * 2, i * 2 + 2), rid=i))
        await until(lambda: _stored_up_to(h, 1) == 5)
        w.writer.write_eof()  # the writer is done sending; its answers are still due
        await until(lambda: all(c._writer_done for c in w.port._connections))
        steps.let_go()
        answers = [await w.answer() for _ in range(3)]
        assert [a.request_id for a in answers if a] == [0, 1, 2]
        assert await w.answer() is None  # then the bookie closes the connection

    run_port(tmp_path, body, steps=steps)


def test_a_failed_journal_sync_answers_internal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = JournalSteps(monkeypatch)

    def failing_sync(journal: Journal, group: Any) -> None:
        raise OSError(5, "Input/output error")

    async def body(h: Harness, w: Writer) -> None:
        w.add(add(1, 1, range(0, 3), rid=7))
        await until(lambda: _stored_up_to(h, 1) == 2)
        monkeypatch.setattr(Journal, "_sync", failing_sync)
        steps.let_go()
        answer = await w.answer()
        assert answer is not None and answer.request_id == 7
        assert answered_codes(answer) == [pb.INTERNAL] * 3
        assert "journal failure" in answer.message

    run_port(tmp_path, body, steps=steps)
