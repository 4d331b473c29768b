"""Data integrity of a bookie that may have lost acknowledged entries (BP-46, docs/design.md §4
"Crash protection without the journal").

Without the journal (`journal_write_data = false`) an add is acknowledged once it is in the
write cache; a crash loses what was not flushed yet. A wiped or replaced disk loses
everything. Either way the bookie must never again answer "no such entry" for an entry it once
acknowledged (BP-46 scenario 2), nor accept a write of a term that was fenced here before
(scenario 1). The boot does, in this order:

1. the cookie check (`stream.bookie.cookie`): a repairable mismatch is fixed only with
   `auto_fix_cookie = true` (or by hand, `streamctl bookie fix-cookie`);
2. **phase one**, before serving, when the previous run crashed after bypassing the journal or
   the cookie is being fixed: for every non-sealed stream with a fragment naming this bookie,
   local term := max(local, metadata term) and limbo on, all durable (journal, fsync); when
   the fix lost a directory, also the stream id counter below which terms may have been
   forgotten (`stream.bookie.terms`: the terms of SEALED streams and of streams no fragment
   names are learned from metadata on first use); then the fixed cookie is written;
3. serving and registration (a limbo stream answers UNKNOWN instead of an explicit negative);
4. **phase two** in the background (`stream.autorecovery.phase_two`): per limbo stream, a
   fixed end (a recovery by a newer term, running one when needed), every entry this bookie
   should hold up to it copied from peers, a flush, then limbo cleared. Limbo is durable: a
   crash half-way just repeats the repair at the next boot.

Whether the previous run bypassed the journal is kept in a marker file in the index
directory: with the journal holding every acknowledged entry, a crash loses nothing, and
phase one (whose repairs make writers re-engage) would only cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream.autorecovery.phase_two import REPAIR_STREAMS_PENDING
from stream.bookie import metrics
from stream.bookie.config import BookieConfig
from stream.bookie.cookie import (
    CookieAction,
    CookieDecision,
    CookieStore,
    apply_cookie_fix,
    discard_index_for_fix,
    inspect_cookies,
)
from stream.bookie.storage.fsutil import fsync_dir
from stream.bookie.unsafe import SAFE, UnsafeSkips
from stream.errors import (
    ConfigError,
)
from stream.logs import get_logger
from stream.metadata.model import Fragment, StreamMeta

if TYPE_CHECKING:
    from stream.bookie.storage import StreamStorage
    from stream.bookie.terms import MetadataTerms

log = get_logger(__name__)

JOURNAL_BYPASS_MARKER = "JOURNAL_BYPASSED"


def metadata_terms(
    config: BookieConfig, storage: StreamStorage, session: Any, *, unsafe: UnsafeSkips = SAFE
) -> MetadataTerms:
    """Returns the service's checks against metadata (`stream.bookie.terms.MetadataTerms`):
    terms a lost disk took (when this bookie lost a directory), terms and trims metadata cannot
    justify. Call after `protect_at_boot`, on the event loop."""
    from stream.bookie.terms import (
        StreamFacts,
        forgotten_terms_bound,
        metadata_terms_for,
        read_stream_facts,
    )

    async def read_facts(stream_id: int) -> StreamFacts | None:
        return await asyncio.to_thread(read_stream_facts, session, stream_id)

    return metadata_terms_for(
        storage, read_facts, forgotten_below=forgotten_terms_bound(config), unsafe=unsafe
    )


def _note_forgotten_terms(config: BookieConfig, decision: CookieDecision, session: Any) -> None:
    """Records, before the fixed cookie, which streams' terms the lost directories may have
    taken (blocking)."""
    from stream.bookie.terms import note_forgotten_terms, read_next_stream_id

    if decision.lost_directories:
        note_forgotten_terms(config, read_next_stream_id(session))


# -- the journal-bypass marker --------------------------------------------------------------


def _marker_path(config: BookieConfig) -> Path:
    return config.index_path / JOURNAL_BYPASS_MARKER


def note_journal_mode(config: BookieConfig) -> bool:
    """Returns whether a previous run may have acknowledged entries without the journal (the
    marker exists); creates the marker durably when this run bypasses it. Call before the
    storage opens."""
    path = _marker_path(config)
    existed = path.exists()
    if not config.journal_write_data and not existed:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"entries were acknowledged without the journal (BP-46)\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(path.parent)
    return existed


def settle_journal_mode(config: BookieConfig) -> None:
    """Removes the marker when this run writes entries to the journal again. Call once phase
    one (if any) is durable: from then on a crash loses nothing."""
    path = _marker_path(config)
    if config.journal_write_data and path.exists():
        path.unlink()
        fsync_dir(path.parent)
        log.info("integrity.journal_bypass_ended")


# -- phase one ------------------------------------------------------------------------------


def phase_one_reason(*, unclean: bool, journal_bypassed: bool, cookie_fix: bool) -> str | None:
    """Returns why phase one must run ("cookie", "unclean_shutdown"), or None when nothing
    acknowledged can have been lost: a clean shutdown flushes everything, and a crash while
    every entry went through the journal loses none."""
    if cookie_fix:
        return "cookie"
    if unclean and journal_bypassed:
        return "unclean_shutdown"
    return None


@dataclass(frozen=True)
class PhaseOneReport:
    """What phase one did: why it ran, the streams term-fenced (and put in limbo unless the
    test-only switch says otherwise), how long it took."""

    reason: str
    stream_ids: tuple[int, ...]
    limbo: bool
    seconds: float


def begin_phase_one(
    storage: StreamStorage,
    streams: Sequence[tuple[StreamMeta, Sequence[Fragment]]],
    *,
    unsafe: UnsafeSkips = SAFE,
) -> tuple[list[Future[None]], tuple[int, ...], bool]:
    """Journals phase one's changes (term := max(local, metadata term), limbo on) for every
    stream in `streams`; returns the futures of their sync, the stream ids and whether limbo
    was set. `run_phase_one` waits for the futures; the simulator commits its journal."""
    limbo = "limbo" not in unsafe
    if "phase_one" in unsafe:
        return [], (), False
    fence = "phase_one_term" not in unsafe
    futures: list[Future[None]] = []
    ids: list[int] = []
    for meta, _ in streams:
        # Even for a stream this bookie never heard of: its term must be fenced here (a wiped
        # disk forgot it), and its negatives must become UNKNOWN.
        futures.append(storage.set_limbo(meta.id, limbo, term=meta.term if fence else 0))
        ids.append(meta.id)
    return futures, tuple(ids), limbo


async def run_phase_one(
    storage: StreamStorage,
    streams: Sequence[tuple[StreamMeta, Sequence[Fragment]]],
    *,
    reason: str,
    unsafe: UnsafeSkips = SAFE,
) -> PhaseOneReport:
    """Raises the local term of every stream in `streams` to its metadata term and sets limbo,
    and returns once all of it is durable (one journal group commit for many streams). Call on
    the storage's thread, before serving. `unsafe` turns parts off, in tests only."""
    started = time.monotonic()
    if "phase_one" in unsafe:
        log.warning("integrity.phase_one_skipped_unsafe", reason=reason)
        return PhaseOneReport(reason, (), False, 0.0)
    futures, ids, limbo = begin_phase_one(storage, streams, unsafe=unsafe)
    for future in futures:
        await asyncio.wrap_future(future)
    seconds = time.monotonic() - started
    metrics.PHASE_ONE_STREAMS.set(len(ids))
    metrics.PHASE_ONE_SECONDS.set(seconds)
    log.warning(
        "integrity.phase_one_done",
        reason=reason,
        streams=len(ids),
        limbo=limbo,
        seconds=round(seconds, 3),
    )
    return PhaseOneReport(reason, ids, limbo, seconds)


