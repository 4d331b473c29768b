"""The one place structlog is configured, and the loggers of our modules.

As a library, Streamkeeper logs through the standard `logging` module (loggers named after the
modules, `stream.*`), and the application decides what is shown and where: with no logging
configured, using the client prints nothing. Processes of ours (`streamctl`, a bookie) call
`configure_logging`: readable lines on a terminal, JSON lines otherwise or with `--log-json`,
kazoo's and grpc's records rendered the same way.

Our modules log through `get_logger(__name__)`, which imports structlog only for an event that
the standard logger of that name takes (or once anything imported structlog): `import stream`
does not pay for it (about 70 ms with rich installed, whose import `structlog.dev` makes), nor
does a library user (a Spark worker, a script) whose logging drops our events."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import structlog

# Libraries whose records we render with ours; their debug output is per packet.
THIRD_PARTY_LOGGERS = ("kazoo", "grpc")

# The standard level of each logging method structlog's loggers have.
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}
_routed = False


def _shared() -> list[structlog.types.Processor]:
    """The processors applied to our events and to the records of other libraries alike."""
    import structlog

    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


def _dropped(*_args: Any, **_kw: Any) -> None:
    """An event the standard logger would not take, before structlog is imported."""


class LazyLogger:
    """A module's structlog logger (`structlog.get_logger(name)`), obtained on first use. Until
    structlog is imported, an event whose level the standard logger `name` does not take is
    dropped here: with our configuration (`use_standard_logging`) structlog's first processor
    would drop it for the same reason, and an application that configures structlog itself
    has imported it."""

    __slots__ = ("_name", "_standard", "_log")

    def __init__(self, name: str) -> None:
        self._name = name
        self._standard = logging.getLogger(name)
        self._log: Any = None

    def __getattr__(self, method: str) -> Any:
        log = self._log
        if log is None:
            level = _LEVELS.get(method)
            if (
                level is not None
                and "structlog" not in sys.modules
                and not self._standard.isEnabledFor(level)
            ):
                return _dropped
            import structlog

            if not _routed:
                use_standard_logging()
            log = self._log = structlog.get_logger(self._name)
        return getattr(log, method)


def get_logger(name: str) -> LazyLogger:
    """Returns the logger of module `name` (see `LazyLogger`): `log = get_logger(__name__)`."""
    return LazyLogger(name)


def quiet_by_default() -> None:
    """Gives our loggers a handler that drops records, so that the standard library prints
    nothing of ours until the application configures logging. Runs when `stream` is imported;
    an application sees our events once it configures `logging` (e.g.
    `logging.basicConfig(level=logging.INFO)`). When structlog is already imported then, it is
    routed at once (`use_standard_logging`), as the first event would."""
    logging.getLogger("stream").addHandler(logging.NullHandler())
    if "structlog" in sys.modules:
        use_standard_logging()


def use_standard_logging() -> None:
    """Routes structlog's events to the standard library's loggers, unless the application
    configured structlog itself. Runs on our first logged event (or at `import stream` when
    structlog was imported before)."""
    import structlog

    global _routed
    _routed = True
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared(),
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
    import structlog

    global _routed
    _routed = True
    if json is None:
        json = not sys.stderr.isatty()
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_shared(),
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
        processors=[*_shared(), structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        # Filters by level before any processor runs (cheap debug calls on hot paths).
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
