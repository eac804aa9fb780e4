"""Errors raised by the trajectory store.

Each carries a single human-readable line (the CLI prints `str(err)` and exits),
so messages name what failed and where: the id, or the file, line and field.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises on purpose."""


class NotFoundError(StoreError, KeyError):
    """No run / trajectory with that id (or id prefix).

    Subclasses KeyError so `except KeyError` works, but overrides `__str__`:
    KeyError would otherwise wrap the message in quotes.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not found"


class AmbiguousIdError(StoreError, KeyError):
    """An id prefix matches more than one trajectory."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "ambiguous id"


class DuplicateIdError(StoreError, ValueError):
    """A run or trajectory with that id is already in the store."""


class NotAStoreError(StoreError, ValueError):
    """A file that is not an agentrft store: empty, not SQLite, or another program's database."""


class BadRecordError(StoreError, ValueError):
    """An import file holds a record that is not valid JSON or fails validation.

    The message has the form `FILE line N: field 'a.b': reason`.
    """
