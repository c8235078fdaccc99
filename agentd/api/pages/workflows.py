"""Workflows: definitions and runs, the create and edit form, a run's live steps, cancel."""

from __future__ import annotations

from flask import render_template, request, url_for

from agentd.agents.run_request import check_message
from agentd.api.pages import bp, form_post, kernel, refused
from agentd.api.pages import workflow_form
from agentd.api.pages.notes import see_other_with
from agentd.api.principal import principal, reachable_workflows
from agentd.api.pages.schedules import page_of
from agentd.api.routes_workflows import payer
from agentd.api.pages.workflow_form import WorkflowForm
from agentd.errors import AgentdError
from agentd.workflows.definition import ERROR_MODES, MODES, StepError

RUNS_SHOWN = 20
WORKFLOWS_SHOWN = 50  # definitions a page of /workflows (the 60 KB page budget)


@bp.get("/workflows")
def workflows():
    engine = kernel().workflows
    paged = page_of(reachable_workflows(engine.list()), WORKFLOWS_SHOWN)
    return render_template("workflows.html", workflows=paged["items"], paged=paged,
                           runs=reachable_workflows(engine.recent_runs(RUNS_SHOWN), "workflow_id"))


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


@form_post("/workflows/<workflow_id>/run", "pages.workflow_page", keeps=("input",))
def workflow_run(workflow_id: str):
    """Starts a run like POST /api/workflows/{id}/runs, then 303 to the run's page (its steps
    stream in with JavaScript; without, a refresh shows how far it got)."""
    text = request.form.get("input", "")
    try:
        check_message(text, "input")
        started = kernel().workflows.start(workflow_id, text, payer(workflow_id))
    except AgentdError as exc:
        return refused(_workflow_page(workflow_id, exc.status, exc.message, draft=text), exc)
    return see_other_with("pages.workflow_run_page", ["run started"], run_id=started["run_id"])


# -- create and edit ------------------------------------------------------------------------------

def _form_page(form: WorkflowForm, workflow: dict | None = None, status: int = 200):
    agents = sorted(h.name for h in principal().visible(kernel().agents.handles()))
    return render_template("workflow_form.html", form=form, workflow=workflow, agents=agents, modes=MODES,
                           error_modes=ERROR_MODES), status


def _save(workflow_id: str | None):
    engine = kernel().workflows
    workflow = engine.get(workflow_id) if workflow_id else None
    form = workflow_form.read(request.form)
    try:
        body = workflow_form.body(form)
        if workflow is None:
            workflow_id = engine.create(body, principal().sees)
        else:
            engine.update(workflow["id"], body, principal().sees)
    except StepError as exc:
        form.error, form.error_field = exc.message, exc.field
        # Steps typed in fieldsets: the fieldset of the refused step; typed as text: none.
        form.error_row = exc.index if not form.definition.strip() and exc.index < len(form.steps) else None
        return _form_page(form, workflow, exc.status)
    except AgentdError as exc:
        form.error = exc.message
        return _form_page(form, workflow, exc.status)
    verb = "created" if workflow is None else "saved"
    return see_other_with("pages.workflow_page", [f"workflow {engine.get(workflow_id)['name']} {verb}"],
                          workflow_id=workflow_id)


@bp.get("/workflows/new")
def workflow_new():
    return _form_page(WorkflowForm())


@bp.post("/workflows/new")
def workflow_create():
    return _save(None)


@bp.get("/workflows/<workflow_id>/edit")
def workflow_edit(workflow_id: str):
    engine = kernel().workflows
    workflow = engine.get(workflow_id)

    def name_of(ref: dict[str, str]) -> str | None:
        handle = engine.resolve(ref)
        return handle.name if handle is not None else None

    return _form_page(workflow_form.from_definition(workflow, name_of), workflow)


@bp.post("/workflows/<workflow_id>/edit")
def workflow_update(workflow_id: str):
    return _save(workflow_id)


# -- one run: its steps as they go, cancel ----------------------------------------------------------

@bp.get("/workflows/runs/<run_id>")
def workflow_run_page(run_id: str):
    engine = kernel().workflows
    run, running = engine.progress(run_id)
    try:
        steps = engine.get(run["workflow_id"])["steps"]
    except AgentdError:
        steps = []  # the workflow was deleted meanwhile; its run record stays readable
    results: dict[int, list[dict]] = {}
    for result in run["step_results"]:
        results.setdefault(result.get("step_index", -1), []).append(result)
    active = run["state"]["status"] in ("pending", "running")
    return render_template("workflow_run.html", run=run, steps=steps, results=results, running=running,
                           active=active,
                           events_url=url_for("workflows.run_events", run_id=run["id"]) if active else "")


@form_post("/workflows/runs/<run_id>/cancel", "pages.workflow_run_page")
def workflow_cancel(run_id: str):
    engine = kernel().workflows
    run = engine.run_detail(run_id)
    try:
        final = engine.cancel(run["id"])
    except AgentdError as exc:
        return see_other_with("pages.workflow_run_page", [exc.message], ok=False, run_id=run["id"])
    if final["state"]["status"] in ("pending", "running"):
        note = "cancel requested: the step in progress stops at its agent's next cancellation point"
    else:
        note = "run cancelled"
    return see_other_with("pages.workflow_run_page", [note], run_id=run["id"])
