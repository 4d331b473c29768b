"""The simulated disk against the real one: the same seeded operation sequences on the `os`
port in a temporary directory and on `SimDisk` read back the same, leave the same files
after a clean close, and the index over LMDB and over the simulated store answer the same.
Then what a crash keeps: synced bytes and names, a torn prefix of the rest, synced index
commits."""

from __future__ import annotations

import os
import random
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from stream.bookie.storage import StreamStorage
from stream.bookie.storage.codec import ENTRY_KEY, LOCATION
from stream.bookie.storage.disk_port import OS_DISK, DiskPort
from stream.bookie.storage.index import Index
from stream.bookie.storage.journal import JournalPosition
from stream.sim.disk import SimDisk
from stream.wire import bookie_pb2 as pb
from tests.unit.bookie.storage_support import add_request, entry, make_config, wait

_NAMES = ["a.log", "b.log", "c.log", "d.log"]
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL


def _outcome(call: Any) -> Any:
    """Returns what the call returned, or the type of the OSError it raised."""
    try:
        return call()
    except OSError as e:
        return type(e).__name__, e.errno


class _Driver:
    """Applies seeded random file operations to one disk, recording what each returned."""

    def __init__(self, disk: DiskPort, root: Path) -> None:
        self.disk = disk
        self.root = root
        self.fds: dict[str, int] = {}  # open descriptors by name, the same on both disks

    def step(self, rng: random.Random) -> Any:
        disk = self.disk
        # Mostly a file with an open descriptor: data operations are the point.
        name = rng.choice(list(self.fds) if self.fds and rng.random() < 0.7 else _NAMES)
        path = self.root / name
        fd = self.fds.get(name)
        op = rng.choice(
            ["create", "open", "write", "pwrite", "pwritev", "pread", "sync", "truncate"]
            + ["rename", "unlink", "listdir", "size", "fsize", "close"]
        )
        if op == "create":
            return _outcome(lambda: self._opened(name, disk.open(path, _CREATE, 0o644)))
        if op == "open":
            return _outcome(lambda: self._opened(name, disk.open(path, os.O_WRONLY)))
        if op == "listdir":
            return sorted(disk.listdir(self.root))
        if op == "size":
            return _outcome(lambda: disk.size(path))
        if op == "rename":
            other = self.root / rng.choice(_NAMES)
            return _outcome(lambda: disk.rename(path, other))
        if op == "unlink":
            return _outcome(lambda: disk.unlink(path))
        data = rng.randbytes(rng.randint(0, 40))
        offset = rng.randint(0, 120)
        if fd is None:
            return "no fd"
        if op == "write":
            return disk.write(fd, data)
        if op == "pwrite":
            return disk.pwrite(fd, data, offset)
        if op == "pwritev":
            return disk.pwritev(fd, [data, data[:3], b""], offset)
        if op == "pread":
            reader = disk.open(path, os.O_RDONLY) if name in self._names() else None
            if reader is None:
                return "gone"
            try:
                return disk.pread(reader, rng.randint(0, 60), offset)
            finally:
                disk.close(reader)
        if op == "sync":
            return disk.fdatasync(fd)
        if op == "truncate":
            return disk.ftruncate(fd, rng.randint(0, 80))
        if op == "fsize":
            return disk.fsize(fd)
        disk.close(self.fds.pop(name))
        return "closed"

    def _opened(self, name: str, fd: int) -> str:
        old = self.fds.pop(name, None)
        if old is not None:
            self.disk.close(old)
        self.fds[name] = fd
        return "opened"

    def _names(self) -> list[str]:
        return self.disk.listdir(self.root)

    def close_all(self) -> dict[str, bytes]:
        """Syncs and closes every descriptor; returns each file's bytes."""
        for fd in self.fds.values():
            self.disk.fsync(fd)
            self.disk.close(fd)
        self.fds.clear()
        self.disk.fsync_dir(self.root)
        files = {}
        for name in sorted(self._names()):
            if self.disk.size(self.root / name) == 0:
                files[name] = b""
                continue
            with self.disk.mapped(self.root / name) as data:
                files[name] = bytes(data)
        return files


