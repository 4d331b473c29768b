"""A streaming query in a process of its own, for the kill -9 test: tails `--streams` from the
earliest entry into a parquet file sink under `--out` (checkpoint included) with a 200 ms
processing-time trigger, until the process is killed.

    python -m tests.spark.tail_query_driver --metadata HOST:PORT/ROOT --streams s --out DIR [--held]

`--held` (tests.spark.drivers): Spark starts, then the query waits for a line on stdin.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.spark.session import hold, local_session, start_query


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--streams", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-entries-per-trigger", type=int, default=10_000)
    parser.add_argument("--held", action="store_true", help="start the query once released")
    args = parser.parse_args()
    spark = local_session("streamkeeper-tail-driver", args.out / "spark-local", fast_start=True)
    if args.held:
        hold(spark, args.metadata, args.streams)
    query = start_query(
        spark,
        args.metadata,
        args.out,
        {"processingTime": "200 milliseconds"},
        streams=args.streams,
        startingOffsets="earliest",
        maxEntriesPerTrigger=str(args.max_entries_per_trigger),
    )
    query.awaitTermination()  # runs until killed (or the query fails)
    raise SystemExit(f"query ended: {query.exception()}")


if __name__ == "__main__":
    main()
