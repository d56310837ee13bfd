"""Streaming reader for Chrome-trace JSON (PyTorch/Kineto): event arrays in bounded chunks.

A Kineto trace is one JSON object whose ``traceEvents`` array holds nearly all the bytes. Parsing it whole
costs several times its size in memory, so this reader walks the top-level object itself, parses the small
values (device properties, distributed info, ...) with the standard decoder, and hands the events array to
a loader in chunks of about ``chunk_bytes``, each cut at an event boundary and wrapped as a JSON array. The
loader (DuckDB's JSON reader) does the parsing; Python never touches individual events.

A cut is made just before an event that follows ``}`` ``,``: such a place can also occur inside a string or
a nested list of objects, in which case the chunk does not parse and the cut moves back one boundary. A
chunk that still does not parse is checked with orjson, which tells a broken file (error in the middle, with
its byte offset) from a bad cut (error at the very end).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from xstack.errors import BadInputError

WS = b" \t\r\n"
GZIP_MAGIC = b"\x1f\x8b"


class ChunkRejected(Exception):
    """Raised by a loader when the chunk it was given is not valid JSON (or not an array of objects)."""


Loader = Callable[[memoryview], None]
"""Loads one chunk: consecutive events with the separators between them, without the array's brackets
(the loader adds them). The view is only valid during the call."""
PairLoader = Callable[[list[memoryview]], None]
"""Loads two consecutive chunks (views as for ``Loader``) in one go."""

READ_BYTES = 4 << 20


class TraceReader:
    """Reads one trace file, calling ``load`` with each chunk of its events; ``metadata`` gets the rest."""

    def __init__(
        self, path: Path, load: Loader, chunk_bytes: int = 16 << 20, load_pair: PairLoader | None = None
    ) -> None:
        self.path = path
        self.load = load
        self.load_pair = load_pair
        self.chunk_bytes = chunk_bytes
        self.metadata: dict[str, Any] = {}
        self.has_events_array = False
        self.chunks_loaded = 0
        self.bytes_read = 0  # size of the JSON document (decompressed), once read
        self._buf = bytearray()
        self._pos = 0
        self._base = 0  # file offset of _buf[0]
        self._eof = False
        self._fh: io.BufferedIOBase | None = None
        self._scratch = bytearray()  # read buffer, reused: no fresh allocation per read

    # -- public -----------------------------------------------------------------------------------------
    def run(self) -> None:
        """Read the whole file; raises ``BadInputError`` naming the file and the problem."""
        try:
            with self._open() as fh:
                self._fh = fh
                self._read_document()
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise BadInputError(f"{self.path}: truncated or corrupt gzip stream ({exc})") from exc
        except OSError as exc:
            raise BadInputError(f"{self.path}: cannot read ({exc.strerror or exc})") from exc
        finally:
            self._buf = bytearray()  # the caller keeps the reader (for its metadata), not its buffers
            self._scratch = bytearray()
            self._fh = None

    # -- input ------------------------------------------------------------------------------------------
    def _open(self) -> io.BufferedIOBase:
        if not self.path.exists():
            raise BadInputError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise BadInputError(f"{self.path}: is a directory, not a trace file")
        with open(self.path, "rb") as probe:
            gzipped = probe.read(2) == GZIP_MAGIC
        if gzipped:
            return gzip.GzipFile(self.path, "rb")
        return open(self.path, "rb")  # noqa: SIM115 - closed by the caller's with-block

    def _fill(self, want: int) -> bool:
        """Make at least ``want`` unread bytes available; False if the file ended first."""
        assert self._fh is not None
        while len(self._buf) - self._pos < want and not self._eof:
            if self._pos > (64 << 20) or (self._pos and self._pos >= len(self._buf) // 2):
                del self._buf[: self._pos]
                self._base += self._pos
                self._pos = 0
            if not self._scratch:
                self._scratch = bytearray(READ_BYTES)
            n = self._fh.readinto(self._scratch)
            if not n:
                self._eof = True
            else:
                self._buf += memoryview(self._scratch)[:n]
        return len(self._buf) - self._pos >= want

    def _skip_ws(self) -> int:
        """Skip whitespace; return the next byte (or -1 at end of file) without consuming it."""
        while True:
            buf, pos = self._buf, self._pos
            n = len(buf)
            while pos < n and buf[pos] in WS:
                pos += 1
            self._pos = pos
            if pos < n:
                return buf[pos]
            if not self._fill(1):
                return -1

    def _expect(self, chars: bytes, where: str) -> int:
        c = self._skip_ws()
        if c == -1 or c not in chars:
            found = "end of file" if c == -1 else repr(chr(c))
            raise self._syntax(f"expected {' or '.join(repr(chr(x)) for x in chars)} {where}, found {found}")
        self._pos += 1
        return c

    def _syntax(self, msg: str) -> BadInputError:
        return BadInputError(f"{self.path}: invalid JSON at byte {self._base + self._pos}: {msg}")

    # -- document structure -----------------------------------------------------------------------------
    def _read_document(self) -> None:
        if not self._fill(1):
            raise BadInputError(f"{self.path}: empty file, not a trace")
        if self._buf.startswith(b"\xef\xbb\xbf"):
            self._pos = 3
        c = self._skip_ws()
        if c == ord("["):
            self._pos += 1
            self.has_events_array = True
            self._read_events()
        elif c == ord("{"):
            self._pos += 1
            self._read_object()
        elif c == -1:
            raise BadInputError(f"{self.path}: empty file, not a trace")
        else:
            found = repr(chr(c)) if 32 <= c < 127 else f"byte 0x{c:02x}"
            raise BadInputError(f"{self.path}: not a PyTorch/Chrome trace: it does not start with a JSON object "
                                f"(found {found} at byte {self._base + self._pos})")  # fmt: skip
        if self._skip_ws() != -1:
            raise self._syntax("extra data after the end of the JSON document")
        self.bytes_read = self._base + self._pos

    def _read_object(self) -> None:
        if self._skip_ws() == ord("}"):
            self._pos += 1
            return
        while True:
            key = self._parse_small_value("a key")
            if not isinstance(key, str):
                raise self._syntax("object keys must be strings")
            self._expect(b":", f"after key {key!r}")
            if key == "traceEvents":
                self._expect(b"[", "to open traceEvents")
                self.has_events_array = True
                self._read_events()
            else:
                self.metadata[key] = self._parse_small_value(f"the value of {key!r}")
            if self._expect(b",}", "between top-level members") == ord("}"):
                return

    def _parse_small_value(self, what: str) -> Any:
        """Parse one JSON value that fits in memory comfortably (everything but the events array)."""
        decoder = json.JSONDecoder()
        self._skip_ws()
        want = 64 << 10
        while True:
            have = self._fill(want)
            text = bytes(self._buf[self._pos :]).decode("utf-8", errors="replace")
            try:
                value, end = decoder.raw_decode(text)
            except json.JSONDecodeError as exc:
                if have:  # more bytes may complete the value
                    want *= 4
                    continue
                if not text[exc.pos :].strip():  # the error is where the file ends: cut short, not malformed
                    end = self._base + len(self._buf)
                    raise BadInputError(f"{self.path}: truncated: the file ends at byte {end}, inside {what}") from None
                self._pos += len(text[: exc.pos].encode("utf-8"))  # where the error is, not where the value began
                raise self._syntax(f"{exc.msg} in {what}") from None
            self._pos += len(text[:end].encode("utf-8"))
            return value

    # -- the events array -------------------------------------------------------------------------------
    def _read_events(self) -> None:
        window = self.chunk_bytes
        while True:
            c = self._skip_ws()
            if c == ord("]"):
                self._pos += 1
                return
            if c == -1:
                raise self._syntax("file ends inside the traceEvents array")
            if c != ord("{"):
                raise BadInputError(
                    f"{self.path}: not a PyTorch/Chrome trace: the event at byte {self._base + self._pos} "
                    "is not a JSON object"
                )
            if window == self.chunk_bytes and self._load_pair():
                continue
            self._fill(window)
            end = min(len(self._buf), self._pos + window)
            if self._load_to_boundary(end):
                window = self.chunk_bytes
            elif not self._eof:
                window *= 2  # one event larger than the window, or no boundary yet
            else:
                self._load_tail()

    def _load_pair(self) -> bool:
        """With ``load_pair``, load the next two chunks in one call (which may parse them in parallel).

        False, having loaded nothing, when there is no such loader, the file has less than two windows left,
        a window has no boundary, or the pair is rejected: the one-chunk path then takes over from the same
        place, finding a good cut or reporting the file's error exactly as without pairs."""
        if self.load_pair is None or not self._fill(2 * self.chunk_bytes):
            return False
        buf, start = self._buf, self._pos
        cut1, nxt1 = _last_boundary(buf, start, start + self.chunk_bytes)
        if cut1 < 0:
            return False
        cut2, nxt2 = _last_boundary(buf, nxt1, nxt1 + self.chunk_bytes)
        if cut2 < 0:
            return False
        with memoryview(buf) as whole, whole[start : cut1 + 1] as first, whole[nxt1 : cut2 + 1] as second:
            try:
                self.load_pair([first, second])
            except ChunkRejected:
                return False
        self.chunks_loaded += 2
        self._pos = nxt2
        return True

    def _load_to_boundary(self, end: int) -> bool:
        """Load events up to the last boundary before ``end``; False if there is none."""
        buf, start = self._buf, self._pos
        j = end
        while True:
            cut, nxt = _last_boundary(buf, start, j)
            if cut < 0:
                return False
            if self._try_load(start, cut + 1, allow_bad_cut=True):
                self._pos = nxt
                return True
            j = cut  # the boundary was inside a string or a nested list: use the one before

    def _load_tail(self) -> None:
        """At end of file: load the last event(s), whose end is the last '}' that makes a valid array."""
        buf, start = self._buf, self._pos
        j = len(buf)
        while True:
            cut = buf.rfind(b"}", start, j)
            if cut < 0:
                raise self._syntax("file ends inside the traceEvents array")
            try:
                orjson.loads(b"".join((b"[", memoryview(buf)[start : cut + 1], b"]")))
            except orjson.JSONDecodeError:
                j = cut
                continue
            self._try_load(start, cut + 1, allow_bad_cut=False)
            self._pos = cut + 1
            return

    def _try_load(self, start: int, end: int, *, allow_bad_cut: bool) -> bool:
        """Load the events in ``_buf[start:end]``; False if that is a bad cut (and ``allow_bad_cut``)."""
        rejected: ChunkRejected | None = None
        with memoryview(self._buf) as whole, whole[start:end] as body:
            try:
                self.load(body)
            except ChunkRejected as exc:
                rejected = exc
        if rejected is None:
            self.chunks_loaded += 1
            return True
        text = b"".join((b"[", memoryview(self._buf)[start:end], b"]"))
        try:
            orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            # orjson counts characters, not bytes: compare and report in the right unit
            chars = text.decode("utf-8", errors="replace")
            if allow_bad_cut and exc.pos >= len(chars) - 2:
                return False
            offset = self._base + self._pos + max(len(chars[: exc.pos].encode("utf-8")) - 1, 0)
            raise BadInputError(f"{self.path}: invalid JSON at byte {offset}: {exc.msg}") from None
        events = orjson.loads(text)
        raise BadInputError(f"{self.path}: traceEvents holds an unreadable event: {_unreadable(events, rejected)}"
                            ) from None  # fmt: skip


