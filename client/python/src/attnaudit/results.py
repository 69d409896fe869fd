"""Stored results: ListResults pages as one lazy iterator, and as a table.

    for s in client.list_results(run="grpo-7", verdict="DRIFT", since=3600):
        print(s.job_id, s.layer, s.step, s.engine_out.max_abs, s.diagnosis)

    df = client.list_results(model="llama3-8b", limit=10_000).to_pandas()
    client.list_results(run="grpo-7").to_parquet("grpo-7.parquet")

list_results() returns a ResultIterator (ResultSummary views, newest
first) that asks for the next page only when the previous one has been
consumed, following the server's page tokens, and stops after `limit`
results; list_pairs() a PairIterator of the train-rollout pairs the server
joined (attnaudit.pairs.PairResult views), the same way.
results_to_pandas() / results_to_parquet() turn any iterable of
ResultSummary or JobResult views (a list_results() iterator, a watch, a
list) into one flat row per result, with the columns of COLUMNS;
pairs_to_pandas() one row per pair row. pandas and pyarrow are optional:
only these functions need them, and they raise an ImportError naming the
package when it is missing.
"""

from __future__ import annotations

import collections
import importlib
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, Generic, Iterable,
                    Iterator, List, Optional, Sequence, TypeVar)

from attnaudit.v1 import service_pb2

from ._records import COLUMNS, summarize
from ._pair_views import PAIR_COLUMNS, PairResult
from .report import JobResult, ResultSummary

V = TypeVar("V")

_STRING = ("job_id", "state", "verdict", "model", "engine", "backend", "run",
           "diagnosis", "replica", "error_message")
_NULLABLE_INT = ("layer", "step", "error_code")
_FLOAT = ("engine_out_max_abs", "engine_out_rms", "engine_lse_max_abs",
          "replay_out_max_abs", "logprob_max_abs", "audit_seconds")
_TIME = ("submit_time", "finish_time")


# ---------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------


def _as_summary(item: Any) -> ResultSummary:
    if isinstance(item, ResultSummary):
        return item
    if isinstance(item, service_pb2.ResultSummary):
        return ResultSummary(item)
    if isinstance(item, JobResult):
        return ResultSummary(summarize(item.proto))
    if isinstance(item, service_pb2.JobResult):
        return ResultSummary(summarize(item))
    raise TypeError(f"expected ResultSummary or JobResult views (or their messages), "
                    f"got {type(item).__name__}")


def record_of(item: Any) -> Dict[str, Any]:
    """One result (a ResultSummary or JobResult view, or its message) as a
    flat dict with the keys of COLUMNS. Absent values are None: text left
    empty, a layer or step not labelled, a drift not compared, the error of
    a DONE job."""
    return _as_summary(item).to_record()


def _require(module: str, what: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"attnaudit.{what} needs {module.split('.')[0]}, which is not installed: "
            f"pip install {module.split('.')[0]} (or 'attnaudit[{extra}]')") from e


def _columns(results: Iterable[Any]) -> Dict[str, List[Any]]:
    records = [record_of(r) for r in results]
    return {name: [r[name] for r in records] for name in COLUMNS}


def results_to_pandas(results: Iterable[Any]) -> Any:
    """A pandas.DataFrame with one row per result and the columns of
    COLUMNS: text as str (None when empty), state and verdict as their
    names, layer / step / error_code as nullable Int64, the drift numbers
    as float64 (NaN when not compared), the times as datetime64[ns, UTC]
    (NaT when unset).
    `results`: ResultSummary or JobResult views, e.g. client.list_results()
    or a watch. ImportError when pandas is not installed."""
    pd = _require("pandas", "results_to_pandas", "pandas")
    columns = _columns(results)
    frame = pd.DataFrame({name: pd.Series(values, dtype=object)
                          for name, values in columns.items()}, columns=list(COLUMNS))
    for name in _NULLABLE_INT:
        frame[name] = pd.array(columns[name], dtype="Int64")
    for name in _FLOAT:
        frame[name] = pd.array([float("nan") if v is None else v for v in columns[name]],
                               dtype="float64")
    frame["cursor"] = pd.array(columns["cursor"], dtype="int64")
    for name in _TIME:
        frame[name] = pd.to_datetime(pd.Series(columns[name], dtype=object),
                                     utc=True).astype("datetime64[ns, UTC]")
    return frame


