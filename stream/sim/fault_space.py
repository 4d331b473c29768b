"""The random runs' fault space beyond one stream and its writers (issue 15): several streams
with their own competing writers and readers, explicit trims and deletes during the writes
(through the shipping client's `stream.client.stream_admin`), deleted streams created again
under their names (`stream.sim.incarnations`), and the real background services racing the
writers: the auditor, replication workers and scrub, and the retention service with a policy
on every stream. `RandomWorkload` adds these actions when the run's
BUGGIFY knobs (`stream.sim.buggify`) say so; the bookie's `TOO_BUSY` is provoked by the
cluster shape (`SimConfig.write_cache_max_bytes`).

Every choice comes from the run's random source, so a seed replays identically.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any

from stream.client.stream_admin import delete_stream, trim_stream
from stream.errors import StreamError
from stream.metadata.model import RetentionPolicy
from stream.sim.buggify import Knobs
from stream.sim.cluster import STREAM_NAME, SimStream, Simulation, payload_of
from stream.sim.incarnations import IncarnationChecker, Origins
from stream.sim.loop import close_when_done

# A bookie's write cache this small, flushed this late, fills with a few writers' batches: the
# next ones are answered TOO_BUSY until the flush empties it.
TOO_BUSY_CACHE_BYTES = 512
TOO_BUSY_FLUSH_S = 0.05
# The trims' and deletes' `Trim` calls to bookies give up after this (their GC catches up).
_TRIM_TIMEOUT_S = 0.3
# How long after a delete ends its stream is created again (`recreate`).
_RECREATE_AFTER_S = (0.0, 0.0, 0.01, 0.05, 0.2)


def retention_policy(rng: random.Random) -> RetentionPolicy:
    """Returns a random retention policy: an age limit (writers' clocks are skewed by up to
    two minutes, so some write fragments that are old at once), a size limit, or both."""
    age = rng.choice((None, 0.5, 5.0, 60.0))
    size = rng.choice((None, 200, 2_000)) if age is not None else rng.choice((200, 2_000))
    return RetentionPolicy(max_age_s=age, max_bytes=size)


class FaultSpace:
    """The streams beyond the first, and the trims, deletes and services of one run."""

    @staticmethod
    def wanted(knobs: Knobs) -> bool:
        """Returns whether `knobs` ask for any of it (a run without draws nothing for it, so
        that the runs before it existed replay as they did)."""
        return (
            knobs.streams
            or knobs.delete
            or knobs.trim
            or knobs.services
            or knobs.retention
            or knobs.recreate
        )

    def __init__(
        self, sim: Simulation, rng: random.Random, knobs: Knobs, *, reengage: bool
    ) -> None:
        self.sim = sim
        self.rng = rng
        self.knobs = knobs
        self.reengage = reengage
        # Writers and readers per stream beyond the first (whose are `RandomWorkload`'s).
        self.writers: dict[str, list[str]] = {}
        self.readers: dict[str, str] = {}
        # Which incarnation of a stream each payload appended to the other streams went to.
        self.origins = Origins()
        # Incarnations created so far, by stream name.
        self._incarnations: dict[str, int] = {}
        # Set when the random steps are over: no stream is created again after that.
        self.stopped = False
        if knobs.streams or knobs.delete or knobs.recreate:
            for index in range(2, rng.choice((2, 3, 4)) + 1):
                self._clients(sim.add_stream(f"sim{index}"))

    def _clients(self, stream: SimStream) -> None:
        """Names the writers and the reader of `stream`'s current incarnation (those of an
        older one are left to what they were doing)."""
        incarnation = self._incarnations[stream.name] = self._incarnations.get(stream.name, 0) + 1
        prefix = stream.name if incarnation == 1 else f"{stream.name}.{incarnation}"
        self.writers[stream.name] = [f"{prefix}-c{i}" for i in (1, 2)]
        self.readers[stream.name] = f"{prefix}-r1"
        for name in [*self.writers[stream.name], self.readers[stream.name]]:
            self.sim.client(name, stream.name)

    async def start(self) -> None:
        """Starts the services the knobs ask for, and a writer on every other stream."""
        sim = self.sim
        if self.knobs.services or self.knobs.retention:
            policy = retention_policy(self.rng) if self.knobs.retention else None
            await sim.start_services(retention_policy=policy)  # on every stream
        for writers in self.writers.values():
            sim.start_takeover(writers[0], reengage=self.reengage)

    def actions(self) -> list[tuple[int, Callable[[], None]]]:
        """Returns the weighted actions the knobs add to the random workload."""
        actions: list[tuple[int, Callable[[], None]]] = []
        if self.writers:
            actions += [(20, self.append), (4, self.read), (3, self.takeover)]
        if self.knobs.trim:
            actions.append((3, self.trim))
        if self.knobs.delete and self.writers:
            actions.append((1, self.delete))
        if self.knobs.recreate and self.writers:
            actions += [(2, self.delete), (2, self.recreate)]
        return actions

    # ------------------------------------------------------------------ streams

    def _live(self) -> list[SimStream]:
        """Returns the streams not deleted (the first stream first)."""
        return [s for s in self.sim.streams.values() if not self.sim.deleted(s)]

    def _side(self) -> list[str]:
        """Returns the other streams not deleted, by name."""
        return [s.name for s in self._live() if s.name in self.writers]

    def append(self) -> None:
        sides = self._side()
        if not sides:
            return
        name = self.rng.choice(self.writers[self.rng.choice(sides)])
        if self.sim.client(name).writer is None:
            self.sim.start_takeover(name, reengage=self.reengage)
        else:
            self.append_to(name, self.rng.randint(1, 5))

    def append_to(self, name: str, count: int) -> None:
        """Appends `count` payloads through writer `name`, noting the incarnation they go to
        (for `no-resurrection`)."""
        client = self.sim.client(name)
        writer = client.writer
        first = client.sequence
        self.sim.append(name, count)
        if writer is not None and client.incarnation is not None and self.knobs.recreate:
            sequences = range(first, client.sequence)
            payloads = (payload_of(name, n) for n in sequences)
            self.origins.appended(client.incarnation.checker, payloads)

    def read(self) -> None:
        sides = self._side()
        if sides:
            self.sim.spawn(self.sim.read(self.readers[self.rng.choice(sides)], 20))

    def takeover(self) -> None:
        """Another writer of a stream takes it over (they compete as the first stream's do)."""
        sides = self._side()
        if sides:
            name = self.rng.choice(self.writers[self.rng.choice(sides)])
            self.sim.start_takeover(name, reengage=self.reengage)

    # ------------------------------------------------------------------ trims and deletes

    def trim(self) -> None:
        """Trims a stream (the first one too) under its writers: most often right past a
        closed fragment (which then goes), else below a random id up to a little past its
        acknowledged end."""
        stream = self.rng.choice(self._live())
        ends = [f.last_entry_id for f in self.sim.snapshot(stream)[2][:-1]]
        closed = [end + 1 for end in ends if end is not None]
        if closed and self.rng.random() < 0.7:
            before = self.rng.choice(closed)
        else:
            top = max(stream.checker.acked, default=0) + 3
            before = self.rng.randint(max(0, top - 30), top)
        admin = self._admin(stream)
        self.sim.trace.record("trim", s=stream.name, before=before)
        self._run(
            admin,
            "trim",
            trim_stream(
                self.sim.client(admin).metadata,
                self.sim.client(admin).transport,
                stream.name,
                before,
                timeout_s=_TRIM_TIMEOUT_S,
            ),
        )

    def delete(self) -> None:
        """Deletes another stream while its writers write (most often under a live writer,
        `force`): they fail with `StreamNotFoundError`, its bookies drop its entries."""
        sides = self._side()
        if not sides:
            return
        stream = self.sim.streams[self.rng.choice(sides)]
        force = self.rng.random() < 0.8
        admin = self._admin(stream)
        self.sim.trace.record("delete", s=stream.name, force=int(force))
        if self.knobs.recreate:
            self._keep_old_entries(admin)
        task = self._run(
            admin,
            "delete",
            delete_stream(
                self.sim.client(admin).metadata,
                self.sim.client(admin).transport,
                stream.name,
                force=force,
                timeout_s=_TRIM_TIMEOUT_S,
            ),
        )
        if self.knobs.recreate and self.rng.random() < 0.7:
            delay_s = self.rng.choice(_RECREATE_AFTER_S)
            task.add_done_callback(
                lambda _: self.sim.loop.call_later(delay_s, self._recreate, stream.name)
            )

    def _keep_old_entries(self, admin: str) -> None:
        """BUGGIFY for a delete the stream's name is created again after: its `Trim`s miss
        some bookies, which hold the deleted entries until their reconcilers drop them."""
        bookies = sorted(self.sim.bookies)
        for bookie_id in self.rng.sample(bookies, self.rng.randint(0, len(bookies) - 1)):
            self.sim.network.cut(admin, bookie_id, self.rng.uniform(0.05, 0.6))

    def recreate(self) -> None:
        """Creates a deleted stream again under its name."""
        gone = [name for name in self.writers if self.sim.deleted(self.sim.streams[name])]
        if gone:
            self._recreate(self.rng.choice(gone))

    def _recreate(self, name: str) -> None:
        """Creates stream `name` again once its metadata is gone (a new id; the old
        incarnation, its writers and readers stay as they are, judged by their own checker),
        with new writers and a reader, and the run's retention policy."""
        sim = self.sim
        old = sim.streams[name]
        if self.stopped or not sim.deleted(old):
            return
        # The old incarnation stays judged (and reported) under another key.
        sim.streams[f"{name}@{old.id}"] = sim.streams.pop(name)
        try:
            stream = sim.add_stream(name)
        except StreamError as e:
            sim.streams[name] = sim.streams.pop(f"{name}@{old.id}")
            sim.trace.record("recreate_failed", s=name, error=type(e).__name__)
            return
        stream.checker = IncarnationChecker(
            sim.trace,
            sim.loop.time,
            stream=f"{name} (id {stream.id})",
            origins=self.origins,
        )
        sim.trace.record("recreate", s=name, old=old.id, new=stream.id)
        if sim.services is not None:
            sim.services.apply_policy(stream)
        self._clients(stream)
        sim.start_takeover(self.writers[name][0], reengage=self.reengage)

    def _admin(self, stream: SimStream) -> str:
        """Returns the client node that trims and deletes `stream`."""
        name = "admin" if stream.name == STREAM_NAME else f"{stream.name}-admin"
        self.sim.client(name, stream.name)
        return name

    def _run(self, name: str, what: str, call: Coroutine[Any, Any, object]) -> asyncio.Task[Any]:
        """Runs client `name`'s trim or delete in the background (`finish` waits for it);
        returns its task."""
        sim = self.sim
        sim.faults += 1
        task = sim.spawn(sim.guarded(name, what, f"{what}_failed", call))
        close_when_done(task, call)  # cancelled before it ran, at the run's end
        sim.stream_ops.add(task)
        task.add_done_callback(sim.stream_ops.discard)
        return task
