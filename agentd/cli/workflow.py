"""`agentd workflow create|list|run|runs|delete`: workflows from files, through the API."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import argh

from agentd.cli import _client, _config, _fail, _get, _table
from agentd.cli.client import ApiClient

if TYPE_CHECKING:
    import requests


def _workflow_file(path: str) -> Any:
    """A workflow definition from a .toml or .json file (by extension; JSON otherwise tried first)."""
    import tomllib

    from agentd import tomlsafe

    try:
        text = open(path, encoding="utf-8").read()
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror}")
    try:
        if path.endswith(".toml"):
            return tomlsafe.loads(text)
        if path.endswith(".json"):
            return json.loads(text)
        try:
            return json.loads(text)
        except ValueError:
            return tomlsafe.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        _fail(f"{path} is not valid TOML or JSON: {exc}")


def _error_text(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", response.text))
    except ValueError:
        return response.text.strip()


def _workflow_id(client: ApiClient, ref: str) -> str:
    """Accept a workflow id or an exact (unique) workflow name."""
    import uuid

    try:
        return str(uuid.UUID(ref))
    except ValueError:
        pass
    matches = [w["id"] for w in _get(client, "/api/workflows") if w["name"] == ref]
    if not matches:
        _fail(f"no workflow named {ref!r}")
    if len(matches) > 1:
        _fail(f"{len(matches)} workflows are named {ref!r}; use an id")
    return matches[0]


def _print_step_results(results: list[dict[str, Any]]) -> None:
    def clip(text: str, width: int = 60) -> str:
        text = " ".join((text or "").split())
        return text if len(text) <= width else text[:width - 1] + "…"

    rows = []
    for r in results:
        name = r["step_name"] + (f" #{r['iteration']}" if r.get("iteration") else "")
        detail = r.get("error") or r.get("note") or r["output"]
        rows.append([name, r["agent_name"] or "-", r.get("status", ""), r["input_tokens"],
                     r["output_tokens"], r["duration_ms"], clip(detail)])
    print(_table(["STEP", "AGENT", "STATUS", "IN", "OUT", "MS", "OUTPUT / ERROR"], rows))


@argh.named("create")
@argh.arg("path", help="workflow definition: a .toml or .json file with name, description, [[steps]]")
def workflow_create(path: str) -> None:
    """Create a workflow from a TOML or JSON file; prints its id."""
    body = _workflow_file(path)
    client = _client(_config())
    response = client.request("POST", "/api/workflows", json=body)
    if response.status_code != 201:
        _fail(f"cannot create workflow: {_error_text(response)}")
    print(f"created workflow {response.json()['workflow_id']}")


@argh.named("list")
@argh.arg("--json", dest="as_json", help="print the raw JSON")
def workflow_list(as_json: bool = False) -> None:
    """List workflows."""
    workflows = _get(_client(_config()), "/api/workflows")
    if as_json:
        print(json.dumps(workflows, indent=2))
        return
    print(_table(["NAME", "ID", "STEPS", "CREATED", "DESCRIPTION"],
                 [[w["name"], w["id"], w["steps"], w["created_at"], w["description"]] for w in workflows]))


@argh.named("run")
@argh.arg("workflow", help="workflow id or name")
@argh.arg("--input", dest="input_text", help="the run input ({{input}} of the first step)")
@argh.arg("--json", dest="as_json", help="print the raw run record as JSON")
def workflow_run(workflow: str, input_text: str = "", as_json: bool = False) -> None:
    """Run a workflow to the end and print every step result."""
    client = _client(_config())
    workflow_id = _workflow_id(client, workflow)
    # A run may take as long as its steps' timeouts allow: no read timeout.
    response = client.request("POST", f"/api/workflows/{workflow_id}/run", json={"input": input_text},
                              timeout=(10, None))
    if not response.ok:
        _fail(f"cannot run workflow: {_error_text(response)}")
    body = response.json()
    record = _get(client, f"/api/workflows/runs/{body['run_id']}")
    if as_json:
        print(json.dumps({**body, "step_results": record["step_results"]}, indent=2))
    else:
        _print_step_results(record["step_results"])
        print()
        print(f"run {body['run_id']}: {body['status']}")
        if body.get("error"):
            print(f"error: {body['error']}")
        else:
            print(body["output"])
    if body["status"] != "completed":
        raise SystemExit(1)


@argh.named("runs")
@argh.arg("workflow", help="workflow id or name")
@argh.arg("--run", dest="run_id", help="show one run with its step results")
@argh.arg("--json", dest="as_json", help="print the raw JSON")
def workflow_runs(workflow: str, run_id: str = "", as_json: bool = False) -> None:
    """List a workflow's runs, or show one run's step results with --run."""
    client = _client(_config())
    if run_id:
        record = _get(client, f"/api/workflows/runs/{run_id}")
        if as_json:
            print(json.dumps(record, indent=2))
            return
        _print_step_results(record["step_results"])
        print(f"\nrun {record['id']}: {record['state']['status']}")
        print(record.get("error") or record.get("output") or "")
        return
    runs = _get(client, f"/api/workflows/{_workflow_id(client, workflow)}/runs")
    if as_json:
        print(json.dumps(runs, indent=2))
        return
    print(_table(["RUN", "STATUS", "STEPS", "STARTED", "COMPLETED", "ERROR"],
                 [[r["id"], r["state"]["status"], r["steps_completed"], r["started_at"] or "-",
                   r["completed_at"] or "-", r.get("error") or ""] for r in runs]))


@argh.named("delete")
@argh.arg("workflow", help="workflow id or name")
def workflow_delete(workflow: str) -> None:
    """Delete a workflow and its run records."""
    client = _client(_config())
    response = client.request("DELETE", f"/api/workflows/{_workflow_id(client, workflow)}")
    if not response.ok:
        _fail(f"cannot delete workflow: {_error_text(response)}")
    print("removed")


COMMANDS = [workflow_create, workflow_list, workflow_run, workflow_runs, workflow_delete]