NUMBERS = ("ts", "dur")
"""The event fields that must be numbers (microseconds; a numeric string is read as one)."""


def _unreadable(events: object, rejected: ChunkRejected) -> str:
    """Which event of a chunk that parsed as JSON the loader refused, and why: the first that is not an object or
    whose ``ts`` or ``dur`` is not a number; else the loader's own reason, without its scratch file's name."""
    seen = events if isinstance(events, list) else []
    for event in seen:
        if not isinstance(event, dict):
            return f"an event is {type(event).__name__} {_clip(event)}, not an object"
        for key in NUMBERS:
            value = event.get(key)
            if value is not None and not isinstance(value, (int, float)) and not _numeric(value):
                return f"event {event.get('name')!r} (ph {event.get('ph')!r}): {key} is {_clip(value)}, not a number"
    return re.sub(r' in file "[^"]*",?', "", str(rejected))


def _numeric(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def _clip(value: object) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def _last_boundary(buf: bytearray, start: int, end: int) -> tuple[int, int]:
    """Find the last ``}`` ws* ``,`` ws* ``{`` in buf[start:end]: (index of '}', index of '{'), or (-1, -1)."""
    j = end
    while True:
        brace = buf.rfind(b"{", start + 1, j)
        if brace < 0:
            return -1, -1
        k = brace - 1
        while k > start and buf[k] in WS:
            k -= 1
        if buf[k] == 0x2C:  # ','
            k -= 1
            while k > start and buf[k] in WS:
                k -= 1
            if buf[k] == 0x7D:  # '}'
                return k, brace
        j = brace
