"""A query in a process of its own, for the exactly-once sink's kill -9 test: reads `--source`
from the earliest entry, prefixes each payload with `out:` and writes it to `--target` with the
streamkeeper sink (`--guarantee`), checkpoint under `--out`, 200 ms processing-time trigger,
until the process is killed.

    python -m tests.spark.sink_query_driver --metadata HOST:PORT/ROOT --source s --target t \
        --out DIR [--guarantee exactly-once] [--held]

`--held` (tests.spark.drivers): Spark starts, then the query waits for a line on stdin.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.spark.session import hold, local_session


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--guarantee", default="exactly-once")
    parser.add_argument("--max-entries-per-trigger", type=int, default=2000)
    parser.add_argument("--held", action="store_true", help="start the query once released")
    args = parser.parse_args()
    spark = local_session("streamkeeper-sink-driver", args.out / "spark-local", fast_start=True)
    if args.held:
        hold(spark, args.metadata, args.source)
    query = (
        spark.readStream.format("streamkeeper")
        .option("metadata", args.metadata)
        .option("streams", args.source)
        .option("startingOffsets", "earliest")
        .option("maxEntriesPerTrigger", str(args.max_entries_per_trigger))
        .load()
        .selectExpr("concat(CAST('out:' AS BINARY), payload) AS payload")
        .writeStream.format("streamkeeper")
        .option("metadata", args.metadata)
        .option("stream", args.target)
        .option("deliveryGuarantee", args.guarantee)
        .option("checkpointLocation", str(args.out / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    query.awaitTermination()  # runs until killed (or the query fails)
    raise SystemExit(f"query ended: {query.exception()}")


if __name__ == "__main__":
    main()
