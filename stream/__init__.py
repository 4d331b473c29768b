"""Streamkeeper: a replicated, durable stream store. Importing it makes its logs go through the
standard `logging` module, quiet until the application configures logging (`stream.logs`)."""

from stream.logs import quiet_by_default

quiet_by_default()
