"""A transport and an owner for driving `AddPipeline` alone in unit tests: every batch is
recorded and answered OK (at once, or after the transport's `answer_after_s`; naming every id,
or with `ranged` as a data port of version 2 does when the ids are consecutive), and any failure
reported to the owner fails the test."""

from __future__ import annotations

import asyncio

from stream.client.ports import AddBatch
from stream.wire import bookie_pb2 as pb


class _Stream:
    def __init__(
        self,
        sent: list[tuple[float, str, AddBatch]],
        bookie_id: str,
        answer_after_s: float,
        ranged: bool,
    ) -> None:
        self._sent = sent
        self._bookie_id = bookie_id
        self._answer_after_s = answer_after_s
        self._ranged = ranged

    def send(self, batch: AddBatch) -> asyncio.Future[pb.AddResponse]:
        loop = asyncio.get_running_loop()
        self._sent.append((loop.time(), self._bookie_id, batch))
        future: asyncio.Future[pb.AddResponse] = loop.create_future()
        ids = [e.entry_id for e in batch.entries]
        if self._ranged and ids and ids == list(range(ids[0], ids[0] + len(ids))):
            answer = pb.AddResponse(first_entry_id=ids[0], entry_count=len(ids), codes=[pb.OK])
        else:
            answer = pb.AddResponse(entry_ids=ids, codes=[pb.OK] * len(ids))
        if self._answer_after_s:
            loop.call_later(self._answer_after_s, future.set_result, answer)
        else:
            future.set_result(answer)
        return future

    def close(self) -> None:
        pass


class RecordingTransport:
    """`sent`: (loop time, bookie id, batch) of every batch, in the order sent."""

    def __init__(self, answer_after_s: float = 0.0, *, ranged: bool = False) -> None:
        self.sent: list[tuple[float, str, AddBatch]] = []
        self.answer_after_s = answer_after_s
        self.ranged = ranged

    def open_add_stream(self, bookie_id: str, *, data_port: bool | None = None) -> _Stream:
        return _Stream(self.sent, bookie_id, self.answer_after_s, self.ranged)


class StrictOwner:
    """`acknowledged`: the ids the pipeline acknowledged, in order; anything else raises."""

    def __init__(self) -> None:
        self.acknowledged: list[int] = []

    def on_acknowledged(self, entry_ids: range) -> None:
        self.acknowledged.extend(entry_ids)

    def on_fully_replicated(self) -> None:
        pass

    def on_bookie_failed(self, bookie_id: str, reason: str) -> None:
        raise AssertionError(reason)

    def on_invalid_term(self, bookie_id: str, bookie_term: int) -> None:
        raise AssertionError(bookie_id)

    def on_trimmed(self, bookie_id: str, message: str) -> None:
        raise AssertionError(message)

    def on_error(self, error: Exception) -> None:
        raise error
