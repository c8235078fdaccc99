"""A run's end-of-message writes: made durable by one append to a journal file, applied to
SQLite in batches.

Why: on a lone SQLite daemon every message ended in its own transaction (usage rows, the
last-active time, the session's new messages, the run record): some 0.13 ms of the
daemon's 0.85 ms of CPU per `/v1` message, most of it the commit's ten WAL frames written
two syscalls each, and the per-statement work of a cold cache. Removing those writes
outright (a throwaway tree) took the benchmark from 0.65x to 0.76x the bare proxy at one
connection. Here the request thread writes the message's statements to the journal, one
`write(2)`, and the answer goes out; a thread of its own applies what has gathered every
`interval` (50 ms) in one transaction on the run writer's connection, where consecutive
messages share the commit and the pages they append to.

What "written" means does not change. SQLite's WAL with `synchronous = NORMAL` (the
store's setting) does not sync a commit either: a committed message survives the process
being killed, not the machine losing power. A journal append is the same: it is in the
kernel's page cache when the answer goes out, and the next start applies every record it
holds that the database has not (each record has a sequence number; the highest applied
one is kept in `settings`, in the transaction that applied it). A record torn by a crash
mid-append fails its checksum and is ignored, and so is everything after it.

Nothing reads around it: `Store` applies what is pending before any Pony session's first
statement and before any other write, so an answer's messages, usage and run record are
visible to every read that follows it, and a later delete or change is never overtaken by
an older pending write. Only one process applies a journal: it holds an exclusive `flock`
on the file; a second process opening the same database writes synchronously.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import struct
import threading
import zlib
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, TypeVar

from agentd.store.writer import SqliteTx, SqliteWriter, Tx

log = logging.getLogger("agentd.store")

T = TypeVar("T")

INTERVAL = 0.05  # seconds a record may wait for the batch it is applied in
RETRY_SECS = 1.0  # pause after a batch failed (the records stay pending)
REWRITE_BYTES = 1 << 20  # a journal never empty when a batch ends is rewritten past this size
APPLIED_KEY = "run_journal_applied"  # settings key: the highest sequence number applied
_HEAD = struct.Struct(">II")  # payload length, CRC-32 of the payload
_MARK = ("INSERT INTO settings (key, value) VALUES ($key, $value) "
         "ON CONFLICT (key) DO UPDATE SET value = excluded.value")

Statement = tuple[str, dict[str, Any]]


class JournalBusy(Exception):
    """Another process holds the journal (and applies it)."""


class RecordingTx:
    """A `Tx` that keeps its statements for later. Every statement "changes one row": work
    written for it must not branch on row counts (let the SQL's own conditions decide).
    The parameters are kept as given, so they must not change afterwards."""

    def __init__(self) -> None:
        self.statements: list[Statement] = []

    def execute(self, sql: str, params: dict[str, Any]) -> int:
        self.statements.append((sql, params))
        return 1


def _text(value: Any) -> str:
    # sqlite3's own adapter for a datetime parameter is `isoformat(" ")`: applied from the
    # journal or from memory, the column gets the same text.
    if isinstance(value, datetime):
        return value.isoformat(" ")
    raise TypeError(f"a journaled parameter cannot be {type(value).__name__}")


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False, default=_text)


class Encoder:
    """Journal records of one file: a statement's SQL is written with the first record that
    uses it, later ones name it by number (`reset()` when the file starts again)."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}

    def reset(self) -> None:
        self.numbers = {}

    def encode(self, seq: int, statements: list[Statement]) -> bytes:
        """One record: its length and checksum, then `[seq, new SQL, statements]` as JSON."""
        numbers = self.numbers
        new = []
        named = []
        for sql, params in statements:
            n = numbers.get(sql)
            if n is None:
                n = numbers[sql] = len(numbers)
                new.append((n, sql))
            named.append((n, params))
        payload = _ENCODER.encode([seq, new, named]).encode("utf-8")
        return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def encode(seq: int, statements: list[Statement]) -> bytes:
    """A record that is the first of its file."""
    return Encoder().encode(seq, statements)


def decode(data: bytes) -> list[tuple[int, list[Statement]]]:
    """The whole records at the start of `data`, in order; a short or damaged one ends them."""
    out = []
    known: dict[int, str] = {}
    at = 0
    while at + _HEAD.size <= len(data):
        size, crc = _HEAD.unpack_from(data, at)
        payload = data[at + _HEAD.size:at + _HEAD.size + size]
        if len(payload) < size or zlib.crc32(payload) != crc:
            break
        seq, new, named = json.loads(payload)
        known.update((n, sql) for n, sql in new)
        if any(n not in known for n, _ in named):
            break
        out.append((int(seq), [(known[n], params) for n, params in named]))
        at += _HEAD.size + size
    return out


class Journal:
    """The append-only file, locked to this process for as long as it is open."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = self._open(path)

    @staticmethod
    def _open(path: Path) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise JournalBusy(str(path)) from None
        return fd

    def read(self) -> bytes:
        return os.pread(self.fd, os.fstat(self.fd).st_size, 0)  # (a regular file: all of it)

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def clear(self) -> None:
        os.ftruncate(self.fd, 0)

    def rewrite(self, records: list[bytes]) -> None:
        """Replace the file by one holding `records` only (renamed into place: a crash
        leaves the old file or the new one)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = self._open(tmp)
        try:
            os.write(fd, b"".join(records))
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        os.close(self.fd)
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)  # (closing releases the lock)


