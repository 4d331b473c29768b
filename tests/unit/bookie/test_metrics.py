"""The bookie's plain-number metrics (`Tally`, `TallyHistogram`) as a scrape shows them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stream.bookie.metrics import Tally, TallyHistogram

_Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scraped(registry: CollectorRegistry) -> _Samples:
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_tally_histogram_scrapes_as_a_prometheus_histogram() -> None:
    registry = CollectorRegistry()
    hist = TallyHistogram("sk_test_seconds", "test", (0.001, 0.002, 1.0), registry)
    for value in (0.001, 0.0015, 0.5, 3.0):  # 0.001 is on a bound: "less or equal"
        hist.observe(value)
    got = _scraped(registry)
    assert got[("sk_test_seconds_bucket", (("le", "0.001"),))] == 1
    assert got[("sk_test_seconds_bucket", (("le", "0.002"),))] == 2
    assert got[("sk_test_seconds_bucket", (("le", "1.0"),))] == 3
    assert got[("sk_test_seconds_bucket", (("le", "+Inf"),))] == 4
    assert got[("sk_test_seconds_count", ())] == 4
    assert abs(got[("sk_test_seconds_sum", ())] - 3.5025) < 1e-9


def test_a_tally_scrapes_as_a_prometheus_counter() -> None:
    registry = CollectorRegistry()
    tally = Tally("sk_test_total", "test", ["rpc", "code"], registry)
    tally.inc(("Add", "OK"))
    tally.inc(("Add", "OK"), 2)
    tally.inc(("Read", "NO_SUCH_ENTRY"))
    got = _scraped(registry)
    assert got[("sk_test_total", (("code", "OK"), ("rpc", "Add")))] == 3
    assert got[("sk_test_total", (("code", "NO_SUCH_ENTRY"), ("rpc", "Read")))] == 1