def limbo_bounds(storage: StreamStorage) -> dict[int, int]:
    """Returns {stream id: local term} for every stream in limbo. Taken before serving, the
    local term bounds the terms that may have written entries this bookie lost: at least the
    metadata term phase one saw, hence no lower than any term of the crashed run."""
    bounds = {}
    for stream_id in storage.stream_ids():
        state = storage.stream_state(stream_id)
        if state is not None and state.limbo:
            bounds[stream_id] = state.term
    return bounds


@dataclass(frozen=True)
class BootPreparation:
    """What the boot found before opening the storage."""

    journal_bypassed_before: bool
    cookie_fix: CookieDecision | None


def prepare_boot(config: BookieConfig, decision: CookieDecision) -> BootPreparation:
    """Blocking steps before the storage opens: discards the index when a cookie fix lost a
    directory, and notes (and marks) the journal mode. Returns what phase one needs."""
    fix = decision if decision.action is CookieAction.FIX else None
    if fix is not None:
        discard_index_for_fix(config, fix)
    return BootPreparation(note_journal_mode(config), fix)


async def protect_at_boot(
    config: BookieConfig,
    storage: StreamStorage,
    session: Any,
    cookie_store: CookieStore,
    preparation: BootPreparation,
    *,
    unclean: bool,
    unsafe: UnsafeSkips = SAFE,
) -> dict[int, int]:
    """Runs phase one when needed (streams from the metadata), then writes the fixed cookie
    and settles the journal mode; returns the bounds phase two needs (`limbo_bounds`). Call on
    the storage's thread after it opened and before serving."""
    from stream.metadata.streams import StreamStore

    reason = phase_one_reason(
        unclean=unclean,
        journal_bypassed=preparation.journal_bypassed_before,
        cookie_fix=preparation.cookie_fix is not None,
    )
    if reason is not None:
        streams = await asyncio.to_thread(
            StreamStore(session).streams_with_bookie, config.bookie_id
        )
        await run_phase_one(storage, streams, reason=reason, unsafe=unsafe)
    if preparation.cookie_fix is not None:
        await asyncio.to_thread(_note_forgotten_terms, config, preparation.cookie_fix, session)
        await asyncio.to_thread(apply_cookie_fix, config, preparation.cookie_fix, cookie_store)
    await asyncio.to_thread(settle_journal_mode, config)
    bounds = limbo_bounds(storage)
    REPAIR_STREAMS_PENDING.set(len(bounds))
    return bounds


