#!/usr/bin/env python3
"""Regenerate agentd/data/{providers,models,aliases}.json from the reference catalog.

The reference describes the original system; we keep only providers our drivers can
speak (OpenAI-compatible, Anthropic, Gemini) and exactly three local runners. The output
is plain data: agentd.llm.catalog reads it at runtime, this script is only rerun when the
reference changes.

    python scripts/build_catalog_data.py [REFERENCE_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "agentd" / "data"

# Wire format -> driver kind. Formats missing here (copilot, bedrock, openai-compatible-azure,
# subprocess-cli) need auth or transports our drivers do not implement, so they are dropped.
KINDS = {"openai-compatible": "openai", "anthropic": "anthropic", "anthropic-compatible": "anthropic",
         "gemini": "gemini"}
# codex duplicates openai (same URL and key); lemonade would be a fourth local runner.
DROPPED = {"codex", "lemonade"}
TIERS = {"frontier", "smart", "balanced", "fast", "local"}
# Tier names the reference might use that are not in the spec's enum.
TIER_MAP = {"premium": "frontier", "flagship": "frontier", "standard": "balanced", "mini": "fast",
            "cheap": "fast", "free": "fast"}
MODEL_FIELDS: dict[str, type] = {
    "id": str, "display_name": str, "provider": str, "tier": str, "context_window": int,
    "max_output_tokens": int, "input_cost_per_m": float, "output_cost_per_m": float,
    "supports_tools": bool, "supports_vision": bool, "supports_streaming": bool}


def read(ref: Path, name: str) -> Any:
    return json.loads((ref / name).read_text(encoding="utf-8"))


def build_providers(raw: list[dict]) -> list[dict]:
    """Providers our drivers can reach, in reference order, with a driver `kind`."""
    out = []
    for p in raw:
        kind = KINDS.get(p["api_format"])
        if kind is None or p["id"] in DROPPED:
            continue
        # The spec says api_key_env is "" when a provider takes no key (the local runners).
        env = p["api_key_env"] if p["key_required"] else ""
        out.append({"id": p["id"], "display_name": p["display_name"], "api_key_env": env,
                    "base_url": p["base_url"], "key_required": bool(p["key_required"]), "kind": kind})
    return out


def build_model(m: dict, local: bool) -> dict:
    """One model reduced to the spec's fields, with types coerced and the tier normalised."""
    entry = {k: cast(m[k]) for k, cast in MODEL_FIELDS.items()}
    if local:
        # Local runners cost nothing, whatever the reference says.
        entry.update(tier="local", input_cost_per_m=0.0, output_cost_per_m=0.0)
    elif entry["tier"] not in TIERS:
        entry["tier"] = TIER_MAP.get(entry["tier"].lower(), "balanced")
    entry["aliases"] = [a.lower() for a in m.get("aliases") or []]
    return entry


def build_models(raw: list[dict], providers: list[dict]) -> list[dict]:
    kept = {p["id"] for p in providers}
    local = {p["id"] for p in providers if not p["key_required"]}
    models, seen = [], set()
    for m in raw:
        if m["provider"] not in kept or m["id"] in seen:
            continue
        seen.add(m["id"])
        models.append(build_model(m, m["provider"] in local))
    return models


def build_aliases(explicit: dict[str, str], models: list[dict]) -> dict[str, str]:
    """The explicit table first (it wins), then each model's own aliases (first model wins).

    Aliases that equal a model id are dropped: an id must always mean that model. Each
    model's `aliases` list is trimmed to the aliases that really point at it.
    """
    ids = {m["id"] for m in models}
    lowered_ids = {i.lower() for i in ids}
    aliases = {a.lower(): t for a, t in explicit.items() if t in ids and a.lower() not in lowered_ids}
    for m in models:
        own = []
        for alias in m["aliases"]:
            if alias in lowered_ids or aliases.setdefault(alias, m["id"]) != m["id"]:
                continue
            if alias not in own:
                own.append(alias)
        m["aliases"] = own
    return dict(sorted(aliases.items()))


def check(providers: list[dict], models: list[dict], aliases: dict[str, str]) -> None:
    """Fail loudly rather than write a catalog the runtime or the tests would reject."""
    local = sorted(p["id"] for p in providers if not p["key_required"])
    assert local == ["lmstudio", "ollama", "vllm"], local
    assert len(providers) >= 30 and len(models) >= 100, (len(providers), len(models))
    known, ids = {p["id"] for p in providers}, {m["id"] for m in models}
    for m in models:
        assert m["provider"] in known and m["tier"] in TIERS, m["id"]
        assert m["input_cost_per_m"] >= 0 and m["output_cost_per_m"] >= 0, m["id"]
    assert all(a == a.lower() and t in ids for a, t in aliases.items())


def write_json(name: str, data: Any) -> None:
    (OUT / name).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main() -> None:
    ref = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "reference"
    providers = build_providers(read(ref, "providers.json"))
    models = build_models(read(ref, "models.json"), providers)
    aliases = build_aliases(read(ref, "aliases.json")["explicit"], models)
    check(providers, models, aliases)
    OUT.mkdir(parents=True, exist_ok=True)
    # A package (not a bare folder) so importlib.resources can find the files once installed.
    (OUT / "__init__.py").write_text('"""Catalog data files (providers, models, aliases) shipped with the package."""\n')
    write_json("providers.json", providers)
    write_json("models.json", models)
    write_json("aliases.json", aliases)
    print(f"{len(providers)} providers, {len(models)} models "
          f"({len({m['provider'] for m in models})} providers with models), {len(aliases)} aliases")


if __name__ == "__main__":
    main()
