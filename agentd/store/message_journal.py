"""The message journal an earlier agentd kept beside a SQLite database, applied once at
start and removed."""

from __future__ import annotations

import fcntl
import json
import logging
import re
import sqlite3
import struct
import zlib
from pathlib import Path
from typing import Any

from agentd.store.schema_steps import step_7

log = logging.getLogger("agentd.store")

# The message journal an earlier agentd kept beside a SQLite database ("<database>-messages"):
# a message's writes were appended there and applied to the database a little later, so a
# daemon killed in between left some behind. Each record is the payload's length and CRC-32
# (big-endian 32-bit each), then the payload, JSON `[seq, [[n, sql], ...], [[n, params],
# ...]]`: its number, the statements whose SQL the file gives for the first time (numbered),
# and its statements by number with their `$name` parameters. The database kept the highest
# number it had applied in `settings`; a rewrite of the file went through "<journal>.tmp".
_JOURNAL_HEAD = struct.Struct(">II")
JOURNAL_APPLIED_KEY = "run_journal_applied"
_NAMED_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def journal_path(path: Path) -> Path:
    """The message journal that belonged to the SQLite database at `path`."""
    return path.with_name(path.name + "-messages")


def _journal_records(data: bytes) -> list[tuple[int, list[tuple[str, dict[str, Any]]]]]:
    """The whole records at the start of `data`; a record torn by a crash (or damaged)
    ends them: it was never acknowledged."""
    out = []
    known: dict[int, str] = {}
    at = 0
    while at + _JOURNAL_HEAD.size <= len(data):
        size, crc = _JOURNAL_HEAD.unpack_from(data, at)
        payload = data[at + _JOURNAL_HEAD.size:at + _JOURNAL_HEAD.size + size]
        if len(payload) < size or zlib.crc32(payload) != crc:
            break
        seq, new, named = json.loads(payload)
        known.update((n, sql) for n, sql in new)
        if any(n not in known for n, _ in named):
            break
        out.append((int(seq), [(known[n], params) for n, params in named]))
        at += _JOURNAL_HEAD.size + size
    return out


def apply_message_journal(path: Path) -> None:
    """SQLite, at start: apply the message writes a killed daemon left in the journal
    beside the database at `path`, each once, then remove the file."""
    journal = journal_path(path)
    try:
        fh = open(journal, "rb")
    except FileNotFoundError:
        return
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            # The daemon that writes it still runs, and applies it itself.
            log.warning("%s is held by another process; left to it", journal)
            return
        conn = sqlite3.connect(str(path), timeout=5.0, isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys = ON")  # (a record is refused as the daemon refused it)
            if _apply_journal(conn.cursor(), journal, fh.read()):
                # Its times are in the form the daemon that wrote it used.
                step_7(conn.cursor(), "sqlite")
            journal.with_name(journal.name + ".tmp").unlink(missing_ok=True)
            journal.unlink()
            conn.execute("DELETE FROM settings WHERE key = ?", (JOURNAL_APPLIED_KEY,))
        finally:
            conn.close()


def _apply_journal(cur: sqlite3.Cursor, journal: Path, data: bytes) -> bool:
    """Apply the records the database has not applied yet; True when there were any."""
    cur.execute("SELECT value FROM settings WHERE key = ?", (JOURNAL_APPLIED_KEY,))
    row = cur.fetchone()
    applied = int(json.loads(row[0])["seq"]) if row is not None and row[0] is not None else 0
    left = [r for r in _journal_records(data) if r[0] > applied]
    if not left:
        return False
    log.info("applying %d message write(s) left in %s", len(left), journal)
    cur.execute("BEGIN IMMEDIATE")
    try:
        for seq, statements in left:
            cur.execute("SAVEPOINT record")
            try:
                for sql, params in statements:
                    cur.execute(_NAMED_PARAM.sub(r":\1", sql), params)
            except sqlite3.IntegrityError as exc:
                cur.execute("ROLLBACK TO record")
                log.error("a message write (journal record %d) was refused by the database and dropped: %s",
                          seq, exc)
            cur.execute("RELEASE record")
        # Marked in the same transaction: a crash before the file is gone must not apply
        # the records twice.
        cur.execute("INSERT INTO settings (key, value) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (JOURNAL_APPLIED_KEY, json.dumps({"seq": left[-1][0]})))
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    return True
