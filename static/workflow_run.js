/* agentd dashboard: a workflow run's page follows the run's step events (SSE) in place.
   Loaded by that page only; without it the page shows the state it was rendered with. */
(function () {
  "use strict";
  function setupRun(box) {
    if (!window.EventSource) return;
    var status = document.getElementById("run-status"), progress = document.getElementById("run-progress");
    var total = box.querySelectorAll("#run-steps li").length, done = 0;
    function step(i) { return box.querySelector('#run-steps li[data-step="' + i + '"]'); }
    function setState(li, state) {
      var pill = li.querySelector("[data-role=state]");
      pill.textContent = state; pill.className = "pill " + state;
    }
    progress.textContent = "following the run…";
    var source = new EventSource(box.dataset.eventsUrl);
    source.addEventListener("step_started", function (e) {
      var d = JSON.parse(e.data), li = step(d.step_index);
      if (li) setState(li, "running");
      progress.textContent = "running " + d.step_name + "…";
    });
    source.addEventListener("step_result", function (e) {
      var d = JSON.parse(e.data), li = step(d.step_index);
      if (!li) return;
      setState(li, d.status);
      var out = li.querySelector("[data-role=output]");
      out.textContent = (out.textContent ? out.textContent + "\n" : "") + (d.output || d.error || "");
      if (d.status !== "failed") done += 1;
      progress.textContent = Math.min(done, total) + " of " + total + " step(s) done";
    });
    source.addEventListener("done", function (e) {
      var d = JSON.parse(e.data);
      source.close();
      status.textContent = d.status; status.className = "pill " + d.status;
      progress.textContent = d.steps_completed + " of " + total + " step(s) done · " + d.status;
      document.getElementById("run-output").textContent = d.output || "";
      var err = document.getElementById("run-error");
      err.textContent = d.error || ""; err.hidden = !d.error;
      box.querySelectorAll("#run-steps [data-role=state]").forEach(function (p) {
        if (p.textContent === "waiting") { p.textContent = "not run"; p.className = "pill not-run"; }
      });
      var cancel = document.getElementById("cancel-form");
      if (cancel) cancel.hidden = true;
    });
    source.onerror = function () { if (source.readyState === EventSource.CLOSED) progress.textContent = "connection lost; refresh"; };
  }

  var run = document.getElementById("run-live");
  if (run && run.dataset.eventsUrl) setupRun(run);
})();
