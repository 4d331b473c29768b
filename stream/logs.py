"""The one place structlog is configured.

As a library, Streamkeeper logs through the standard `logging` module (loggers named after the
modules, `stream.*`), and the application decides what is shown and where: with no logging
configured, using the client prints nothing. Processes of ours (`streamctl`, a bookie) call
`configure_logging`: readable lines on a terminal, JSON lines otherwise or with `--log-json`,
kazoo's and grpc's records rendered the same way."""

from __future__ import annotations

import logging
import sys

import structlog

# Libraries whose records we render with ours; their debug output is per packet.
THIRD_PARTY_LOGGERS = ("kazoo", "grpc")

# Applied to our events and to the records of other libraries alike.
_SHARED: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.StackInfoRenderer(),
]


def use_standard_logging() -> None:
    """Routes structlog's events to the standard library's loggers, unless the application
    configured structlog itself. Runs when `stream` is imported; an application sees our events
    once it configures `logging` (e.g. `logging.basicConfig(level=logging.INFO)`)."""
    logging.getLogger("stream").addHandler(logging.NullHandler())
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_SHARED,
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        # Not cached: a later `structlog.configure` (the application's, the simulator's)
        # must reach loggers already used.
        cache_logger_on_first_use=False,
    )


def configure_logging(*, json: bool | None = None, level: str = "info") -> None:
    """Makes this process show its logs (ours, kazoo's and grpc's) on stderr at `level`.

    `json=None` picks JSON when stderr is not a terminal (services, tests) and readable
    lines when a person is watching."""
    if json is None:
        json = not sys.stderr.isatty()
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(max(numeric, logging.INFO))
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        # Filters by level before any processor runs (cheap debug calls on hot paths).
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
