#!/usr/bin/env python3
"""Sign an agent manifest for POST /api/agents `signed_manifest`.

    python scripts/sign_manifest.py agent.toml --key signer.key [--signer-id me] > envelope.json

The key file holds a 32-byte Ed25519 seed as hex; `--new-key FILE` creates one.
Send the output as the `signed_manifest` string field (and the manifest as `manifest_toml`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nacl.signing import SigningKey  # noqa: E402

from agentd.agents.signing import sign_manifest  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--key", type=Path, help="hex seed file")
    parser.add_argument("--new-key", type=Path, help="write a fresh hex seed here and use it")
    parser.add_argument("--signer-id", default="")
    args = parser.parse_args()
    if args.new_key:
        key = SigningKey.generate()
        args.new_key.write_text(bytes(key).hex())
        args.new_key.chmod(0o600)
    elif args.key:
        key = SigningKey(bytes.fromhex(args.key.read_text().strip()))
    else:
        parser.error("give --key or --new-key")
    print(sign_manifest(args.manifest.read_text(encoding="utf-8"), key, args.signer_id))


if __name__ == "__main__":
    main()
