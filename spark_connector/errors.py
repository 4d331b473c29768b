"""Errors of the Spark connector, under the project's `StreamError`."""

from __future__ import annotations

from stream.errors import InvalidArgumentError, StreamError


class ConnectorOptionError(InvalidArgumentError):
    """An option of the `streamkeeper` data source is unknown, missing or malformed; the
    message names it (`option`)."""


class DataLossError(StreamError):
    """Entries a query still had to read were trimmed by retention (`failOnDataLoss=true`)."""
