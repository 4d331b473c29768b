"""structlog set-up: JSON lines for services, readable output on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(*, json: bool | None = None, level: str = "info") -> None:
    """Configures structlog (and the stdlib loggers of kazoo/grpc) once per process.

    `json=None` picks JSON when stderr is not a terminal (services, tests) and a readable
    console renderer when a person is watching."""
    if json is None:
        json = not sys.stderr.isatty()
    numeric = getattr(logging, level.upper(), logging.INFO)
    # kazoo and grpc log through the standard library: keep only their warnings and errors.
    logging.basicConfig(
        stream=sys.stderr, level=max(numeric, logging.WARNING), format="%(message)s"
    )
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
