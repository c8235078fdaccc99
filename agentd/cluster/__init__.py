"""Several daemons on one database: run leases, the heartbeat, the reaper, leaders.

Every daemon has a `Cluster` (agentd/cluster/coordinator.py), also a lone daemon on
SQLite, where the same code runs and never meets a competitor. What it does:

- **One run per session at a time across daemons**: the run's session lease and its run
  record (agentd/cluster/run_leases.py).
- **Heartbeat.** Every `lease_secs / 3` the daemon renews its row in `cluster_daemons`
  (agentd/cluster/members.py), its leases and run records, marks runs whose lease expired
  `failed` (their daemon died: the reaper, below), applies stop requests made on other
  daemons, keeps its agent registry in step with the database and lets standby channel
  adapters try to become leader.
- **Leaders.** A channel adapter runs only on the daemon holding `channel:<name>`
  (agentd/cluster/held_leases.py).

Settings (`agentd/cluster/config.py`): `[cluster] daemon_id` (default `<hostname>:<port>`,
unique per daemon), `lease_secs` (default 10) and `advertise_url` (the URL the other daemons
reach this one at, recorded in `cluster_daemons`: webhooks are relayed there,
agentd/cluster/relay.py).
"""
