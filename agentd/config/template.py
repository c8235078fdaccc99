"""The commented `config.toml` that `agentd init` writes, and the home layout it creates.

The template is the only config file the daemon ever writes (reading is `tomllib`).
"""

from __future__ import annotations

from pathlib import Path


DEFAULT_CONFIG_TEXT = """\
# agentd configuration. Every key is optional; the values shown are the defaults.
# Secrets never go in this file: keys ending in _env name environment variables.

# Address the HTTP API listens on. AGENTD_LISTEN overrides it.
api_listen = "127.0.0.1:4200"

# Bearer key for the API. Empty: only loopback clients are served.
# AGENTD_API_KEY is used when this is empty.
api_key = ""

# debug, info, warning, error or critical
log_level = "info"
# "text" (one readable line per record) or "json" (one JSON object per line).
log_format = "text"

# Whether agents may use network tools by default.
network_enabled = false

[api]
# Requests per second per client IP (GCRA), and how many may come at once
# (default: one second's worth).
rate_limit_per_second = 30
rate_limit_burst = 30
# Extra browser origins allowed (CORS and state-changing requests) when api_key
# is set; besides the daemon's own, only the loopback dev ports 3000 and 8080
# are, and requests from any other web origin are refused.
cors_origins = []
# Host names served besides localhost/127.0.0.1/[::1] and the listen address
# (e.g. the name a reverse proxy forwards): exact, "*.example.com", or "*" (off).
allowed_hosts = []
# waitress worker threads. Every SSE stream and WebSocket holds one for its
# whole life, so keep this well above max_streams.
threads = 128
# Cap on concurrent SSE streams + WebSockets, so plain HTTP never starves.
max_streams = 96
# glibc malloc arenas the threads share (0: glibc's default, eight per core);
# fewer keep RSS steadier. MALLOC_ARENA_MAX in the environment wins.
malloc_arenas = 2
# Blocks of at least this many KiB are mapped and handed back on free (0: glibc's
# threshold, which rises as large blocks are freed). MALLOC_MMAP_THRESHOLD_ wins.
malloc_mmap_threshold_kb = 16
# Seconds in-flight requests get on shutdown to send their answer: the runs under way are
# stopped at once (recorded as stopped), and their clients told so within this time.
shutdown_grace_secs = 10
# Reverse proxies (addresses or CIDRs, e.g. ["127.0.0.1"]) whose X-Forwarded-For,
# -Proto, -Host, -Prefix and Forwarded headers are believed. Set api_key too:
# clients behind the proxy are remote and need it. See docs/deploy.md.
trusted_proxies = []
# Seconds between SSE keep-alive comments (keep below the proxy's read timeout).
sse_keepalive_secs = 15

[tools]
# Hosts web_fetch may reach even though they are loopback or private addresses.
fetch_allow_hosts = []
# JSON search backend for web_search (SearXNG style); {query} is replaced.
search_url = ""
# Seconds a tool call in Manual mode waits for approval before it is rejected.
approval_timeout_secs = 300

[triggers]
# Times one trigger may fire per minute unless it sets rate_limit_per_minute itself.
rate_limit_per_minute = 6

[llm]
# Seconds one model call may take in all (connect, retries, backoff, the whole answer),
# retries on 429/5xx/timeouts, and seconds a stream may go without a byte.
timeout_secs = 300
retries = 3
stream_idle_secs = 60

[agents]
# Requests that may wait for a busy agent; more are refused with 429 and Retry-After.
max_queue = 8
# Conversations whose latest messages stay in memory between runs.
cached_sessions = 256

[memory]
# Embeddings: "" = the bundled all-MiniLM-L6-v2 model (offline); or a provider id whose
# OpenAI-format /embeddings endpoint is used, with embedding_model naming its model.
embedding_provider = ""
# Remember every exchange as an episodic fragment, and recall this many fragments
# (scoring at least min_score) into the system prompt before each model call (0 = off).
auto_remember = true
# An exchange is found by the user's message (its vector is the one recall already made);
# true embeds question and answer together, one more model run per exchange.
embed_whole_exchange = false
# Exchanges remembered from one person's session (an API key, a /v1 `user`, a channel
# sender) are recalled only into that person's sessions; true shares them (one user).
share_episodic = false
recall_limit = 5
min_score = 0.3
# Threads one local embedding may use (0 = up to 2, as the daemon may use cores).
embed_threads = 0
# Fragments the in-memory search indexes hold in all (least recently used agents dropped).
index_cache_fragments = 20000
# Consolidation: merge near-duplicates; fragments not accessed for decay_days lose
# confidence (x decay_factor per run) and are dropped below decay_floor. 0 = no schedule.
consolidate_every_hours = 24
decay_days = 30

[metrics]
# Prometheus metrics at GET /metrics (same auth as the API).
enabled = true
# Add agent names as a label on the per-agent series (runs, refusals, queue depth).
agent_labels = false

[default_model]
# What provider = "default" and model = "default" mean in an agent manifest.
provider = "anthropic"
model = "claude-sonnet-4-20250514"
api_key_env = "ANTHROPIC_API_KEY"
"""


def unwritable_home(home: Path, exc: OSError) -> str:
    """Why a daemon cannot run on `home`, for `agentd start` and `agentd init` alike."""
    return (f"cannot write in the home {home} ({exc.strerror}): agentd keeps its database, lock and logs "
            "there; make it writable (or free some space)")


def write_default_config(home: Path) -> Path:
    """Create the home layout and a commented config.toml unless one exists."""
    home.mkdir(parents=True, exist_ok=True)
    for sub in ("data", "agents", "workspaces"):
        (home / sub).mkdir(exist_ok=True)
    path = home / "config.toml"
    if not path.exists():
        path.write_text(DEFAULT_CONFIG_TEXT, encoding="utf-8")
    return path