def results_to_parquet(results: Iterable[Any], path: Any) -> int:
    """Writes the rows of results_to_pandas to a Parquet file at `path`
    (with pyarrow; pandas is not needed) and returns how many rows it
    wrote. ImportError when pyarrow is not installed."""
    pa = _require("pyarrow", "results_to_parquet", "parquet")
    pq = _require("pyarrow.parquet", "results_to_parquet", "parquet")
    types = {}
    for name in COLUMNS:
        if name in _STRING:
            types[name] = pa.string()
        elif name in _NULLABLE_INT or name == "cursor":
            types[name] = pa.int64()
        elif name in _FLOAT:
            types[name] = pa.float64()
        else:
            types[name] = pa.timestamp("us", tz="UTC")
    schema = pa.schema([(name, types[name]) for name in COLUMNS])
    table = pa.Table.from_pydict(_columns(results), schema=schema)
    pq.write_table(table, str(path))
    return table.num_rows


def pairs_to_pandas(pairs: Iterable[PairResult]) -> Any:
    """A pandas.DataFrame with one row per pair row (the columns of
    attnaudit.pairs.PAIR_COLUMNS: each row's request id, position, verdict
    and ulps beside its pair's run, layer, steps, weight versions, verdicts
    and job ids); layer and steps as nullable Int64, join_time as
    datetime64[ns, UTC]. `pairs`: PairResult views, e.g. client.list_pairs().
    ImportError when pandas is not installed."""
    pd = _require("pandas", "pairs_to_pandas", "pandas")
    records = [r for p in pairs for r in p.to_records()]
    frame = pd.DataFrame.from_records(records, columns=list(PAIR_COLUMNS))
    for name in ("layer", "rollout_step", "trainer_step", "position", "keys_compared"):
        frame[name] = pd.array([r[name] for r in records], dtype="Int64")
    frame["join_time"] = pd.to_datetime(pd.Series([r["join_time"] for r in records],
                                                  dtype=object),
                                        utc=True).astype("datetime64[ns, UTC]")
    return frame


# ---------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------


class _Pager(Generic[V]):
    """The paging state every iterator shares: the request, the token, the
    buffered rows, the limit, and how a response's rows (`items`) become
    views (`view`)."""

    def __init__(self, request: Any, limit: Optional[int],
                 items: Callable[[Any], Sequence[Any]], view: Callable[[Any], V]):
        if limit is not None and (isinstance(limit, bool) or int(limit) < 0):
            raise ValueError(f"limit: must be >= 0 or None, got {limit!r}")
        self.request = request
        self.limit = None if limit is None else int(limit)
        self.page_size = request.page_size
        self._items = items
        self._view = view
        self.buffer: "collections.deque[Any]" = collections.deque()
        self.token: Optional[str] = None  # None: no page read yet; "": last page read
        self.returned = 0
        self.pages_read = 0

    def exhausted(self) -> bool:
        return self.limit is not None and self.returned >= self.limit

    def needs_page(self) -> bool:
        return not self.buffer and self.token != ""

    def next_request(self) -> bytes:
        self.request.page_token = self.token or ""
        if self.limit is not None:  # never ask for rows past the limit
            wanted = self.limit - self.returned - len(self.buffer)
            self.request.page_size = max(1, min(self.page_size, wanted))
        return self.request.SerializeToString()

    def take_page(self, response: Any) -> None:
        self.pages_read += 1
        self.buffer.extend(self._items(response))
        token = response.next_page_token
        # A token that does not move would repeat the page forever.
        self.token = "" if token == (self.token or "") else token

    def pop(self) -> Optional[V]:
        if self.exhausted() or not self.buffer:
            return None
        self.returned += 1
        return self._view(self.buffer.popleft())


def _results(response: service_pb2.ListResultsResponse) -> Sequence[Any]:
    return response.results


def _pairs(response: service_pb2.ListPairsResponse) -> Sequence[Any]:
    return response.pairs


class _Paged(Generic[V]):
    """An iterator over the views of a List call's pages, read a page at a
    time as iteration reaches it (it can be consumed once)."""

    def __init__(self, fetch: Callable[[bytes], Any], pager: _Pager[V]):
        self._fetch = fetch
        self._pager = pager

    @property
    def pages_read(self) -> int:
        """List calls made so far."""
        return self._pager.pages_read

    def __iter__(self) -> Iterator[V]:
        return self

    def __next__(self) -> V:
        pager = self._pager
        while not pager.exhausted() and pager.needs_page():
            pager.take_page(self._fetch(pager.next_request()))
        item = pager.pop()
        if item is None:
            raise StopIteration
        return item

    def to_list(self) -> List[V]:
        return list(self)


