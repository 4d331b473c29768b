"""What `streamctl bench paced|sustained` keep and show of memory: each process's resident set
sampled through the measured window (a leak shows as the last half above the first), and the
latency samples kept compact, so that the bench's own bookkeeping does not pass for the
client's growth (a list of tuples took about 130 bytes a sample: some 30 MB in a 60 s run)."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from statistics import fmean

# Seconds between two RSS samples of the measured window.
RSS_SAMPLE_INTERVAL_S = 1.0


class LatencySamples:
    """`(sent, latency)` pairs (perf_counter seconds) in two flat arrays: 16 bytes a sample."""

    def __init__(self) -> None:
        self._sent = array("d")
        self._latency = array("d")

    def append(self, sample: tuple[float, float]) -> None:
        self._sent.append(sample[0])
        self._latency.append(sample[1])

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return zip(self._sent, self._latency, strict=True)

    def __len__(self) -> int:
        return len(self._sent)


def rss_halves(values: Sequence[int]) -> tuple[float, float]:
    """Returns the mean of the first half and of the last half of a window's RSS samples (the
    middle one of an odd count in neither); a single sample is both."""
    if not values:
        return float("nan"), float("nan")
    half = max(1, len(values) // 2)
    return fmean(values[:half]), fmean(values[-half:])
