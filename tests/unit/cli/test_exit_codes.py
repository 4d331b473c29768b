"""`streamctl`'s exit codes (README, docs/design.md §9): 0 ok, 1 error, 2 usage, 3 not found,
4 unavailable, 5 conflict."""

from __future__ import annotations

import pytest

from stream.cli.exit_codes import ExitCode, exit_code_for
from stream.errors import (
    BookieError,
    BookieNotFoundError,
    EntryTrimmedError,
    InvalidArgumentError,
    InvalidTermError,
    MetadataError,
    MetadataUnavailableError,
    NotEnoughBookiesError,
    PermissionDeniedError,
    StreamExistsError,
    StreamInUseError,
    StreamNotFoundError,
)
from stream.metadata.streams import StreamSealedError
from tests.unit.cli.conftest import Streamctl


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (StreamNotFoundError("no such stream"), ExitCode.NOT_FOUND),
        (EntryTrimmedError("trimmed"), ExitCode.NOT_FOUND),
        (BookieNotFoundError("never joined"), ExitCode.NOT_FOUND),
        (NotEnoughBookiesError("2 of 3"), ExitCode.UNAVAILABLE),
        (MetadataUnavailableError("no ZooKeeper"), ExitCode.UNAVAILABLE),
        (TimeoutError(), ExitCode.UNAVAILABLE),
        (InvalidTermError("superseded", term=3, current_term=4), ExitCode.CONFLICT),
        (StreamExistsError("exists"), ExitCode.CONFLICT),
        (StreamInUseError("a live writer"), ExitCode.CONFLICT),
        (StreamSealedError("sealed"), ExitCode.CONFLICT),
        (PermissionDeniedError("read-only identity"), ExitCode.DENIED),
        (InvalidArgumentError("bad quorum"), ExitCode.USAGE),
        (MetadataError("malformed"), ExitCode.ERROR),
        (BookieError("refused"), ExitCode.ERROR),
    ],
)
def test_errors_map_to_their_exit_code(error: BaseException, code: ExitCode) -> None:
    assert exit_code_for(error) == code


def test_exit_codes_of_real_commands(
    streamctl: Streamctl, capsys: pytest.CaptureFixture[str]
) -> None:
    quorum = ("--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1")
    # No bookie runs here: --allow-fewer-bookies lets the metadata cases be reached.
    assert streamctl("create", "--allow-fewer-bookies", "orders", *quorum) == 0
    assert streamctl("info", "missing") == 3
    assert streamctl("bookie", "decommission", "bookie-99") == 3
    assert (
        streamctl(
            "create", "--allow-fewer-bookies", "orders", "--ensemble", "2", "--write-quorum", "2"
        )
        == 5
    )
    assert (
        streamctl(
            "create", "--allow-fewer-bookies", "odd", "--ensemble", "2", "--write-quorum", "3"
        )
        == 2
    )
    assert streamctl("tail", "orders", "--from", "-1") == 2
    assert streamctl("no-such-command") == 2
    assert "Traceback" not in capsys.readouterr().err
