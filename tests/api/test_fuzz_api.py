"""Schemathesis against the real daemon, driven by GET /api/openapi.json.

All checks, all four phases (examples, coverage, fuzzing and the stateful phase that follows
the document's OpenAPI links: spawn -> detail/message/memory/kill, PUT kv -> GET/DELETE kv,
remember -> GET/DELETE memory,
custom model -> GET/DELETE, workflow -> detail/run/runs/delete, run -> run detail), a bounded
number of examples and a fixed seed so CI is reproducible. tests/fuzz_hooks.py makes most
positive spawn and custom-model cases valid (a TOML manifest with a fresh name, a catalog
provider) so the stateful phase has resources to follow links from. The daemon has an API key (so
`ignored_auth` checks that protected routes refuse requests without it) and every provider
points at the fake LLM, so message routes run real agent loops.

Result required: no failure of any check. What is switched off, and why, is in CONFIG below:
each exclusion is a request that is valid by JSON Schema but refused for a reason a schema
cannot state (state on the server, relations between fields, file contents). Every failure
the fuzzer found while this was built has a regression test in tests/api/test_openapi.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, private_cache

API_KEY = "fuzz-key"
MAX_EXAMPLES = 5
SEED = 21

ACCEPTANCE_OFF = "checks.positive_data_acceptance.enabled = false"
# A channel whose test message can never be delivered (Guilded shut down; no traffic leaves
# this machine): what POST /api/channels/guilded/test answers is the documented 502.
GUILDED = '\n[channels.guilded]\nbot_token_env = "GUILDED_BOT_TOKEN"\n'


def operations(ids: str | list[str], why: str, *settings: str) -> str:
    """One `[[operations]]` table of the schemathesis config: `settings` for `ids`, `why` as its comment."""
    target = f'"{ids}"' if isinstance(ids, str) else "[" + ", ".join(f'"{i}"' for i in ids) + "]"
    comment = "\n".join("# " + line for line in textwrap.wrap(why, 94))
    return "\n[[operations]]\ninclude-operation-id = " + target + "\n" + comment + "\n" + "\n".join(settings) + "\n"


def acceptance_off(ids: str | list[str], why: str, *settings: str) -> str:
    """An `[[operations]]` table that turns "valid data should be accepted" off (and sets `settings`):
    the request is valid by JSON Schema but refused for a reason a schema cannot state."""
    return operations(ids, why, *settings, ACCEPTANCE_OFF)


CONFIG_HEAD = """
[generation]
# A string holding U+0000 is refused with a 400 on every backend (PostgreSQL's text and jsonb
# cannot store it), which "valid data should be accepted" would count against the API.
allow-x00 = false

[phases.stateful.generation]
# More scenarios for the stateful phase: each one spawns, links and cleans up through the API.
max-examples = 25

[phases.stateful.inference]
# The document's own links only (and Location headers). Dependency analysis guesses links by
# field names: it feeds the `name` of GET /a2a/agents to every `{agent_id}`, a UUID (`format:
# uuid`) whose route answers a name with the documented 400 naming the id to use.
algorithms = ["location-headers"]

[checks]
# Every check (the command line's `--checks all` would override the per-operation switches below).
enabled = true

