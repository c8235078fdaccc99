"""The server layer: the daemon's HTTP on waitress, beside the routes (agentd/api/) and
known to nothing below them (the kernel, agents, llm, memory, channels, workflows).

One module per job:

* `serve` -- the waitress server: bind, install what follows, turn the loop, drain.
* `startgate` -- the WSGI entry while the app is being built (the liveness probe at once).
* `dispatcher` -- the task dispatcher: most recently idle thread first, threads on demand,
  a few fresh requests at once.
* `channel` -- the HTTP channel whose running request writes its own answer.
* `task` -- the WSGI task: how an answer leaves (head with body, kept-alive chunked
  answers, the last bytes with the end, the client-gone check).
* `websocket`, `ws_socket` -- the WebSocket hijack and the socket handed to flask-sock.
* `early_refusal` -- cross-site and foreign-Host requests refused before their body.
* `webguard` -- the Host and Origin policies (the app's guard applies them too).
* `proxy`, `forwarded` -- forwarding headers from trusted proxies only.
* `slots` -- the cap on requests that hold a server thread (`[api] max_streams`).

The app owns the stream slots and the trusted proxies (agentd/api/__init__.py hands the
channel webhooks their real-client lookup); the model layer never writes to a client.

waitress internals relied on (tested with waitress 3.0.2, the version setup.cfg pins;
a new waitress needs tests/server/test_http_channel.py, tests/server/test_dispatcher.py, tests/server/test_websocket.py,
tests/api/test_one_write.py, tests/server/test_early_refusal.py and tests/server/test_startgate.py run again):

* `ThreadedTaskDispatcher`: `lock`, `queue`, `queue_cv`, `threads`, `active_count`,
  `stop_count`, `thread_exit_cv`, `logger`, `handler_thread` (replaced, its stop protocol
  kept), `start_new_thread`, `queue_logger`, and
  `create_server(_dispatcher=...)`; `threading.Condition`'s `_waiters` and `_is_owned`.
* `HTTPChannel`: `writable`, `readable`, `handle_read`, `_flush_some`, `write_soon`,
  `requests`, `will_close`, `close_when_flushed`, `total_outbufs_len`, `socket`,
  `connected`, and the class attributes `task_class`, `parser_class`, `error_task_class`.
* `WSGITask`: `get_environment`, `build_response_header`, `set_close_on_finish`, `write`,
  `finish`, `execute`, `wrote_header`, `close_on_finish`, `content_bytes_written`, and its
  `channel` attribute (swapped for a moment to gather writes); `ErrorTask`.
* `HTTPRequestParser.received` with `headers_finished`, `completed`, `error`,
  `expect_continue`, `command`, `url_scheme`; `waitress.utilities.Error`.
* The server: `channel_class`, `map` (several listen addresses), `_map`, `trigger`,
  `task_dispatcher`, `effective_port`; `wasyncore.loop` and `wasyncore.dispatcher.close`.

Importing this package imports nothing: the start gate loads before the port is bound.
"""
