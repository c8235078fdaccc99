"""Workflow persistence (agentd/workflows/store.py) in process, value by value: definitions,
run records through their life (pending, running, progress, finished), owners, recovery at
start, retention. The daemon-level behaviour is tests/workflows/test_workflows.py; this file pins the
exact shapes and edge cases that the HTTP tests only see indirectly. Follows --db=postgres."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from pony import orm

from support import store_url_for

from agentd.errors import Conflict, NotFound
from agentd.store import open_store
from agentd.workflows.definition import WorkflowDef
from agentd.workflows.store import RUN_RETENTION, WorkflowStore

STEPS = [{"name": "s1", "prompt": "{{input}}"}, {"name": "s2", "prompt": "again"}]


@pytest.fixture
def db(tmp_path: Path):
    store = open_store(tmp_path / "wf.db", store_url_for(tmp_path))
    yield WorkflowStore(store)
    store.close()


def when(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    assert parsed.utcoffset() is not None and parsed.utcoffset().total_seconds() == 0, value
    return parsed


def test_definitions_round_trip_exactly(db: WorkflowStore) -> None:
    wid = db.create(WorkflowDef("flow", "does things", STEPS))
    assert str(uuid.UUID(wid)) == wid
    got = db.get(wid)
    assert sorted(got) == ["created_at", "description", "id", "name", "steps", "updated_at"]
    assert (got["id"], got["name"], got["description"], got["steps"]) == (wid, "flow", "does things", STEPS)
    assert got["created_at"] == got["updated_at"]
    when(got["created_at"])
    got["steps"][0]["name"] = "changed"  # a copy: the stored definition is untouched
    assert db.get(wid)["steps"] == STEPS
    second = db.create(WorkflowDef("other", "", [{"name": "only"}]))
    assert db.list() == [
        {"id": wid, "name": "flow", "description": "does things", "steps": 2, "created_at": got["created_at"]},
        {"id": second, "name": "other", "description": "", "steps": 1, "created_at": db.get(second)["created_at"]}]
    assert db.update(wid, WorkflowDef("flow2", "new", [{"name": "x"}])) is True
    updated = db.get(wid)
    assert (updated["name"], updated["description"], updated["steps"]) == ("flow2", "new", [{"name": "x"}])
    assert updated["created_at"] == got["created_at"] and when(updated["updated_at"]) >= when(got["created_at"])
    assert db.update(str(uuid.uuid4()), WorkflowDef("x", "", [])) is False
    assert db.get(str(uuid.uuid4())) is None


def test_delete_removes_the_workflow_and_only_its_runs(db: WorkflowStore) -> None:
    keep = db.get(db.create(WorkflowDef("keep", "", STEPS)))
    gone = db.get(db.create(WorkflowDef("gone", "", STEPS)))
    kept_run = db.create_run(keep, "k")
    done = db.create_run(gone, "g1")
    going = db.create_run(gone, "g2")
    assert db.finish_run(done, "completed", "out", None, [], 1) is True
    assert db.run_count() == 3
    with pytest.raises(Conflict, match=r"^workflow has 1 run\(s\) in progress; delete it when they end$"):
        db.delete(gone["id"])
    assert db.finish_run(going, "failed", "", "stopped", [], 0) is True
    assert db.delete(gone["id"]) is True
    assert db.get(gone["id"]) is None and db.runs(gone["id"]) == []
    assert [r["id"] for r in db.runs(keep["id"])] == [kept_run] and db.run_count() == 1
    assert db.delete(gone["id"]) is False
    with pytest.raises(NotFound, match="^workflow not found$"):
        db.create_run(gone, "g3")


def test_run_record_through_its_life(db: WorkflowStore) -> None:
    workflow = db.get(db.create(WorkflowDef("life", "", STEPS)))
    run_id = db.create_run(workflow, "héllo", "daemon-x")
    assert str(uuid.UUID(run_id)) == run_id
    fresh = db.run(run_id)
    created_at = fresh.pop("created_at")
    when(created_at)
    assert fresh == {"id": run_id, "workflow_id": workflow["id"], "workflow_name": "life",
                     "state": {"status": "pending"}, "steps_completed": 0, "started_at": None,
                     "completed_at": None, "error": None, "input": "héllo", "output": None,
                     "daemon_id": "daemon-x", "step_results": []}
    assert db.active_run_count(workflow["id"]) == 1
    assert db.start_run(run_id) is True
    started = db.run(run_id)
    assert started["state"] == {"status": "running"} and when(started["started_at"]) >= when(created_at)
    results = [{"step_name": "s1", "output": "ünïcode ✓"}]
    assert db.save_progress(run_id, results, 1) is True
    progressed = db.run(run_id)
    assert (progressed["step_results"], progressed["steps_completed"]) == (results, 1)
    assert progressed["state"] == {"status": "running"} and progressed["started_at"] == started["started_at"]
    final = results + [{"step_name": "s2", "output": "done"}]
    assert db.finish_run(run_id, "completed", "the end", None, final, 2) is True
    done = db.run(run_id)
    assert (done["state"], done["output"], done["error"], done["step_results"], done["steps_completed"]) == \
        ({"status": "completed"}, "the end", None, final, 2)
    assert done["started_at"] == started["started_at"] and when(done["completed_at"]) >= when(done["started_at"])
    assert db.active_run_count(workflow["id"]) == 0
    # A finished run takes no more writes.
    assert db.finish_run(run_id, "failed", "", "late", [], 0) is False
    assert db.save_progress(run_id, [], 0) is False
    assert db.start_run(run_id) is False
    assert db.run(run_id) == done
    # Unknown runs: nothing to write, no error.
    missing = str(uuid.uuid4())
    assert db.start_run(missing) is False
    assert db.save_progress(missing, [], 0) is False
    assert db.finish_run(missing, "completed", "", None, [], 0) is False
    assert db.run(missing) is None


def test_step_results_are_stored_as_utf8_json(db: WorkflowStore) -> None:
    workflow = db.get(db.create(WorkflowDef("utf", "", STEPS)))
    run_id = db.create_run(workflow, "x")
    db.start_run(run_id)
    db.save_progress(run_id, [{"output": "é✓"}], 1)
    with orm.db_session:
        raw = db.store.e.WorkflowRunRow[run_id].step_results
    assert raw == json.dumps([{"output": "é✓"}], ensure_ascii=False)


def test_finishing_a_run_that_never_started(db: WorkflowStore) -> None:
    workflow = db.get(db.create(WorkflowDef("early", "", STEPS)))
    run_id = db.create_run(workflow, "x")
    assert db.finish_run(run_id, "failed", "", "refused", [], 0) is True
    run = db.run(run_id)
    assert run["state"] == {"status": "failed"} and run["error"] == "refused" and run["output"] == ""
    assert run["started_at"] == run["completed_at"] is not None


def test_fail_interrupted_by_owner(db: WorkflowStore) -> None:
    workflow = db.get(db.create(WorkflowDef("crash", "", STEPS)))
    mine = db.create_run(workflow, "m", "me")
    db.start_run(mine)
    db.save_progress(mine, [{"step_name": "s1"}], 1)
    pending_mine = db.create_run(workflow, "p", "me")
    other = db.create_run(workflow, "o", "other")
    db.start_run(other)
    ownerless = db.create_run(workflow, "n")
    db.start_run(ownerless)
    finished = db.create_run(workflow, "f", "me")
    db.finish_run(finished, "completed", "ok", None, [], 2)
    assert db.fail_interrupted("went away", ("me",)) == 3
    for run_id in (mine, pending_mine, ownerless):
        run = db.run(run_id)
        assert (run["state"], run["error"], run["output"]) == ({"status": "failed"}, "went away", "")
        assert run["completed_at"] is not None and run["started_at"] is not None
    assert db.run(mine)["step_results"] == [{"step_name": "s1"}] and db.run(mine)["steps_completed"] == 1
    assert db.run(pending_mine)["started_at"] == db.run(pending_mine)["completed_at"]
    assert db.start_run(pending_mine) is False  # failed while pending: it never runs
    assert db.run(pending_mine)["state"] == {"status": "failed"}
    assert db.run(mine)["started_at"] != db.run(mine)["completed_at"]
    assert db.run(other)["state"] == {"status": "running"}
    assert db.run(finished)["state"] == {"status": "completed"} and db.run(finished)["output"] == "ok"
    assert db.fail_interrupted("again", ("me",)) == 0
    assert db.fail_interrupted("all") == 1 and db.run(other)["error"] == "all"


def test_run_lists_newest_first(db: WorkflowStore) -> None:
    first = db.get(db.create(WorkflowDef("one", "", STEPS)))
    second = db.get(db.create(WorkflowDef("two", "", STEPS)))
    ids = [db.create_run(first, "a"), db.create_run(second, "b"), db.create_run(first, "c")]
    assert [r["id"] for r in db.runs(first["id"])] == [ids[2], ids[0]]
    assert [r["id"] for r in db.recent_runs(10)] == ids[::-1]
    assert [r["id"] for r in db.recent_runs(2)] == [ids[2], ids[1]]
    item = db.runs(second["id"])[0]
    assert item == {"id": ids[1], "workflow_id": second["id"], "workflow_name": "two",
                    "state": {"status": "pending"}, "steps_completed": 0, "started_at": None,
                    "completed_at": None, "error": None}
    assert db.run_count() == 3


def test_retention_evicts_exactly_the_oldest_finished(db: WorkflowStore, tmp_path: Path) -> None:
    assert RUN_RETENTION == 200 and db.retention == 200
    small = WorkflowStore(db.store, retention=3)
    workflow = small.get(small.create(WorkflowDef("keep3", "", STEPS)))
    running = small.create_run(workflow, "r")
    small.start_run(running)
    done = []
    for text in ("d1", "d2"):
        done.append(small.create_run(workflow, text))
        small.finish_run(done[-1], "failed" if text == "d1" else "completed", "", None, [], 0)
    assert small.run_count() == 3  # at the limit: nothing evicted
    newest = small.create_run(workflow, "new")
    assert {r["id"] for r in small.runs(workflow["id"])} == {running, done[1], newest}
    pending = small.create_run(workflow, "p")  # only d2 is finished: it goes, the active ones stay
    assert {r["id"] for r in small.runs(workflow["id"])} == {running, newest, pending}
    small.create_run(workflow, "over")  # nothing finished left: the limit is exceeded, not enforced
    assert small.run_count() == 4


def test_final_step_results_are_stored_as_utf8_json_too(db: WorkflowStore) -> None:
    workflow = db.get(db.create(WorkflowDef("utf2", "", STEPS)))
    run_id = db.create_run(workflow, "x")
    db.start_run(run_id)
    assert db.finish_run(run_id, "completed", "ok", None, [{"output": "é✓"}], 1) is True
    with orm.db_session:
        raw = db.store.e.WorkflowRunRow[run_id].step_results
    assert raw == json.dumps([{"output": "é✓"}], ensure_ascii=False), "BUG: final step results stored \\u-escaped"


def test_a_run_record_without_step_results_reads_as_none_yet(db: WorkflowStore) -> None:
    workflow = db.get(db.create(WorkflowDef("old", "", STEPS)))
    run_id = db.create_run(workflow, "x")
    with orm.db_session:
        db.store.e.WorkflowRunRow[run_id].step_results = ""   # an empty column (e.g. written by hand)
    assert db.run(run_id)["step_results"] == []


def test_list_is_ordered_by_creation_time_not_storage_order(db: WorkflowStore) -> None:
    later = db.create(WorkflowDef("later", "", STEPS))
    earlier = db.create(WorkflowDef("earlier", "", STEPS))
    # The second one was created first (e.g. the clock was stepped back). Not optimistic:
    # Pony's check misfires on timezone-aware datetimes read back naive (see store.py).
    with orm.db_session(optimistic=False):
        row = db.store.e.WorkflowRow[earlier]
        row.created_at = row.created_at.replace(year=row.created_at.year - 1)
    assert [w["name"] for w in db.list()] == ["earlier", "later"], "BUG: workflows are not listed oldest first"