def read_applied(cursor: Any) -> int:
    """The highest record sequence number the database holds (0: none)."""
    row = cursor.execute("SELECT value FROM settings WHERE key = ?", (APPLIED_KEY,)).fetchone()
    return int(json.loads(row[0])["seq"]) if row is not None and row[0] is not None else 0


def _mark(seq: int) -> str:
    # An object, not a bare number: the column's JSON type has numeric affinity in SQLite,
    # which would store "7" as the integer 7, and Pony reads the column as JSON text.
    return json.dumps({"seq": seq})


def apply_records(tx: SqliteTx, records: list[tuple[int, list[Statement]]]) -> None:
    """Run the records' statements in `tx` and mark the last one applied.

    Consecutive records made of the same statements (most messages are) run statement by
    statement across them, each as one `executemany`: the n-th statement of every such
    record, then the next. That keeps each table's rows in record order; it may move a
    statement ahead of another record's statement on another table, which a message's
    write allows (its statements depend only on earlier ones of its own record and on
    their own table's earlier rows)."""
    at = 0
    while at < len(records):
        shape = [sql for sql, _ in records[at][1]]
        end = at + 1
        while end < len(records) and len(records[end][1]) == len(shape) and all(
                sql == other for (sql, _), other in zip(records[end][1], shape)):
            end += 1
        if end - at == 1:
            for sql, params in records[at][1]:
                tx.execute(sql, params)
        else:
            for i, sql in enumerate(shape):
                tx.execute_many(sql, [statements[i][1] for _, statements in records[at:end]])
        at = end
    tx.execute(_MARK, {"key": APPLIED_KEY, "value": _mark(records[-1][0])})


def replay(journal: Journal, writer: SqliteWriter) -> int:
    """At open: apply the records a previous process left unapplied; the highest sequence
    number applied, from which this process numbers its own."""
    applied = read_applied(writer.conn)
    left = [r for r in decode(journal.read()) if r[0] > applied]
    if left:
        log.info("applying %d message write(s) left in %s", len(left), journal.path)
        _apply_each(writer, left)
        applied = left[-1][0]
    journal.clear()
    return applied


def _apply_each(writer: SqliteWriter, records: list[tuple[int, list[Statement]]]) -> None:
    """All records in one transaction; if that fails, one transaction each. A record the
    database refuses (a constraint) is logged and dropped; any other failure is raised,
    the records it left unapplied still pending."""
    try:
        writer.run_own(lambda tx: apply_records(tx, records))
        return
    except sqlite3.IntegrityError:
        pass
    for record in records:
        try:
            writer.run_own(lambda tx: apply_records(tx, [record]))
        except sqlite3.IntegrityError as exc:
            log.error("a message write (journal record %d) was refused by the database and dropped: %s",
                      record[0], exc)
            writer.run_own(lambda tx: tx.execute(_MARK, {"key": APPLIED_KEY, "value": _mark(record[0])}))


class DeferredWrites:
    """Journal now, apply in batches (see the module doc)."""

    def __init__(self, writer: SqliteWriter, journal: Journal, applied: int,
                 interval: float = INTERVAL) -> None:
        self.writer = writer
        self.journal = journal
        self.interval = interval
        self.batches = 0  # transactions that applied records (read by tests)
        self._seq = applied
        self._encoder = Encoder()  # (of the journal file as it is now)
        self._pending: list[tuple[int, list[Statement]]] = []
        self._lock = threading.Lock()  # the pending list and the file, in sequence order
        self._applying = threading.Lock()  # one batch at a time
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="agentd-run-writes", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def record(self, work: Callable[[Tx], T]) -> T:
        """`work(tx)`'s statements, journaled for the next batch; its result."""
        tx = RecordingTx()
        result = work(tx)
        if not tx.statements:
            return result
        with self._lock:
            if self._closed:
                raise sqlite3.ProgrammingError("the store is closed")
            seq = self._seq + 1
            self.journal.append(self._encoder.encode(seq, tx.statements))  # (raises before it counts)
            self._seq = seq
            first = not self._pending
            self._pending.append((seq, tx.statements))
        if first:
            self._wake.set()
        return result

    def settle(self) -> None:
        """Apply whatever is pending now (a read or another write is about to follow)."""
        if self._pending:
            self.apply()

    def apply(self) -> None:
        with self._applying:
            with self._lock:
                batch = list(self._pending)
            if not batch:
                return
            _apply_each(self.writer, batch)
            self.batches += 1
            with self._lock:
                del self._pending[:len(batch)]
                if not self._pending:
                    self.journal.clear()
                    self._encoder.reset()
                elif self.journal.size() > REWRITE_BYTES:
                    encoder = Encoder()
                    self.journal.rewrite([encoder.encode(seq, statements) for seq, statements in self._pending])
                    self._encoder = encoder
                more = bool(self._pending)
            if more:
                self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if self._stop.wait(self.interval):
                return
            self._wake.clear()
            try:
                self.apply()
            except Exception as exc:  # noqa: BLE001 - kept pending; retried after a pause
                log.warning("applying message writes failed (kept, retried in %g s): %s", RETRY_SECS, exc)
                if self._stop.wait(RETRY_SECS):
                    return
                self._wake.set()

    def close(self) -> None:
        """Stop the thread, apply what is pending, release the journal. Records the database
        refuses to take now stay in the journal for the next start."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        with self._lock:
            self._closed = True
        try:
            self.apply()
        except Exception as exc:  # noqa: BLE001 - kept in the journal, applied at the next start
            log.error("%d message write(s) could not be applied and stay in %s for the next start: %s",
                      len(self._pending), self.journal.path, exc)
        if not self._pending:
            self.journal.clear()
            self._encoder.reset()
        self.journal.close()
