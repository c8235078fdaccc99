#!/usr/bin/env python3
"""Regenerate agentd/data/{providers,models,aliases}.json from the reference catalog.

The reference describes the original system; we keep only providers our drivers can
speak (OpenAI-compatible, Anthropic, Gemini) and exactly three local runners.

    python scripts/build_catalog_data.py [REFERENCE_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"openai-compatible": "openai", "anthropic": "anthropic", "anthropic-compatible": "anthropic",
         "gemini": "gemini"}
# Duplicates of another entry, or a local runner beyond the three we document.
DROPPED = {"codex", "lemonade"}
TIERS = {"frontier", "smart", "balanced", "fast", "local"}
MODEL_FIELDS = ("id", "display_name", "provider", "tier", "context_window", "max_output_tokens",
                "input_cost_per_m", "output_cost_per_m", "supports_tools", "supports_vision",
                "supports_streaming")


def build(ref: Path) -> tuple[list[dict], list[dict], dict[str, str]]:
    providers = []
    for p in json.loads((ref / "providers.json").read_text()):
        kind = KINDS.get(p["api_format"])
        if kind is None or p["id"] in DROPPED:
            continue
        # Local runners take no key: the spec gives them an empty api_key_env.
        env = p["api_key_env"] if p["key_required"] else ""
        providers.append({"id": p["id"], "display_name": p["display_name"], "api_key_env": env,
                          "base_url": p["base_url"], "key_required": bool(p["key_required"]), "kind": kind})
    kept = {p["id"]: p for p in providers}
    local = {p["id"] for p in providers if not p["key_required"]}
    models: list[dict] = []
    ids: set[str] = set()
    for m in json.loads((ref / "models.json").read_text()):
        if m["provider"] not in kept or m["id"] in ids:
            continue
        entry = {k: m[k] for k in MODEL_FIELDS}
        if m["provider"] in local:
            entry.update(tier="local", input_cost_per_m=0.0, output_cost_per_m=0.0)
        elif entry["tier"] not in TIERS:
            entry["tier"] = "balanced"
        entry["input_cost_per_m"] = float(entry["input_cost_per_m"])
        entry["output_cost_per_m"] = float(entry["output_cost_per_m"])
        entry["aliases"] = [a.lower() for a in m.get("aliases") or []]
        ids.add(entry["id"])
        models.append(entry)
    lowered_ids = {i.lower() for i in ids}
    aliases: dict[str, str] = {}
    explicit = json.loads((ref / "aliases.json").read_text())["explicit"]
    for alias, target in explicit.items():
        if target in ids and alias.lower() not in lowered_ids:
            aliases[alias.lower()] = target
    for m in models:
        own = []
        for alias in m["aliases"]:
            if alias in lowered_ids or aliases.get(alias, m["id"]) != m["id"]:
                continue  # an id, or taken by the explicit table / an earlier model
            aliases[alias] = m["id"]
            own.append(alias)
        m["aliases"] = own
    return providers, models, dict(sorted(aliases.items()))


def main() -> None:
    ref = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "reference"
    providers, models, aliases = build(ref)
    out = ROOT / "agentd" / "data"
    for name, data in (("providers", providers), ("models", models), ("aliases", aliases)):
        (out / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(providers)} providers, {len(models)} models, {len(aliases)} aliases")


if __name__ == "__main__":
    main()
