"""Streamkeeper: a replicated, durable stream store. Importing it makes its logs go through the
standard `logging` module, quiet until the application configures logging (`stream.logs`)."""

from stream.logs import use_standard_logging

use_standard_logging()
