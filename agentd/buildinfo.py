"""Build facts for GET /api/version, read once and cached."""

from __future__ import annotations

import functools
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from agentd import __version__

_PKG = Path(__file__).resolve().parent


@functools.cache
def git_sha() -> str:
    """Commit of the source tree when run from a checkout, else "unknown"."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=_PKG,
                             capture_output=True, text=True, timeout=2)
        sha = out.stdout.strip()
        return sha if out.returncode == 0 and sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.cache
def build_date() -> str:
    """Date the package files were written (install or checkout time)."""
    stamp = (_PKG / "__init__.py").stat().st_mtime
    return datetime.fromtimestamp(stamp, timezone.utc).date().isoformat()


def version() -> dict[str, str]:
    """The body of GET /api/version (seven string fields, plus python_version)."""
    return {
        "name": "agentd",
        "version": __version__,
        "build_date": build_date(),
        "git_sha": git_sha(),
        # The spec's field comes from the Rust original; agentd has no Rust toolchain.
        "rust_version": "none",
        "python_version": platform.python_version(),
        "platform": platform.system().lower(),
        "arch": platform.machine(),
    }
