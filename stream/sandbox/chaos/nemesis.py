"""The nemesis: real faults on the chaos cluster's hosts and processes, one at a time, on a
schedule drawn from a seed (printed, so a failing run can be replayed with the same seed).

Partitions are nftables drops in the hosts' namespaces; loss is a random nftables drop; delay
and reordering use `tc netem` where the kernel has it and the delay relays (chaos.relay) where
it has not; processes get SIGKILL (and a restart at
the heal), SIGSTOP (SIGCONT at the heal); a wiped bookie restarts after `streamctl bookie
fix-cookie`."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from stream.errors import StreamError
from stream.logs import get_logger
from stream.sandbox.bookies import BookieProcess
from stream.sandbox.chaos.cluster import SMALL_DISK_BOOKIE, ChaosCluster
from stream.sandbox.chaos.relay import Delay
from stream.sandbox.netns import Host

log = get_logger(__name__)

Heal = Callable[[], None]

# Delay with jitter, as netem's `delay 40ms 30ms distribution normal`: packets (chunks, in the
# relay) overtake each other across connections.
DELAY = Delay(delay_ms=40.0, jitter_ms=30.0)

# name -> whether it needs a delay mechanism (`tc netem`, or the relays where there is none)
FAULTS: dict[str, bool] = {
    "partition-halves": False,  # all hosts split in a majority and a minority
    "zookeeper-minority": False,  # one ZooKeeper server cut from every other host
    "zookeeper-no-quorum": False,  # two ZooKeeper servers cut from everything: no quorum
    "zookeeper-bridge": False,  # zk1 and zk3 cut from each other, zk2 sees both
    "bookie-cut-from-zookeeper": False,  # one bookie cannot reach ZooKeeper, still serves
    "writer-cut-from-zookeeper": False,  # one writer's session expires, bookies reachable
    # One writer cut from two bookies: its takeovers stall in recovery (no EC fences, unknown
    # reads) and go on when the partition heals mid-recovery.
    "writer-cut-from-bookies": False,
    "loss": False,  # 30 % of the packets of three hosts dropped
    "delay": True,  # delay with jitter (reorders across connections) on three hosts
    "kill-bookie": False,  # kill -9, restart at the heal
    "pause-bookie": False,  # SIGSTOP, SIGCONT at the heal
    "pause-writer": False,  # SIGSTOP a writer (a zombie once another takes over)
    "kill-zookeeper-leader": False,  # kill -9 the leader, restart at the heal
    "wipe-bookie": False,  # kill -9, data wiped, fix-cookie and restart at the heal
    "fill-disk": False,  # the small-disk bookie's filesystem filled up, emptied at the heal
}


@dataclass(frozen=True)
class Step:
    """Wait `quiet_s`, apply `fault` on `target` (a host or process name, "" when the fault
    draws none), hold it `hold_s`, heal."""

    quiet_s: float
    fault: str
    target: str
    hold_s: float

    def __str__(self) -> str:
        on = f" {self.target}" if self.target else ""
        return f"after {self.quiet_s:4.1f}s: {self.fault}{on} for {self.hold_s:4.1f}s"


def schedule(
    seed: int,
    duration_s: float,
    *,
    bookies: int,
    writers: int,
    netem: bool,
    faults: tuple[str, ...] = tuple(FAULTS),
    hold_s: tuple[float, float] = (4.0, 12.0),
    quiet_s: tuple[float, float] = (3.0, 8.0),
) -> list[Step]:
    """Returns the steps that fit in `duration_s`, drawn from `seed` alone."""
    rng = random.Random(seed)
    usable = [f for f in faults if netem or not FAULTS[f]]
    steps: list[Step] = []
    elapsed = 0.0
    while True:
        quiet, hold = rng.uniform(*quiet_s), rng.uniform(*hold_s)
        if elapsed + quiet + hold > duration_s:
            return steps
        fault = rng.choice(usable)
        steps.append(
            Step(round(quiet, 1), fault, _target(rng, fault, bookies, writers), round(hold, 1))
        )
        elapsed += quiet + hold


def _target(rng: random.Random, fault: str, bookies: int, writers: int) -> str:
    if fault == "writer-cut-from-bookies":
        cut = sorted(rng.sample(range(1, bookies + 1), 2))
        return f"writer-{rng.randint(1, writers)}:" + ",".join(f"bookie-{i}" for i in cut)
    if fault == "fill-disk":
        return SMALL_DISK_BOOKIE
    if "bookie" in fault:
        return f"bookie-{rng.randint(1, bookies)}"
    if "writer" in fault:
        return f"writer-{rng.randint(1, writers)}"
    if fault == "zookeeper-minority":
        return f"zk{rng.randint(1, 3)}"
    if fault in ("loss", "delay", "partition-halves"):
        return str(rng.randrange(1 << 30))  # a seed for the hosts it picks
    return ""


class Nemesis:
    """Applies steps on `cluster`; `apply` returns the heal."""

    def __init__(self, cluster: ChaosCluster) -> None:
        self.cluster = cluster
        self.network = cluster.network

    def apply(self, step: Step) -> Heal:
        method = getattr(self, "_" + step.fault.replace("-", "_"))
        heal: Heal = method(step.target)
        log.info("nemesis.applied", step=str(step))
        return heal

    def heal_network(self) -> None:
        self.network.heal()

    # ------------------------------------------------------------------ network

    def _hosts(self) -> list[Host]:
        return list(self.network.hosts.values())

    def _partition_halves(self, target: str) -> Heal:
        hosts = self._hosts()
        random.Random(int(target)).shuffle(hosts)
        minority = len(hosts) // 2
        self.network.partition(hosts[:minority], hosts[minority:])
        return self.heal_network

    def _zookeeper_minority(self, target: str) -> Heal:
        cut = self.network.host(target)
        self.network.partition([cut], [h for h in self._hosts() if h is not cut])
        return self.heal_network

    def _zookeeper_no_quorum(self, target: str) -> Heal:
        everyone = self._hosts()
        for cut in self.cluster.zookeeper_hosts[:2]:
            self.network.partition([cut], [h for h in everyone if h is not cut])
        return self.heal_network

    def _zookeeper_bridge(self, target: str) -> Heal:
        zk1, _, zk3 = self.cluster.zookeeper_hosts
        self.network.partition([zk1], [zk3])
        return self.heal_network

    def _bookie_cut_from_zookeeper(self, target: str) -> Heal:
        host = self.cluster.bookie_hosts[target]
        self.network.partition([host], self.cluster.zookeeper_hosts)
        return self.heal_network

    def _writer_cut_from_zookeeper(self, target: str) -> Heal:
        worker = next(w for w in self.cluster.workers if w.name == target)
        self.network.partition([worker.host], self.cluster.zookeeper_hosts)
        return self.heal_network

    def _writer_cut_from_bookies(self, target: str) -> Heal:
        writer, bookies = target.split(":")
        worker = next(w for w in self.cluster.workers if w.name == writer)
        self.network.partition(
            [worker.host], [self.cluster.bookie_hosts[b] for b in bookies.split(",")]
        )
        return self.heal_network

    def _some_hosts(self, target: str, count: int = 3) -> list[Host]:
        return random.Random(int(target)).sample(self._hosts(), count)

    def _loss(self, target: str) -> Heal:
        for host in self._some_hosts(target):
            host.set_loss(30)
        return self.heal_network

    def _delay(self, target: str) -> Heal:
        hosts = self._some_hosts(target)
        relays = self.cluster.relays
        if relays is None:
            for host in hosts:
                host.set_netem(["delay", f"{DELAY.delay_ms:.0f}ms", f"{DELAY.jitter_ms:.0f}ms",
                                "distribution", "normal"])  # fmt: skip
            return self.heal_network
        relays.delay(hosts, dataclasses.replace(DELAY, seed=int(target)))
        return relays.heal

    # ------------------------------------------------------------------ processes

    def _bookie(self, bookie_id: str) -> BookieProcess:
        return next(b for b in self.cluster.bookies if b.bookie_id == bookie_id)

    def _kill_bookie(self, target: str) -> Heal:
        bookie = self._bookie(target)
        bookie.kill9()

        def heal() -> None:
            bookie.start()
            bookie.wait_ready(60)

        return heal

    def _pause_bookie(self, target: str) -> Heal:
        pid = self._bookie(target).pid
        os.kill(pid, signal.SIGSTOP)
        return lambda: os.kill(pid, signal.SIGCONT)

    def _pause_writer(self, target: str) -> Heal:
        worker = next(w for w in self.cluster.workers if w.name == target)
        if worker.process is None:
            raise StreamError("writer not started", worker=target)
        worker.process.send_signal(signal.SIGSTOP)
        process = worker.process
        return lambda: process.send_signal(signal.SIGCONT)

    def _kill_zookeeper_leader(self, target: str) -> Heal:
        ensemble = self.cluster.zookeeper
        assert ensemble is not None
        leader = ensemble.leader()
        if leader is None:
            return lambda: None  # no leader right now: nothing to kill
        leader.kill9()

        def heal() -> None:
            leader.start(wait=False)
            leader.wait_serving(60)

        return heal

    def _fill_disk(self, target: str) -> Heal:
        data = self._bookie(target).data_dir / "data"
        filler = data / "chaos-filler"
        # All the free space but a little: the bookie's next writes fail or it turns read-only.
        free = shutil.disk_usage(data).free - (1 << 20)
        if free > 0:
            subprocess.run(["fallocate", "-l", str(free), str(filler)], check=True)
        return lambda: filler.unlink(missing_ok=True)

    def _wipe_bookie(self, target: str) -> Heal:
        bookie = self._bookie(target)
        bookie.kill9()
        # The directory's contents, not the directory: it may be a mount point (small disk).
        for child in (bookie.data_dir / "data").iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        host = self.cluster.bookie_hosts[target]

        def heal() -> None:
            # The bookie refuses to start on a wiped disk until its cookie is fixed (BP-46).
            result = subprocess.run(
                [
                    *host.command_prefix,
                    sys.executable,
                    "-m",
                    "stream.cli.main",
                    "bookie",
                    "fix-cookie",
                    "--config",
                    str(bookie.config_path),
                ],  # fmt: skip
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise StreamError(
                    "fix-cookie failed",
                    bookie=target,
                    output=(result.stdout + result.stderr)[-500:],
                )
            bookie.start()
            bookie.wait_ready(60)

        return heal
