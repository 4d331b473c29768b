"""Our modules' loggers (`stream.logs.get_logger`): structlog is imported only for an event the
standard logger takes, such an event reaches the standard logging machinery as before, and an
application's own structlog configuration is left alone. Each case runs in a fresh interpreter
(what is imported is the point)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(program: str) -> str:
    ran = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr == ""
    return ran.stdout


def test_the_client_imports_no_structlog_while_its_events_are_dropped() -> None:
    out = _run(
        """
        import sys
        from stream.client import StreamClient
        import stream.client.client
        from stream.logs import get_logger

        log = get_logger("stream.client.test")
        log.debug("dropped", n=1)
        log.info("dropped", n=2)
        print("structlog" in sys.modules)
        """
    )
    assert out == "False\n"


def test_an_event_the_standard_logger_takes_reaches_it_through_structlog() -> None:
    out = _run(
        """
        import logging
        import sys
        from stream.logs import get_logger

        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logging.getLogger().addHandler(handler)
        logging.getLogger("stream.test").setLevel(logging.INFO)
        log = get_logger("stream.test")
        log.debug("below the level")
        print("structlog" in sys.modules)
        log.info("taken", n=1)
        try:
            1 / 0
        except ZeroDivisionError:
            log.exception("failed")
        print("structlog" in sys.modules)
        for record in records:
            event, failed = record.msg, bool(record.exc_info)
            print(record.name, record.levelname, event["event"], event.get("n"), failed)
        """
    )
    assert out.splitlines() == [
        "False",
        "True",
        "stream.test INFO taken 1 False",
        "stream.test ERROR failed None True",
    ]


def test_an_application_that_configures_structlog_keeps_its_configuration() -> None:
    out = _run(
        """
        import stream
        import structlog
        from stream.logs import get_logger

        seen = []

        def keep(logger, method, event):
            seen.append((method, event["event"]))
            raise structlog.DropEvent

        structlog.configure(processors=[keep])
        log = get_logger("stream.test")
        log.info("mine too")
        print(seen)
        """
    )
    assert out == "[('info', 'mine too')]\n"


def test_structlog_imported_before_stream_is_routed_to_the_standard_loggers() -> None:
    out = _run(
        """
        import structlog
        print(structlog.is_configured())
        import stream
        print(structlog.is_configured(), structlog.get_config()["logger_factory"])
        """
    )
    first, second = out.splitlines()
    assert first == "False"
    assert second.startswith("True <structlog.stdlib.LoggerFactory")
