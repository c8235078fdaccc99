/* agentd log page: appends the daemon's new log lines as they are written (SSE).
   Without JavaScript the page shows the lines kept when it was rendered. */
(function () {
  "use strict";
  var box = document.getElementById("log-lines");
  if (!box || !window.EventSource) return;
  var KEEP = 1000, status = document.getElementById("log-status");
  box.scrollTop = box.scrollHeight;
  var source = new EventSource(box.dataset.streamUrl + "?after=" + encodeURIComponent(box.dataset.after || "0"));
  source.addEventListener("open", function () { status.textContent = "Live: new lines appear below."; });
  source.addEventListener("error", function () { status.textContent = "Disconnected; reconnecting…"; });
  source.addEventListener("line", function (e) {
    var follow = box.scrollTop + box.clientHeight >= box.scrollHeight - 40;
    box.appendChild(document.createTextNode(e.data + "\n"));
    while (box.childNodes.length > KEEP) box.removeChild(box.firstChild);
    if (follow) box.scrollTop = box.scrollHeight;
  });
})();
