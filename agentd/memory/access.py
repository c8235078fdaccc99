"""Access counts of recalled fragments: what a recall returned gets `accessed_at` set and
`access_count` raised."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def access_updates(agent_id: str, counts: dict[str, int], now: datetime, shared: bool,
                   skip_locked: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """The statements (`$name` SQL, parameters) that count fragments as accessed at `now`:
    `counts` maps a fragment id to the number of recalls that returned it.

    On a shared database the rows are locked in id order, as remember's supersede takes them:
    a plain UPDATE locks in scan order, and two writers locking the same rows in different
    orders deadlock; one statement, since Pony runs a lone
    SELECT ... FOR UPDATE outside the transaction, which would lock nothing. `skip_locked`
    leaves out rows another transaction holds, for a write that must never wait on them."""
    ids_by_count: dict[int, list[str]] = {}
    for fid, n in counts.items():
        ids_by_count.setdefault(n, []).append(fid)
    out = []
    for n, ids in sorted(ids_by_count.items()):
        params: dict[str, Any] = {"now": now, "a": agent_id, "n": n}
        params.update({f"i{k}": fid for k, fid in enumerate(ids)})
        where = "agent_id = $a AND id IN ({})".format(", ".join(f"$i{k}" for k in range(len(ids))))
        if shared:
            where = (f"agent_id = $a AND id IN (SELECT id FROM memory_fragments WHERE {where} ORDER BY id "
                     f"FOR UPDATE{' SKIP LOCKED' if skip_locked else ''})")
        out.append((f"UPDATE memory_fragments SET accessed_at = $now, access_count = access_count + $n "
                     f"WHERE {where}", params))
    return out
