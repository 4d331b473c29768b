"""`streamctl recover NAME --accept-loss` decides, from the survey, whether to run at all and
whether it was confirmed; the recovery itself is stubbed out here (the real one runs in
tests/integration/test_limbo_accept_loss.py and the simulator's limbo-stall)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from stream.cli import streams as cli
from stream.cli.main import build_parser
from stream.client.accept_loss import BookieLimboState, LossSurvey
from stream.metadata import AcceptedLoss

STUCK = LossSurvey(
    stream="orders",
    term=7,
    state="IN_RECOVERY",
    bookies=(
        BookieLimboState("b1", True, True, 53, 53),
        BookieLimboState("b2", True, True, 50, 53),
        BookieLimboState("b3", True, False, 53, 53),
    ),
    last_held_entry_id=53,
    lac=53,
    first_at_risk=54,
    last_at_risk=8245,
)
HEALTHY = LossSurvey("orders", 7, "OPEN", (BookieLimboState("b1", True),), 53, 53, 54, 8245)
LOSS = AcceptedLoss(8, 54, 8245, ("b1", "b2"), "ops@host", 1_700_000_000_000)


class FakeClient:
    def __init__(self, survey: LossSurvey) -> None:
        self.survey = survey
        self.recovered = 0

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def survey_loss(self, name: str) -> LossSurvey:
        return self.survey

    def recover_accepting_loss(self, name: str) -> AcceptedLoss:
        self.recovered += 1
        return LOSS


def run(monkeypatch: pytest.MonkeyPatch, client: FakeClient, *args: str, tty: bool = False) -> int:
    monkeypatch.setattr(cli, "_client", lambda _args: client)
    stdin: Any = io.StringIO("yes\n")
    stdin.isatty = lambda: tty
    monkeypatch.setattr("sys.stdin", stdin)
    parsed = build_parser().parse_args(["recover", "orders", *args])
    return int(parsed.handler(parsed))


def test_refuses_without_accept_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient(STUCK)
    assert run(monkeypatch, client) == 2
    assert client.recovered == 0


def test_refuses_without_confirmation_when_no_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = FakeClient(STUCK)
    assert run(monkeypatch, client, "--accept-loss") == 2
    assert client.recovered == 0
    out, err = capsys.readouterr()
    assert "54..8245" in out and "--yes" in err


def test_asks_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = FakeClient(STUCK)
    assert run(monkeypatch, client, "--accept-loss", tty=True) == 0
    assert client.recovered == 1
    assert "gave up entries 54..8245" in capsys.readouterr().out


def test_nothing_to_do_without_limbo(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient(HEALTHY)
    assert run(monkeypatch, client, "--accept-loss", "--yes") == 0
    assert client.recovered == 0


def test_yes_and_json_for_scripts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = FakeClient(STUCK)
    assert run(monkeypatch, client, "--accept-loss", "--yes", "--output", "json") == 0
    assert client.recovered == 1
    report = json.loads(capsys.readouterr().out)  # stdout holds the JSON only
    assert report["recovered"] is True
    assert report["survey"]["limbo_bookies"] == ["b1", "b2"]
    assert report["accepted_loss"] == LOSS.to_dict()
