"""Cloud Storage's object listing, as one pure function over a sorted list of names, and a client made of it.

    page(names, prefix, delimiter, start_offset, end_offset, token, max_results) -> Page

What objects.list documents, and what gcp-storage-emulator does not do (it answers every prefix in one page
and ignores startOffset, endOffset and maxResults): a page holds at most max_results entries, items and
prefixes together in name order, a prefix counted once, where its first object would be; startOffset
(inclusive) and endOffset (exclusive) apply to object names, and a prefix is returned when an object in
that range lies under it; a pageToken continues after the last entry of the page before. Here the token is
that entry itself (Cloud Storage's is opaque).

Used by the paging proxy in the tests (tests/gcs_fixtures.py re-pages the emulator's full answer with it)
and by the simulator, whose `Client` stands where google-cloud-storage's would and counts its requests.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

MAX_RESULTS = 1000  # the JSON API's cap on entries per page


@dataclass
class Page:
    """One answer: item names, prefixes (both in name order) and the token of the next page, if any."""

    items: list[str]
    prefixes: list[str]
    token: str | None


def after_subtree(prefix: str) -> str:
    """The least name after every name under `prefix` (which ends with the delimiter '/')."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _upper(prefix: str) -> str | None:
    """The least name not starting with prefix, or None for the empty prefix."""
    return after_subtree(prefix) if prefix else None


def page(names: Sequence[str], prefix: str = "", delimiter: str | None = None, start_offset: str | None = None,
         end_offset: str | None = None, token: str | None = None, max_results: int = MAX_RESULTS) -> Page:
    """The page Cloud Storage answers for these list parameters over `names` (sorted, unique)."""
    if delimiter not in (None, "/"):
        raise ValueError("the stand-in knows the delimiter '/' only")
    max_results = min(max_results, MAX_RESULTS)
    lo = bisect.bisect_left(names, max(prefix, start_offset or ""))
    upper = _upper(prefix)
    if end_offset is not None:
        upper = end_offset if upper is None else min(upper, end_offset)
    hi = len(names) if upper is None else bisect.bisect_left(names, upper, lo)
    if token is not None:  # continue after the entry the token names: past a whole prefix, or past one item
        if delimiter and token.endswith("/"):
            lo = max(lo, bisect.bisect_left(names, after_subtree(token), lo, hi))
        else:
            lo = max(lo, bisect.bisect_right(names, token, lo, hi))
    items: list[str] = []
    prefixes: list[str] = []
    pos, last = lo, None
    while pos < hi and len(items) + len(prefixes) < max_results:
        name = names[pos]
        cut = name.find("/", len(prefix)) if delimiter else -1
        if cut < 0:
            items.append(name)
            last, pos = name, pos + 1
        else:
            folder = name[:cut + 1]
            prefixes.append(folder)
            last, pos = folder, bisect.bisect_left(names, after_subtree(folder), pos, hi)
    return Page(items, prefixes, last if pos < hi else None)


@dataclass
class Blob:
    name: str
    size: int


class _Listing:
    """What google-cloud-storage's list_blobs returns, as far as shard_utils uses it: iterable over blobs,
    `.pages` (each iterable, with `.prefixes`), `.prefixes` gathered and `.next_page_token`."""

    def __init__(self, client: Client, kwargs: dict):
        self._client, self._kwargs = client, kwargs
        self.prefixes: set[str] = set()
        self.next_page_token: str | None = None
        self.pages = self._pages()

    def _pages(self) -> Iterator[_Page]:
        k = self._kwargs
        left = k.get("max_results")
        token = None
        while True:
            size = min(k.get("page_size") or MAX_RESULTS, left if left is not None else MAX_RESULTS)
            found = page(self._client.names, k.get("prefix") or "", k.get("delimiter"), k.get("start_offset"),
                         k.get("end_offset"), token, size)
            self._client.requests += 1
            self.prefixes.update(found.prefixes)
            if left is not None:
                left -= len(found.items)
            token = found.token if left is None or left > 0 else None
            self.next_page_token = token
            yield _Page(found, self._client.size)
            if token is None:
                return

    def __iter__(self) -> Iterator[Blob]:
        for one in self.pages:
            yield from one


class _Page:
    def __init__(self, found: Page, size: int):
        self._items, self.prefixes, self._size = found.items, found.prefixes, size

    def __iter__(self) -> Iterator[Blob]:
        return (Blob(n, self._size) for n in self._items)


@dataclass
class Client:
    """A storage client over one bucket's sorted names (every object `size` bytes) that counts requests."""

    names: Sequence[str]
    size: int = 1
    requests: int = 0

    def list_blobs(self, bucket: str, **kwargs) -> _Listing:
        return _Listing(self, kwargs)
