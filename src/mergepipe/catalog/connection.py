"""What the layers above see of a catalog connection, the same over DuckDB and PostgreSQL:
statements with `:name` parameters, rows read by name or position, and the one database error
they handle (a broken unique or key constraint)."""

from __future__ import annotations

import dataclasses
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache, cached_property
from typing import Any, Protocol, TypeVar

from mergepipe.core.errors import MergePipeError

# `:name` binds a parameter; `::` (a cast) and `\:` (a literal colon) do not, nor does a name
# followed by a colon (write CAST(:x AS T)): SQLAlchemy's text() rule, which PostgreSQL uses.
_PARAM = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")

Params = Mapping[str, Any]
T = TypeVar("T")


@dataclass(frozen=True)
class SQL:
    """One SQL statement whose parameters are written `:name`."""

    text: str

    @cached_property
    def names(self) -> tuple[str, ...]:
        """The parameter names, in order of first use."""
        return tuple(dict.fromkeys(_PARAM.findall(self.text)))

    @cached_property
    def numbered(self) -> str:
        """The statement with `$1, $2, ...` in place of the names (DuckDB's numbered style)."""
        index = {name: i + 1 for i, name in enumerate(self.names)}
        return _PARAM.sub(lambda m: f"${index[m.group(1)]}", self.text).replace("\\:", ":")

    def values(self, params: Params) -> list[Any]:
        """The parameter values in the order of `names`."""
        try:
            return [params[name] for name in self.names]
        except KeyError as e:
            raise KeyError(f"no value for the parameter :{e.args[0]} of {self.text[:200]!r}"
                           ) from None


def first_line(e: object) -> str:
    """The first line of an error's text (its type's name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class IntegrityError(Exception):
    """A statement broke a unique, primary-key or foreign-key constraint."""


class CatalogUnavailable(MergePipeError):
    """The PostgreSQL catalog cannot be reached (server down, wrong URL, refused login): an
    outage, not a bug, so a 503 that says when to try again."""

    status = 503
    code = "catalog_unavailable"
    retry_after_s = 5


class Row(tuple[Any, ...]):
    """A result row: a tuple whose values can also be read as attributes named by column."""

    __slots__ = ()
    _index: Mapping[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._index[name]]
        except KeyError:
            raise AttributeError(f"the row has no column {name!r} (it has "
                                 f"{', '.join(self._index)})") from None

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._index, self, strict=True))


@cache
def row_type(columns: tuple[str, ...]) -> type[Row]:
    """The Row class of one list of columns (the first of two equal names wins)."""
    index: dict[str, int] = {}
    for i, c in enumerate(columns):
        index.setdefault(c, i)
    return type("Row", (Row,), {"__slots__": (), "_index": index})


def as_dataclass(cls: type[T], row: Row | Mapping[str, Any]) -> T:
    """The dataclass `cls` of a row's columns named like its fields (timestamps as ISO text)."""
    m = row._mapping if isinstance(row, Row) else row
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v.isoformat() if isinstance(v, datetime) else v
                  for k, v in m.items() if k in names})


class Result:
    """The rows of one executed statement, all read, and the rows it changed."""

    def __init__(self, columns: Sequence[str], rows: list[tuple[Any, ...]],
                 rowcount: int = -1) -> None:
        self.columns = list(columns)
        self.rowcount = rowcount
        self._tuples = rows

    def tuples(self) -> list[tuple[Any, ...]]:
        """The rows as plain tuples (no per-row object: for results of 10^5 rows)."""
        return self._tuples

    @cached_property
    def rows(self) -> list[Row]:
        make = row_type(tuple(self.columns))
        return [make(r) for r in self._tuples]

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def fetchall(self) -> list[Row]:
        return self.rows

    def all(self) -> list[Row]:
        return self.rows

    def first(self) -> Row | None:
        return self.rows[0] if self.rows else None

    def one(self) -> Row:
        if len(self.rows) != 1:
            raise LookupError(f"expected one row, the statement returned {len(self.rows)}")
        return self.rows[0]

    def scalar_one(self) -> Any:
        return self.one()[0]

    def mappings(self) -> list[dict[str, Any]]:
        """The rows as dicts of column to value."""
        return [r._mapping for r in self.rows]


class DriverConnection(ABC):
    """`execute` over one driver's connection: `_run` runs a statement once, or once per mapping
    of a list (an empty list runs nothing); the driver's `integrity_error` is IntegrityError."""

    integrity_error: type[Exception] = IntegrityError

    def execute(self, statement: SQL, params: Params | Sequence[Params] | None = None
                ) -> Result:
        if params is None or isinstance(params, Mapping):
            sets: Params | list[Params] = params or {}
        else:
            sets = list(params)
            if not sets:
                return Result([], [], 0)
        try:
            return self._run(statement, sets)
        except self.integrity_error as e:
            raise IntegrityError(str(getattr(e, "orig", None) or e)) from e

    @abstractmethod
    def _run(self, statement: SQL, sets: Params | list[Params]) -> Result:
        ...


class Connection(Protocol):
    """A catalog connection inside one transaction (a writer's or a reader's)."""

    def execute(self, statement: SQL, params: Params | Sequence[Params] | None = None
                ) -> Result:
        """Run `statement` once with `params`, or once per mapping of a sequence of them."""
        ...
