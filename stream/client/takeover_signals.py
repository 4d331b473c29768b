"""How a takeover's steps tell it what happened, besides returning: retry the attempt later,
or stop because a newer term fenced it. Also raised by the placement of bookies, which the
writer shares."""

from __future__ import annotations

from stream.errors import StreamError


class RetryLater(Exception):
    """This attempt could not decide (unknown answers); retry after a backoff."""

    def __init__(self, error: StreamError) -> None:
        super().__init__(str(error))
        self.error = error


class Fenced(Exception):
    """A bookie answered INVALID_TERM (it knows `bookie_term`, newer than ours)."""

    def __init__(self, bookie_term: int) -> None:
        super().__init__(bookie_term)
        self.bookie_term = bookie_term
