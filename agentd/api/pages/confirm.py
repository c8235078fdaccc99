"""The confirmation step before a destructive dashboard action (killing an agent; deleting a
cron job, trigger, task, key, memory, skill; removing a channel or a provider key; ...).

The action's URL answers GET with a page of its own that says what is lost and posts the
same fields with `confirm=yes`, so it works without JavaScript; a POST without it is sent
(303) to that page, so no single click destroys anything. The confirmed POST is CSRF-checked
like every dashboard POST and redirects to a page that shows what was done.
"""

from __future__ import annotations

from urllib.parse import urlencode

from flask import Response, redirect, render_template, request, url_for

# Fields of the posted form that are not the action's own.
NOT_CARRIED = ("csrf_token", "confirm")


def ask_first(question: str, consequence: str, button: str, cancel: str) -> Response | None:
    """None for the confirmed POST (go ahead); else the confirmation page (GET) or a 303 to
    it carrying the form's fields. `cancel`: the URL the Cancel link goes back to."""
    here = url_for(request.endpoint, **(request.view_args or {}))
    if request.method == "POST":
        if request.form.get("confirm") == "yes":
            return None
        fields = [(k, v) for k, v in request.form.items(multi=True) if k not in NOT_CARRIED]
        return redirect(here + ("?" + urlencode(fields) if fields else ""), code=303)
    fields = [(k, v) for k, v in request.args.items(multi=True) if k not in NOT_CARRIED]
    return render_template("confirm.html", question=question, consequence=consequence, button=button,
                           action=here, fields=fields, cancel=cancel)