@pytest.mark.parametrize("seed", range(40))
def test_file_operations_read_back_the_same_on_both_disks(tmp_path: Path, seed: int) -> None:
    sim = SimDisk(random.Random(seed))
    real = _Driver(OS_DISK, tmp_path / "d")
    fake = _Driver(sim, Path("/sim/d"))
    for driver in (real, fake):
        driver.disk.mkdir(driver.root)
    rng_real, rng_fake = random.Random(seed), random.Random(seed)
    for step in range(150):
        assert real.step(rng_real) == fake.step(rng_fake), f"step {step}"
    assert real.close_all() == fake.close_all()


def _index_ops(rng: random.Random, index: Index) -> list[Any]:
    """Applies one random index operation and returns every query's answer after it."""
    stream = rng.choice([6, 7, 8])
    op = rng.choice(["flush", "flush", "delete", "move", "states", "unclean"])
    if op == "flush":
        ids = sorted(rng.sample(range(60), rng.randint(0, 12)))
        keys = [ENTRY_KEY.pack(stream, e) for e in ids]
        locations = [LOCATION.pack(rng.randint(1, 3), e * 100, e + 1) for e in ids]
        checkpoint = JournalPosition(rng.randint(1, 5), rng.randint(0, 999))
        index.commit_flush(keys, locations, {stream: rng.randbytes(8)}, checkpoint)
    elif op == "delete":
        first = rng.randint(-2, 60)
        index.delete_range(stream, first, first + rng.randint(-1, 20), limit=rng.randint(0, 5))
    elif op == "move":
        moves = []
        for entry_id in rng.sample(range(60), 5):
            key = ENTRY_KEY.pack(stream, entry_id)
            old = index.get(stream, entry_id) or LOCATION.pack(1, 0, 1)
            moves.append((key, old if rng.random() < 0.7 else b"x" * 16, LOCATION.pack(9, 1, 2)))
        index.move_locations(moves)
    elif op == "states":
        # A flush of stream states alone, as the flusher commits when no entry moved.
        index.commit_flush([], [], {stream: rng.randbytes(4)}, None)
    else:
        index.set_unclean_bit(rng.random() < 0.5)
    first, count = rng.randint(0, 62), rng.randint(0, 20)
    return [
        op,
        index.get(stream, rng.randint(0, 60)),
        index.locations(stream, first, first + count, rng.randint(1, 30)),
        index.consecutive(stream, first, count),
        index.max_entry_id(stream, rng.randint(-1, 70)),
        index.first_entry_id(stream),
        [batch for batch in index.scan(rng.randint(1, 10))],
        index.entry_count(),
        index.load_states(),
        index.checkpoint(),
        index.unclean_bit(),
    ]


@pytest.mark.parametrize("seed", range(25))
def test_index_answers_the_same_over_lmdb_and_the_simulated_store(
    tmp_path: Path, seed: int
) -> None:
    real = Index(tmp_path / "index", map_bytes=64 << 20)
    sim_disk = SimDisk(random.Random(seed))
    fake = Index(Path("/sim/index"), disk=sim_disk)
    for index in (real, fake):
        index.open()
    rng_real, rng_fake = random.Random(seed), random.Random(seed)
    for step in range(60):
        assert _index_ops(rng_real, real) == _index_ops(rng_fake, fake), f"step {step}"
    for index in (real, fake):
        index.sync()
        index.close()
        index.open()
    assert _index_ops(rng_real, real) == _index_ops(rng_fake, fake)
    real.close()
    fake.close()


def _write_synced(disk: SimDisk, path: Path, data: bytes) -> int:
    fd = disk.open(path, _CREATE, 0o644)
    disk.write(fd, data)
    disk.fdatasync(fd)
    return fd


def test_a_crash_keeps_synced_bytes_and_names_and_drops_the_rest() -> None:
    disk = SimDisk(random.Random(0), torn_tails=False)
    root = Path("/sim/d")
    disk.mkdir(root)
    fd = _write_synced(disk, root / "kept.log", b"synced")
    disk.fsync_dir(root)
    disk.write(fd, b" unsynced")
    _write_synced(disk, root / "unnamed.log", b"synced, name not")
    disk.rename(root / "kept.log", root / "renamed.log")  # the rename is not durable
    disk.crash()
    assert disk.files() == {str(root / "kept.log"): b"synced"}
    with pytest.raises(OSError):
        disk.fsize(fd)  # descriptors do not survive


