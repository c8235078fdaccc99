"""Uploaded files (agentd/agents/uploads.py), in process: limits at and past the cap,
content-type near misses, safe names, what is stored, reading back for a run, and the
agent's file listing and one file's content."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path

import pytest
from pony import orm

from agentd.agents.handle import UPLOAD_LIMIT
from agentd.errors import BadRequest, NotFound, PayloadTooLarge
from agentd.timestamps import utcnow
from mgrsupport import Env, manifest


@pytest.fixture()
def env(tmp_path: Path):
    e = Env(tmp_path)
    yield e
    e.close()


@pytest.fixture()
def mgr(env):
    return env.manager()


def test_an_upload_is_stored_and_read_back(env, mgr) -> None:
    h = mgr.spawn(manifest("up"))
    before = utcnow()
    got = mgr.save_upload(h, "notes.txt", "text/plain", b"hello")
    assert str(uuid.UUID(got["file_id"])) == got["file_id"]
    assert got == {"file_id": got["file_id"], "filename": "notes.txt", "content_type": "text/plain", "size": 5}
    with orm.db_session:
        row = env.store.e.UploadRow.get(id=got["file_id"])
        assert (row.agent.id, row.filename, row.content_type, row.size, bytes(row.content), row.path) == \
            (h.id, "notes.txt", "text/plain", 5, b"hello", "")
        assert row.created_at.replace(tzinfo=before.tzinfo) >= before.replace(microsecond=0)
    assert mgr.uploads.read(h, got["file_id"]) == {"id": got["file_id"], "filename": "notes.txt",
                                              "content_type": "text/plain", "data": b"hello"}
    assert mgr.uploads.read(h, got["file_id"].upper())["data"] == b"hello"


def test_size_limits(mgr) -> None:
    h = mgr.spawn(manifest("big"))
    with pytest.raises(BadRequest) as err:
        mgr.save_upload(h, "e.txt", "text/plain", b"")
    assert err.value.message == "uploaded file is empty"
    assert mgr.save_upload(h, "one.txt", "text/plain", b"x")["size"] == 1
    assert mgr.save_upload(h, "max.bin", "audio/wav", b"\0" * UPLOAD_LIMIT)["size"] == 10 * 1024 * 1024
    with pytest.raises(PayloadTooLarge) as err:
        mgr.save_upload(h, "over.bin", "audio/wav", b"\0" * (UPLOAD_LIMIT + 1))
    assert err.value.message == "file too large (max 10 MB)" and err.value.status == 413


@pytest.mark.parametrize("ctype", ["image/png", "image/", "text/plain", "text/csv; charset=utf-8", "audio/mpeg",
                                   "application/pdf"])
def test_allowed_content_types(mgr, ctype) -> None:
    h = mgr.spawn(manifest("ok"))
    assert mgr.save_upload(h, "f", ctype, b"x")["content_type"] == ctype


@pytest.mark.parametrize("ctype", ["image", "text", "Image/png", "video/mp4", "application/json", "application/pd",
                                   "", "xtext/plain", " text/plain"])
def test_refused_content_types(mgr, ctype) -> None:
    h = mgr.spawn(manifest("no"))
    with pytest.raises(BadRequest) as err:
        mgr.save_upload(h, "f", ctype, b"x")
    assert err.value.message == (f"unsupported content type {ctype!r}: allowed image/*, text/*, audio/*, "
                                 "application/pdf")


@pytest.mark.parametrize("name, stored", [
    ("../../etc/passwd", "passwd"), ("/abs/x.txt", "x.txt"), ("dir/", "upload"), ("", "upload"), (None, "upload"),
    ("a" * 250, "a" * 200), ("b" * 200, "b" * 200), ("plain name.txt", "plain name.txt"),
])
def test_safe_file_names(mgr, name, stored) -> None:
    h = mgr.spawn(manifest("names"))
    assert mgr.save_upload(h, name, "text/plain", b"x")["filename"] == stored


def test_attachments_of_another_agent_or_unknown_are_refused(env, mgr) -> None:
    a = mgr.spawn(manifest("a"))
    b = mgr.spawn(manifest("b"))
    theirs = mgr.save_upload(b, "t.txt", "text/plain", b"secret")["file_id"]
    for fid in (theirs, str(uuid.uuid4())):
        with pytest.raises(BadRequest) as err:
            mgr.uploads.read(a, fid)
        assert err.value.message == f"unknown attachment file_id {fid}: upload it to this agent first"
    for bad in ("", "nope", theirs[:-1]):
        with pytest.raises(BadRequest) as err:
            mgr.uploads.read(a, bad)
        assert err.value.message == f"invalid file id: {bad!r} is not a UUID"


def test_uploads_from_before_schema_2_are_read_from_their_file(env, mgr, tmp_path) -> None:
    h = mgr.spawn(manifest("legacy"))
    old = tmp_path / "old.bin"
    old.write_bytes(b"from a file")
    ids = [str(uuid.uuid4()), str(uuid.uuid4())]
    with orm.db_session:
        env.store.e.UploadRow(id=ids[0], agent=h.id, filename="old.bin", content_type="text/plain", size=11,
                              path=str(old), content=None, created_at=utcnow())
        env.store.e.UploadRow(id=ids[1], agent=h.id, filename="none", content_type="text/plain", size=0,
                              path="", content=None, created_at=utcnow())
    assert mgr.uploads.read(h, ids[0])["data"] == b"from a file"
    assert mgr.uploads.read(h, ids[1]) == {"id": ids[1], "filename": "none", "content_type": "text/plain", "data": b""}


def test_the_listing_is_the_agents_files_newest_first_without_content(env, mgr) -> None:
    h = mgr.spawn(manifest("lister"))
    other = mgr.spawn(manifest("other"))
    assert mgr.uploads.listing(h) == []
    mgr.save_upload(other, "theirs.txt", "text/plain", b"not yours")
    ids = [mgr.save_upload(h, f"f{i}.txt", "text/plain", b"x" * (i + 1))["file_id"] for i in range(3)]
    # Two files of the same moment are listed by id, the greater first.
    same = datetime(2026, 3, 4, 5, 6, 7)
    twins = sorted([str(uuid.UUID(int=1)), str(uuid.UUID(int=2))])
    with orm.db_session:
        for i, fid in enumerate(ids):
            env.store.e.UploadRow[fid].created_at = datetime(2026, 3, 4, 5, 6, i)
        for fid in twins:
            env.store.e.UploadRow(id=fid, agent=h.id, filename="twin.pdf", content_type="application/pdf", size=4,
                                  content=b"%PDF", created_at=same)
    assert mgr.uploads.listing(h) == [
        {"file_id": twins[1], "filename": "twin.pdf", "content_type": "application/pdf", "size": 4,
         "created_at": "2026-03-04T05:06:07+00:00"},
        {"file_id": twins[0], "filename": "twin.pdf", "content_type": "application/pdf", "size": 4,
         "created_at": "2026-03-04T05:06:07+00:00"},
        *({"file_id": ids[i], "filename": f"f{i}.txt", "content_type": "text/plain", "size": i + 1,
           "created_at": f"2026-03-04T05:06:0{i}+00:00"} for i in (2, 1, 0))]
    assert [f["filename"] for f in mgr.uploads.listing(other)] == ["theirs.txt"]


def test_a_files_content_is_its_agents_only(mgr) -> None:
    h = mgr.spawn(manifest("owner"))
    other = mgr.spawn(manifest("stranger"))
    fid = mgr.save_upload(h, "a.txt", "text/plain", b"bytes")["file_id"]
    assert mgr.uploads.content(h, fid) == {"id": fid, "filename": "a.txt", "content_type": "text/plain",
                                           "data": b"bytes"}
    for agent, asked in ((other, fid), (h, str(uuid.uuid4()))):
        with pytest.raises(NotFound) as err:
            mgr.uploads.content(agent, asked)
        assert err.value.message == f"agent {agent.name} has no file {asked}"
    with pytest.raises(BadRequest) as bad:
        mgr.uploads.content(h, "nope")
    assert (bad.value.message, bad.value.status) == ("invalid file id: 'nope' is not a UUID", 400)


def test_a_file_for_an_agent_that_is_gone_is_refused(mgr) -> None:
    with pytest.raises(NotFound) as err:
        mgr.uploads.save_for(str(uuid.uuid4()), "made.txt", "text/plain", b"x")
    assert err.value.message == "agent not found"