[checks.negative_data_rejection]
# The spec answers 413 (not 400) for a message over 64 KB or a body over the size limit.
expected-statuses = ["400", "401", "403", "404", "405", "409", "413", "415", "422", "429"]
"""

CONFIG = CONFIG_HEAD + "".join([
    acceptance_off("agents.spawn",
        "manifest_toml must be a TOML manifest with a valid agent name, profile and model: TOML "
        "syntax and manifest semantics cannot be written in JSON Schema."),
    acceptance_off(["agents.update_manifest", "agents.set_model"],
        "A new manifest must be TOML that keeps the agent's name, and a model must name a provider "
        "the catalog knows: TOML syntax, the agent's current name and the catalog cannot be written "
        "in JSON Schema."),
    acceptance_off(["workflows.create", "workflows.update"],
        "Steps must name agents that exist now, templates may use only variables defined by "
        "earlier steps, collect needs a fan_out before it: server state and cross-step rules."),
    acceptance_off("catalog.add_custom",
        "`provider` must be a provider of the live catalog (a server-side list)."),
    operations(["catalog.set_key", "catalog.delete_key", "catalog.set_url", "catalog.test_provider"],
        "Pinned to a provider no agent of this run calls: rewriting the URL or removing the key "
        "of the provider the agents use would make every later run fail upstream, hiding real "
        "findings.",
        'parameters = { "path.name" = "groq" }'),
    operations("catalog.test_provider",
        "The provider test reports the upstream's failure as 502/503/504 (documented): nothing on "
        "this machine answers for groq. A 500 is still a failure.",
        'checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502", "503", "504"]'),
    acceptance_off(["catalog.set_key", "catalog.set_url", "catalog.test_provider"],
        "Local providers take no key; a URL needs a host as well as a scheme; a test needs a key "
        "and a provider that answers (there is none behind most catalog entries here)."),
    acceptance_off(["agents.message", "stream.message_stream"],
        "`attachments` must name files uploaded to this agent before (server state)."),
    acceptance_off("openai.chat_completions",
        "The last user message must carry text or an image, image parts must be base64 data URIs "
        "and the agent's model must support vision: rules across array items and server state."),
    acceptance_off("responses.create_response",
        "`input` must hold a user message with text or an image, image parts must be base64 data URIs "
        "and `previous_response_id` must name a stored response of the same agent: rules across "
        "array items and server state."),
    acceptance_off("embeddings.create_embeddings",
        "`dimensions` must equal the vector length of the model named, which depends on the model "
        "(a provider's is known once it answers)."),
    acceptance_off(["memory.import_memory", "memory.recall"],
        "An import must be a document in the export format (format name, version, well-formed "
        "items); a recall filter's `after`/`before` strings must be ISO 8601 times."),
    acceptance_off("agents.upload",
        "The file must be non-empty and of an allowed type (image/*, text/*, audio/*, "
        "application/pdf), which the multipart part's own Content-Type decides."),
    acceptance_off(["catalog.usage", "catalog.usage_by_model"],
        "`since` must be before `until`: a relation between two parameters."),
    acceptance_off(["sockets.agent_socket", "sockets.echo"],
        "WebSocket routes: a plain HTTP GET is not a handshake and gets 400; schemathesis does "
        "not speak WebSocket (tests/api/test_transports.py does). Server errors, auth and status "
        "codes are still checked."),
    acceptance_off("channels.test",
        "By design it reports what is outside agentd: 502 \"test message not delivered\" when the "
        "platform did not take the message (documented), and nothing else. Pinned to guilded, "
        "configured in this daemon and never deliverable (the service is gone), so the fuzzed "
        "bodies reach the sender; unconfigured channels answer 400 (server state).",
        'parameters = { "path.name" = "guilded" }',
        'checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502"]'),
    acceptance_off(["channels.qr_start", "channels.qr_status"],
        "By design these report what is outside agentd: 502 when the QR gateway fails, 503 when "
        "no gateway is configured (documented).",
        'checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502", "503"]'),
    acceptance_off("skills.install",
        "`path` must be a skill folder on the daemon's disk, `url` a zip on a host of "
        "fetch_allow_hosts: files and settings on the server."),
    acceptance_off("skills.delete",
        "The name must be a skill installed on this daemon (server state)."),
    acceptance_off(["cron.create", "cron.update"],
        "A job names an agent and a workflow that exist now, a cron expression that matches dates, "
        "a known time zone, an `at` time in the future, a configured channel and a webhook secret "
        "variable the daemon's environment holds: server state and rules JSON Schema cannot state."),
    acceptance_off("cron.run",
        "Run now answers 409 while the job's previous run is still going or the job is over its "
        "daily cap (documented): server state."),
    acceptance_off(["memory.add_relation", "memory.import_memory"],
        "A relation's ends must name entities that exist (in the agent's graph, or for an import "
        "in the document); ids must be unique within an import document: server state and "
        "cross-item rules."),
    operations(["tasks.claim", "tasks.complete"],
        "A 404 here may be about the agent the body names (documented: no agent with that id or "
        "name), not the task the link led to; the resource check reads every 404 as the task.",
        "checks.ensure_resource_availability.enabled = false"),
    operations(["a2a.rpc", "a2a.agent_rpc"],
        "A JSON-RPC endpoint: every request, even one that is not JSON-RPC, is answered with HTTP 200 "
        "and the refusal as a JSON-RPC error in the body (-32700, -32600, -32602), as the A2A JSON-RPC "
        "binding asks. tests/a2a/test_a2a.py checks those errors.",
        "checks.negative_data_rejection.enabled = false"),
    operations("keys.delete_key",
        "Keys are found by id or by name: another scenario's DELETE /api/keys/{name} (a short "
        "generated name such as '0') removes a key this scenario just created, and its 404 is right.",
        "checks.ensure_resource_availability.enabled = false"),
])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_schemathesis_finds_nothing(tmp_path: Path, fake_llm) -> None:
    st = shutil.which("st") or str(Path(sys.executable).with_name("st"))
    home = make_home(tmp_path / "fuzz", f'api_key = "{API_KEY}"\n' + llm_config(fake_llm, GUILDED))
    daemon = Daemon(home, api_key=API_KEY, env_extra=LLM_ENV).start()
    # /mcp loads the MCP SDK on its first request; on two busy cores that can take longer than
    # the fuzzer's 10 s request timeout, so it is loaded before the fuzzer starts.
    ping = daemon.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=60,
                       headers={"Authorization": f"Bearer {API_KEY}", "Accept": "application/json, text/event-stream"})
    assert ping.status_code == 200, ping.text
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "fuzz_hooks",  # tests/fuzz_hooks.py: valid spawns
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    # Hypothesis builds its table of the characters UTF-8 encodes (a pass over all of Unicode)
    # unless an earlier run left it in its storage folder: keep that folder between runs.
    storage = private_cache("hypothesis")
    if storage is not None:
        env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(storage)
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    try:
        for _attempt in range(2):
            run = subprocess.run(
                [st, "--config-file", str(config), "--no-color", "run", f"{daemon.url}/api/openapi.json",
                 "--phases", "examples,coverage,fuzzing,stateful",
                 "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "2",
                 "--generation-database", "none",
                 # Hypothesis's speed check measures the machine, not the API: on 2 busy cores
                 # it aborted the run ("data generation is too slow") with nothing wrong found.
                 "--suppress-health-check", "too_slow",
                 # Destructive: it stops the daemon under test, ending the run for every other operation.
                 "--exclude-path", "/api/shutdown",
                 # Configuring an adapter starts it at once, and it connects to whatever host the
                 # fuzzer wrote: traffic to addresses outside this machine. tests/test_channels*.py
                 # drive this route against local fakes.
                 "--exclude-operation-id", "channels.configure",
                 "-H", f"Authorization: Bearer {API_KEY}"],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840)
            # CPython 3.11's ast module can fail this way inside Hypothesis while it describes a
            # strategy: the fuzzer itself crashed, which says nothing about the API; run it once more.
            if "AST constructor recursion depth mismatch" not in run.stdout + run.stderr:
                break
    finally:
        daemon.stop()
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-12000:]
    summary = output[output.rfind("SUMMARY"):]
    assert "Tested:" in summary and "failure" not in summary.lower(), summary
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in summary, summary
    assert "Traceback" not in daemon.log() and "unhandled error" not in daemon.log()