class _AsyncPaged(Generic[V]):
    """The asyncio twin of _Paged: `async for x in ...`."""

    def __init__(self, fetch: Callable[[bytes], Awaitable[Any]], pager: _Pager[V]):
        self._fetch = fetch
        self._pager = pager

    @property
    def pages_read(self) -> int:
        return self._pager.pages_read

    def __aiter__(self) -> AsyncIterator[V]:
        return self

    async def __anext__(self) -> V:
        pager = self._pager
        while not pager.exhausted() and pager.needs_page():
            pager.take_page(await self._fetch(pager.next_request()))
        item = pager.pop()
        if item is None:
            raise StopAsyncIteration
        return item

    async def to_list(self) -> List[V]:
        return [x async for x in self]


class ResultIterator(_Paged[ResultSummary]):
    """The results of client.list_results(), newest first, read a page at
    a time as iteration reaches it (an iterator: it can be consumed once).
    to_list(), to_records(), to_pandas() and to_parquet() consume what is
    left."""

    def __init__(self, fetch: Callable[[bytes], service_pb2.ListResultsResponse],
                 request: service_pb2.ListResultsRequest, limit: Optional[int] = None):
        super().__init__(fetch, _Pager(request, limit, _results, ResultSummary))

    def to_records(self) -> List[Dict[str, Any]]:
        """One flat dict per result (the columns of COLUMNS)."""
        return [record_of(s) for s in self]

    def to_pandas(self) -> Any:
        """A pandas.DataFrame of the results (results_to_pandas)."""
        return results_to_pandas(self)

    def to_parquet(self, path: Any) -> int:
        """Writes the results to a Parquet file (results_to_parquet)."""
        return results_to_parquet(self, path)


class AsyncResultIterator(_AsyncPaged[ResultSummary]):
    """The asyncio twin of ResultIterator: `async for s in ...`, and
    `await it.to_list()`, `await it.to_pandas()`, `await it.to_parquet(path)`."""

    def __init__(self, fetch: Callable[[bytes], Awaitable[service_pb2.ListResultsResponse]],
                 request: service_pb2.ListResultsRequest, limit: Optional[int] = None):
        super().__init__(fetch, _Pager(request, limit, _results, ResultSummary))

    async def to_records(self) -> List[Dict[str, Any]]:
        return [record_of(s) for s in await self.to_list()]

    async def to_pandas(self) -> Any:
        return results_to_pandas(await self.to_list())

    async def to_parquet(self, path: Any) -> int:
        return results_to_parquet(await self.to_list(), path)


class PairIterator(_Paged[PairResult]):
    """The pairs of client.list_pairs(), newest first, read a page at a
    time as iteration reaches it (an iterator: it can be consumed once).
    to_list(), to_records() (one dict per pair row) and to_pandas() consume
    what is left."""

    def __init__(self, fetch: Callable[[bytes], service_pb2.ListPairsResponse],
                 request: service_pb2.ListPairsRequest, limit: Optional[int] = None):
        super().__init__(fetch, _Pager(request, limit, _pairs, PairResult))

    def to_records(self) -> List[Dict[str, Any]]:
        """One flat dict per pair row (attnaudit.pairs.PAIR_COLUMNS)."""
        return [r for p in self for r in p.to_records()]

    def to_pandas(self) -> Any:
        """A pandas.DataFrame, one row per pair row (pairs_to_pandas)."""
        return pairs_to_pandas(self)


class AsyncPairIterator(_AsyncPaged[PairResult]):
    """The asyncio twin of PairIterator: `async for p in ...`, and
    `await it.to_list()`, `await it.to_records()`, `await it.to_pandas()`."""

    def __init__(self, fetch: Callable[[bytes], Awaitable[service_pb2.ListPairsResponse]],
                 request: service_pb2.ListPairsRequest, limit: Optional[int] = None):
        super().__init__(fetch, _Pager(request, limit, _pairs, PairResult))

    async def to_records(self) -> List[Dict[str, Any]]:
        return [r for p in await self.to_list() for r in p.to_records()]

    async def to_pandas(self) -> Any:
        return pairs_to_pandas(await self.to_list())
