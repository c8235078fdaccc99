/* agentd dashboard: streams chat replies over SSE and decides approvals in place.
   No framework, no build step. Every URL comes from data attributes rendered with
   url_for, so the dashboard works under a proxy prefix. Text goes in with
   textContent only (never innerHTML), so nothing a model says can run here. */
(function () {
  "use strict";
  var body = document.body, csrf = body.dataset.csrf || "";

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }
  function headers(json) {
    var h = {"X-CSRF-Token": csrf};
    if (json) h["Content-Type"] = "application/json";
    return h;
  }
  function idUrl(tpl, id) { return tpl.replace("__id__", encodeURIComponent(id)); }
  function errorText(res) {
    return res.json().then(function (j) { return j.error && (j.error.message || j.error) || res.statusText; },
                           function () { return "HTTP " + res.status; });
  }

  /* -- approvals for one agent, rendered into #live-approvals ---------------------- */
  function loadApprovals(agentId, box, tries) {
    fetch(body.dataset.approvalsUrl, {credentials: "same-origin", headers: headers(false)})
      .then(function (r) { return r.ok ? r.json() : []; })
      .then(function (list) {
        var mine = list.filter(function (a) { return a.agent_id === agentId; });
        if (!mine.length && tries > 0) { setTimeout(function () { loadApprovals(agentId, box, tries - 1); }, 400); return; }
        mine.forEach(function (a) {
          var old = box.querySelector('[data-id="' + a.id + '"]');
          if (old && old.querySelector("button[data-decision]")) return;
          var card = approvalCard(a);
          if (old) box.replaceChild(card, old); else box.appendChild(card);
        });
      });
  }
  function approvalCard(a) {
    var card = el("div", "approval card");
    card.dataset.id = a.id;
    var p = el("p"); p.appendChild(el("strong", null, a.tool)); p.appendChild(document.createTextNode(" is waiting for approval"));
    card.appendChild(p);
    card.appendChild(el("pre", null, JSON.stringify(a.input, null, 1)));
    /* The page leaves the decision URLs out for a key without the scope to decide. */
    if (!body.dataset.approveUrl) return card;
    [["Approve", "ok", body.dataset.approveUrl], ["Reject", "bad", body.dataset.rejectUrl]].forEach(function (b) {
      var btn = el("button", b[1], b[0]);
      btn.type = "button";
      btn.dataset.decision = b[0].toLowerCase();
      btn.addEventListener("click", function () {
        btn.disabled = true;
        fetch(idUrl(b[2], a.id), {method: "POST", credentials: "same-origin", headers: headers(false)})
          .then(function (r) {
            if (r.ok) { card.textContent = a.tool + ": " + b[0].toLowerCase() + "d"; card.className = "notice"; }
            else errorText(r).then(function (t) { card.appendChild(el("p", "error", t)); btn.disabled = false; });
          });
      });
      card.appendChild(btn);
      card.appendChild(document.createTextNode(" "));
    });
    return card;
  }

  /* -- chat: the form posts to the SSE endpoint and the reply streams in ----------- */
  function parseEvent(block) {
    var ev = {event: "message", data: ""}, lines = block.split(/\r?\n/), data = [];
    lines.forEach(function (l) {
      if (l.indexOf("event:") === 0) ev.event = l.slice(6).trim();
      else if (l.indexOf("data:") === 0) data.push(l.slice(5).replace(/^ /, ""));
    });
    if (!data.length) return null;
    try { ev.data = JSON.parse(data.join("\n")); } catch (e) { ev.data = {}; }
    return ev;
  }

  function setupChat(form) {
    var list = document.getElementById("messages"), status = document.getElementById("chat-status");
    var input = form.querySelector("textarea"), send = form.querySelector("button[type=submit]");
    var approvals = document.getElementById("live-approvals"), agentId = form.dataset.agentId;
    if (!window.fetch || !window.ReadableStream || !window.TextDecoder) return;

    var picker = form.querySelector("input[type=file]");
    /* A chosen file is uploaded first (POST .../upload), then the message names it. */
    function upload() {
      var file = picker && picker.files && picker.files[0];
      if (!file) return Promise.resolve(null);
      var data = new FormData();
      data.append("file", file, file.name);
      return fetch(form.dataset.uploadUrl, {method: "POST", credentials: "same-origin", headers: headers(false), body: data})
        .then(function (r) {
          if (!r.ok) return errorText(r).then(function (t) { throw new Error(file.name + ": " + t); });
          return r.json();
        });
    }
    form.addEventListener("submit", function (e) {
      var text = input.value;
      if (!text.trim()) return;
      e.preventDefault();
      var user = el("li", "msg user"); user.appendChild(el("span", "who", "User")); user.appendChild(el("div", "text", text));
      var bot = el("li", "msg assistant"); bot.appendChild(el("span", "who", "Assistant"));
      var out = el("div", "text"); bot.appendChild(out);
      list.appendChild(user); list.appendChild(bot);
      var tools = {};
      send.disabled = true; status.textContent = "sending…";
      input.value = "";
      function finish(msg, bad) {
        send.disabled = false; status.textContent = msg; status.className = bad ? "status error" : "status";
        bot.scrollIntoView({block: "nearest"});
      }
      function handle(ev) {
        var d = ev.data;
        if (ev.event === "chunk") { out.textContent += d.content || ""; }
        else if (ev.event === "tool_use") {
          var t = el("details", "tool"), s = el("summary", null, "tool ");
          s.appendChild(el("code", null, d.tool)); t.appendChild(s); bot.insertBefore(t, out); tools[d.id] = t;
          status.textContent = "calling " + d.tool + "…";
        } else if (ev.event === "tool_result") {
          var box = tools[d.id];
          if (!box) { box = el("details", "tool"); box.appendChild(el("summary", null, "tool " + d.tool)); bot.insertBefore(box, out); }
          box.appendChild(el("pre", null, JSON.stringify(d.input, null, 1)));
          box.appendChild(el("pre", d.is_error ? "error" : null, String(d.result)));
        } else if (ev.event === "phase") {
          status.textContent = d.phase.replace(/_/g, " ") + (d.detail ? ": " + d.detail : "");
          if (d.phase === "awaiting_approval" && approvals) loadApprovals(agentId, approvals, 5);
        } else if (ev.event === "done") {
          finish(d.stopped ? "stopped" : "done · " + d.usage.input_tokens + " in / " + d.usage.output_tokens + " out tokens");
          if (approvals) approvals.textContent = "";
          return true;
        } else if (ev.event === "error") {
          bot.appendChild(el("p", "error", d.error)); finish("error", true); return true;
        }
        return false;
      }
      upload()
        .then(function (saved) {
          var message = {message: text};
          if (saved) {
            message.attachments = [{file_id: saved.file_id}];
            var link = el("a", "attached", "attached: " + saved.filename);
            link.href = idUrl(form.dataset.fileUrl, saved.file_id);
            user.appendChild(link);
            picker.value = "";
          }
          return fetch(form.dataset.streamUrl, {method: "POST", credentials: "same-origin", headers: headers(true),
                                                body: JSON.stringify(message)});
        })
        .then(function (res) {
          if (!res.ok) return errorText(res).then(function (t) { bot.appendChild(el("p", "error", t)); finish("error", true); });
          var reader = res.body.getReader(), dec = new TextDecoder(), buf = "", ended = false;
          function pump() {
            return reader.read().then(function (r) {
              if (r.done) { if (!ended) finish("connection closed"); return; }
              buf += dec.decode(r.value, {stream: true});
              var parts = buf.split(/\r?\n\r?\n/);
              buf = parts.pop();
              parts.forEach(function (p) { var ev = parseEvent(p); if (ev && !ended) ended = handle(ev); });
              return pump();
            });
          }
          return pump();
        })
        .catch(function (err) { bot.appendChild(el("p", "error", err.message)); finish("failed: " + err.message, true); });
    });
  }

  var chat = document.getElementById("chat");
  if (chat) setupChat(chat);
})();