# -- streamctl bookie fix-cookie ------------------------------------------------------------


@dataclass(frozen=True)
class FixCookieReport:
    """What `fix_cookie` did: the cookie decision's action, the problems it fixed, the
    directories whose loss discarded the index, and the streams put in limbo."""

    action: CookieAction
    problems: tuple[str, ...]
    lost_directories: tuple[str, ...]
    limbo_streams: int


@contextlib.contextmanager
def _bookie_stopped(config: BookieConfig) -> Iterator[None]:
    """Holds the bookie's listen address for the duration: a running bookie (which binds it
    exclusively) makes this fail, so that two processes never open one storage."""
    host, _, port = config.listen.rpartition(":")
    sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET)
    # As gRPC does: the stopped bookie's connections in TIME_WAIT must not count, a listener
    # (a running bookie) still does.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            sock.bind((host.strip("[]"), int(port)))
        except OSError as e:
            raise ConfigError(
                f"cannot bind {config.listen} ({e}): stop the bookie before fixing its cookie",
                key="listen",
            ) from None
        yield
    finally:
        sock.close()


def fix_cookie(config: BookieConfig) -> FixCookieReport:
    """`streamctl bookie fix-cookie`: with the bookie stopped, runs phase one for a repairable
    cookie mismatch and rewrites the cookie; returns what it did (action VERIFIED or
    FIRST_BOOT: nothing to fix). Raises `CookieMismatchError` for a mismatch it must not
    repair, `ConfigError` while the bookie runs."""
    from stream.bookie.storage import StreamStorage
    from stream.metadata.bookies import BookieRegistry
    from stream.metadata.connection import MetadataSession
    from stream.metadata.streams import StreamStore

    with _bookie_stopped(config):
        session = MetadataSession.connect(
            config.metadata,
            timeout_s=config.metadata_connect_timeout_ms / 1000,
            session_timeout_s=config.metadata_session_timeout_ms / 1000,
            auth_file=config.metadata_auth_path,
        )
        try:
            registry = BookieRegistry(session)
            running = registry.available().get(config.bookie_id)
            if running is not None:
                # The address check above misses a bookie running elsewhere or bound to
                # another interface; its registration does not (a fix under a running bookie
                # rewrote its cookie and put its streams in limbo).
                raise ConfigError(
                    f"bookie {config.bookie_id} is registered as available at "
                    f"{running.address}: stop it (or wait for its metadata session to expire, "
                    f"{config.metadata_session_timeout_ms / 1000:g} s after a crash) before "
                    "fixing its cookie",
                    key="bookie_id",
                )
            decision = inspect_cookies(config, session.instance_id(), registry, fixing=True)
            if decision.action is not CookieAction.FIX:
                return FixCookieReport(decision.action, (), (), 0)
            discard_index_for_fix(config, decision)
            streams = StreamStore(session).streams_with_bookie(config.bookie_id)

            async def protect() -> int:
                storage = StreamStorage(config)
                storage.open()
                try:
                    report = await run_phase_one(storage, streams, reason="cookie")
                    await asyncio.to_thread(_note_forgotten_terms, config, decision, session)
                    await asyncio.to_thread(apply_cookie_fix, config, decision, registry)
                except BaseException:
                    storage.abandon()  # the unclean bit stays set: the next boot redoes it
                    raise
                storage.close()
                return len(report.stream_ids)

            limbo = asyncio.run(protect())
        finally:
            session.close()
    return FixCookieReport(decision.action, decision.problems, decision.lost_directories, limbo)


__all__ = [
    "JOURNAL_BYPASS_MARKER",
    "BootPreparation",
    "FixCookieReport",
    "PhaseOneReport",
    "fix_cookie",
    "metadata_terms",
    "begin_phase_one",
    "limbo_bounds",
    "note_journal_mode",
    "phase_one_reason",
    "prepare_boot",
    "protect_at_boot",
    "run_phase_one",
    "settle_journal_mode",
]
