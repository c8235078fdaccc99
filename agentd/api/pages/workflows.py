"""Workflows: definitions and runs, one workflow's steps and results, the run form."""

from __future__ import annotations

from flask import render_template, request

from agentd.agents.runs import check_message
from agentd.api.pages import bp, kernel, see_other
from agentd.errors import AgentdError

RUNS_SHOWN = 20


@bp.get("/workflows")
def workflows():
    engine = kernel().workflows
    return render_template("workflows.html", workflows=engine.list(), runs=engine.recent_runs(RUNS_SHOWN))


def _workflow_page(workflow_id: str, status: int = 200, error: str = "", draft: str = ""):
    engine = kernel().workflows
    workflow = engine.get(workflow_id)
    runs = engine.runs(workflow["id"])[:RUNS_SHOWN]
    # The newest run is shown in full (input, output, every step's result).
    latest = engine.run_detail(runs[0]["id"]) if runs else None
    return render_template("workflow.html", workflow=workflow, runs=runs, latest=latest, error=error,
                           draft=draft), status


@bp.get("/workflows/<workflow_id>")
def workflow_page(workflow_id: str):
    return _workflow_page(workflow_id)


@bp.post("/workflows/<workflow_id>/run")
def workflow_run(workflow_id: str):
    """Runs to the end like POST /api/workflows/{id}/run, then 303 back to the results."""
    text = request.form.get("input", "")
    try:
        check_message(text, "input")
        kernel().workflows.run(workflow_id, text)
    except AgentdError as exc:
        return _workflow_page(workflow_id, exc.status, exc.message, draft=text)
    return see_other("pages.workflow_page", workflow_id=workflow_id)
