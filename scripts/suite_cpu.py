#!/usr/bin/env python3
"""Where a command's CPU goes, by kind of process: run COMMAND and sum the CPU time (user +
system) of every process it starts, read from /proc five times a second.

    python scripts/suite_cpu.py -- python -m pytest --db=postgres

Kinds: the pytest workers, the daemons forked from a worker's zygote (tests/zygote.py), the
zygotes, daemons and CLI runs started as processes of their own, schemathesis, Chromium and
chromedriver, and any other program by name. PostgreSQL's server processes are not the
command's descendants (pg_ctl leaves them to init), so every `postgres` process on the machine
that runs meanwhile is counted under its own kind: run it on an otherwise idle host.
A process that lives less than a sampling interval is missed, and one that ends loses its
last interval: the figures are a lower bound, a few per cent under `/usr/bin/time`'s.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
INTERVAL = 0.2


def read(pid: str, name: str) -> str:
    with open(f"/proc/{pid}/{name}", "rb") as fh:
        return fh.read().decode(errors="replace")


def stat_fields(pid: str) -> list[str]:
    text = read(pid, "stat")
    return text[text.rindex(")") + 2:].split()


def kind(pid: str, parent: str) -> str:
    """What the process is, from its command line, its name and its parent's command line."""
    command = read(pid, "cmdline").replace("\0", " ")
    name = read(pid, "comm").strip()
    if "zygote.py" in command:
        return "forked daemon or CLI run" if "zygote.py" in read(parent, "cmdline") else "zygote"
    if "pytest-xdist" in command or " -u -c " in command + " ":
        return "pytest worker"
    if "-m agentd" in command or command.split(" ")[1:2] == [os.path.join(sys.prefix, "bin", "agentd")]:
        return "daemon or CLI run of its own"
    if os.path.basename(command.split(" ")[1] if " " in command else "") == "st" or name == "st":
        return "schemathesis"
    if name.startswith(("chrom", "headless")):
        return "chromium" if name != "chromedriver" else "chromedriver"
    if "pytest" in command and name.startswith("python"):
        return "pytest (main)"
    return name


def processes() -> dict[str, str]:
    """pid -> parent pid, for every process."""
    parents = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                parents[pid] = stat_fields(pid)[1]
            except (OSError, IndexError, ValueError):
                pass
    return parents


def sample(root: int, seen: dict[tuple[str, str], list]) -> None:
    parents = processes()
    children = collections.defaultdict(list)
    for pid, parent in parents.items():
        children[parent].append(pid)
    ours, stack = set(), [str(root)]
    while stack:
        pid = stack.pop()
        ours.add(pid)
        stack.extend(children.get(pid, ()))
    for pid, parent in parents.items():
        try:
            fields = stat_fields(pid)
            if pid not in ours and read(pid, "comm").strip() != "postgres":
                continue
            key = (pid, fields[19])  # a pid with its start time: never two processes
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            if key not in seen or seen[key][1] == "zygote":  # a fork shows as the zygote at first
                seen[key] = [cpu, kind(pid, parent)]
            seen[key][0] = cpu
        except (OSError, IndexError, ValueError):
            continue


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run (after --)")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    started = time.monotonic()
    proc = subprocess.Popen(command)
    seen: dict[tuple[str, str], list] = {}
    while proc.poll() is None:
        sample(proc.pid, seen)
        time.sleep(INTERVAL)
    wall = time.monotonic() - started
    total, count = collections.Counter(), collections.Counter()
    for cpu, what in seen.values():
        total[what] += cpu
        count[what] += 1
    print(f"\n{wall:.0f} s wall; CPU seconds by kind of process (processes seen):", file=sys.stderr)
    for what, cpu in total.most_common():
        if cpu >= 0.5:
            print(f"{cpu:9.1f}  {count[what]:6d}  {what}", file=sys.stderr)
    print(f"{sum(total.values()):9.1f}          all of them", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
