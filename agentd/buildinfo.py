"""Build facts for GET /api/version, read once and cached."""

from __future__ import annotations

import functools
import subprocess
from datetime import datetime, timezone
from pathlib import Path

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