def test_a_crash_keeps_a_seeded_prefix_of_the_unsynced_appends() -> None:
    kept_lengths = set()
    for seed in range(30):
        disk = SimDisk(random.Random(seed))
        root = Path("/sim/d")
        disk.mkdir(root)
        fd = _write_synced(disk, root / "j.log", b"head")
        disk.fsync_dir(root)
        disk.write(fd, b"0123456789")
        disk.crash()
        data = disk.files()[str(root / "j.log")]
        assert (b"head0123456789").startswith(data) and data.startswith(b"head")
        kept_lengths.add(len(data))
    assert len(kept_lengths) > 3  # the cut varies with the seed


def test_a_crash_keeps_synced_index_commits_and_a_prefix_of_the_others() -> None:
    outcomes = set()
    for seed in range(20):
        disk = SimDisk(random.Random(seed))
        index = Index(Path("/sim/index"), disk=disk)
        index.open()
        index.commit_flush([], [], {1: b"a"}, None)
        index.sync()
        index.commit_flush([], [], {1: b"b"}, None)
        index.commit_flush([], [], {1: b"c"}, None)
        disk.crash()
        index = Index(Path("/sim/index"), disk=disk)
        index.open()
        outcomes.add(index.load_states()[1])
    assert outcomes == {b"a", b"b", b"c"}


def test_wipe_loses_everything_and_full_fails_writes() -> None:
    disk = SimDisk(random.Random(0))
    root = Path("/sim/d")
    disk.mkdir(root)
    fd = _write_synced(disk, root / "x.log", b"data")
    disk.set_fault("full")
    with pytest.raises(OSError) as full:
        disk.write(fd, b"more")
    assert full.value.errno == 28  # ENOSPC
    disk.set_fault(None)
    disk.fsync_dir(root)
    disk.wipe()
    assert disk.files() == {}
    with pytest.raises(FileNotFoundError):
        disk.listdir(root)


def _acked_after_crash(seed: int) -> tuple[dict[int, Any], StreamStorage, SimDisk]:
    """Adds seeded batches to a storage over a simulated disk, some with flushes between,
    crashes it mid-stream and returns the entries whose add was acknowledged durable, with
    the storage reopened over what the crash kept."""
    rng = random.Random(seed)
    disk = SimDisk(random.Random(seed))
    config = make_config(Path("/sim/b1"), journal_max_file_bytes=4096)
    storage = StreamStorage(config, disk=disk)
    storage.open()
    batches: list[tuple[Future[None] | None, list[pb.Entry]]] = []
    next_id = 0
    for _ in range(rng.randint(5, 40)):
        entries = [entry(7, next_id + i, rng.randbytes(rng.randint(1, 300))) for i in range(3)]
        next_id += 3
        batches.append((storage.add_batch(add_request(7, 1, entries)).durable, entries))
        if rng.random() < 0.1:
            storage.request_flush()
        if rng.random() < 0.3:
            wait(batches[-1][0])
    storage.abandon()  # what the journal thread had not synced fails its future
    disk.crash()
    acked = {}
    for durable, entries in batches:
        assert durable is not None and durable.done()
        if durable.exception() is None:
            acked.update({e.entry_id: e for e in entries})
    reopened = StreamStorage(config, disk=disk)
    reopened.open()
    return acked, reopened, disk


@pytest.mark.parametrize("seed", range(30))
def test_replay_over_the_simulated_disk_recovers_exactly_the_synced_prefix(seed: int) -> None:
    acked, storage, _ = _acked_after_crash(seed)
    try:
        assert acked, "some adds are acknowledged"
        recovered = {}
        for entry_id in range(max(acked) + 40):
            got = storage.read(7, entry_id)
            if got.code == pb.OK:
                recovered[entry_id] = got.entry
        assert recovered == acked
    finally:
        storage.close()
