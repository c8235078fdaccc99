"""MkDocs hooks: the reference pages generated from the code, so they cannot drift.

- the config keys table of docs/configuration.md, from agentd.config's dataclasses (types
  and defaults) and scripts/config_keys.toml (what each key means);
- docs/api-reference.md, from the OpenAPI document the app serves at /api/openapi.json;
- docs/channels/<adapter>.md, one page per adapter of agentd/data/channels.json.

mkdocs.yml names this file under `hooks:`; tests/test_docs.py imports it for the checks.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import tempfile
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KEYS_FILE = ROOT / "scripts" / "config_keys.toml"
CONFIG_MARKER = "<!-- generated: config-keys -->"
METHODS = ("get", "post", "put", "patch", "delete")


class DocsError(Exception):
    """The generated pages cannot be built: the docs and the code disagree."""


# -- configuration -----------------------------------------------------------------------

def cluster_module() -> Any:
    """The module of the [cluster] table (`ClusterSettings`, `cluster_settings`): the cluster
    package reads that table itself, so the config's dataclasses do not hold it."""
    return importlib.import_module("agentd.cluster.config")


def _type_name(value: Any, annotation: Any) -> str:
    text = str(annotation)
    if text.startswith("list[McpServerSpec"):
        return "array of tables"
    for word, name in (("list", "array of strings"), ("bool", "boolean"), ("float", "number"),
                       ("int", "integer"), ("str", "string"), ("dict", "table")):
        if text.startswith(word):
            return name
    return type(value).__name__


def _default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def schema_keys() -> dict[str, tuple[str, Any]]:
    """Every config.toml key the typed config holds: key -> (type, default or MISSING)."""
    from agentd.config import Config

    keys: dict[str, tuple[str, Any]] = {}
    for field in dataclasses.fields(Config):
        if field.name in ("home", "raw"):
            continue
        default = _default_of(field)
        if field.name == "database":
            keys["database_url"] = ("string", dataclasses.MISSING)
        elif dataclasses.is_dataclass(default):
            for sub in dataclasses.fields(default):
                value = getattr(default, sub.name)
                keys[f"{field.name}.{sub.name}"] = (_type_name(value, sub.type), value)
        elif isinstance(default, dict):
            keys[f"{field.name}.<provider>"] = ("string", dataclasses.MISSING)
        else:
            keys[field.name] = (_type_name(default, field.type), default)
    keys["api_listen"] = ("string", keys["api.listen_addr"][1])
    for sub in dataclasses.fields(cluster_module().ClusterSettings):
        keys[f"cluster.{sub.name}"] = (_type_name(None, sub.type), _default_of(sub))
    return keys


@lru_cache(maxsize=1)
def _key_texts() -> dict[str, Any]:
    return tomllib.loads(KEYS_FILE.read_text(encoding="utf-8"))


def config_keys() -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every key; DocsError when the code and the
    descriptions disagree."""
    texts = _key_texts()
    meanings, defaults = texts["keys"], texts.get("defaults", {})
    schema = schema_keys()
    # The [channels] and [a2a] tables are read by their own modules, not by a dataclass.
    extra = {k for k in meanings if k.startswith(("channels.", "a2a."))}
    missing = sorted(set(schema) - set(meanings))
    unknown = sorted(set(meanings) - set(schema) - extra)
    if missing or unknown:
        raise DocsError(f"{KEYS_FILE.name}: keys without a description {missing}, described keys the "
                        f"code does not have {unknown}")
    rows = []
    for key in sorted(set(schema) | extra, key=lambda k: (("." in k), k)):
        kind, value = schema.get(key, ("", dataclasses.MISSING))
        if key in defaults:
            shown = f"`{defaults[key]}`" if not defaults[key].startswith(("none", "catalog")) else defaults[key]
        elif value is dataclasses.MISSING:
            raise DocsError(f"{KEYS_FILE.name}: key {key} has no default in the code; give one under [defaults]")
        else:
            shown = f"`{_toml_value(value)}`"
        kind = kind or texts.get("types", {}).get(key) or ("table" if key.endswith(">") else "")
        rows.append((key, kind, shown, meanings[key]))
    return rows


def config_table() -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, kind, default, meaning in config_keys():
        table, _, name = key.rpartition(".")
        if name == "<adapter>":
            shown = f"`[{table}.{name}]`"
        else:
            shown = f"`[{table}] {name}`" if table else f"`{key}`"
        lines.append(f"| {shown} | {kind} | {default} | {meaning} |")
    return "\n".join(lines)


# -- HTTP API ----------------------------------------------------------------------------

@lru_cache(maxsize=1)
def served_app_facts() -> tuple[dict[str, Any], tuple[tuple[str, tuple[str, ...]], ...]]:
    """The OpenAPI document the app serves, and every (rule, methods) it routes: a kernel
    on a throwaway home, asked through Flask's test client."""
    from agentd.api import create_app
    from agentd.config import parse_config
    from agentd.kernel import Kernel

    with tempfile.TemporaryDirectory(prefix="agentd-docs-") as home:
        kernel = Kernel.open(parse_config({}, Path(home)))
        try:
            app = create_app(kernel)
            answer = app.test_client().get("/api/openapi.json")
            if answer.status_code != 200:
                raise DocsError(f"GET /api/openapi.json answered {answer.status_code}")
            rules = tuple(sorted((rule.rule, tuple(sorted((rule.methods or set()) - {"HEAD", "OPTIONS"})))
                                 for rule in app.url_map.iter_rules()))
            return answer.get_json(), rules
        finally:
            kernel.close()


def _schema_name(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref") or (schema.get("items") or {}).get("$ref")
    if ref:
        name = ref.rsplit("/", 1)[-1]
        link = f"[`{name}`](#schema-{name.lower()})"
        return f"array of {link}" if "items" in schema else link
    return f"`{json.dumps(schema, separators=(', ', ': '))}`" if schema else ""


def _cell(text: Any) -> str:
    return str(text or "").replace("\n", " ").replace("|", "\\|")


def api_reference(document: dict[str, Any]) -> str:
    """The reference page: every operation by tag, then the schemas."""
    info = document["info"]
    out = [f"# API reference", "",
           f"Every route of agentd {info['version']}, rendered from the OpenAPI {document['openapi']} "
           "document the daemon serves at `GET /api/openapi.json` (public, like `/api/version`). "
           "Load that document into any OpenAPI tool for the same content.", "",
           info.get("description", ""), ""]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                op = item[method]
                by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method, path, op))
    for tag in sorted(by_tag):
        out += [f"## {tag[:1].upper()}{tag[1:]}", ""]
        for method, path, op in by_tag[tag]:
            out += [f"### `{method.upper()} {path}`", "", op.get("summary", ""), ""]
            if op.get("description"):
                out += [op["description"], ""]
            params = op.get("parameters") or []
            if params:
                out += ["| parameter | in | required | schema | description |", "|---|---|---|---|---|"]
                out += [f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} | "
                        f"{_cell(_schema_name(p.get('schema', {})))} | {_cell(p.get('description'))} |"
                        for p in params]
                out.append("")
            body = (op.get("requestBody") or {}).get("content") or {}
            for media, content in body.items():
                out += [f"Request body (`{media}`): {_schema_name(content.get('schema', {}))}", ""]
            out += ["| status | meaning | body |", "|---|---|---|"]
            for status, answer in op.get("responses", {}).items():
                content = answer.get("content") or {}
                shown = "; ".join(f"`{m}` {_schema_name(c.get('schema', {}))}".strip() for m, c in content.items())
                out.append(f"| {status} | {_cell(answer.get('description'))} | {_cell(shown)} |")
            out.append("")
    schemas = (document.get("components") or {}).get("schemas") or {}
    if schemas:
        out += ["## Schemas", ""]
        for name, schema in sorted(schemas.items()):
            out += [f'### {name} {{#schema-{name.lower()}}}', "", "```json",
                    json.dumps(schema, indent=2, ensure_ascii=False), "```", ""]
    return "\n".join(out)


# -- channels ----------------------------------------------------------------------------

@lru_cache(maxsize=1)
def channel_catalogue() -> list[dict[str, Any]]:
    return json.loads((ROOT / "agentd" / "data" / "channels.json").read_text(encoding="utf-8"))


def adapter_notes() -> dict[str, list[list[str]]]:
    """Rows of the adapter table on docs/channels/index.md (inbound mode, public URL, library,
    tested against, status), by adapter name."""
    text = (ROOT / "docs" / "channels" / "index.md").read_text(encoding="utf-8")
    notes: dict[str, list[list[str]]] = {}
    in_table = False
    for line in text.splitlines():
        if line.startswith("| adapter | inbound mode |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            break
        if in_table and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            notes.setdefault(cells[0].split()[0], []).append(cells)
    return notes


def channel_page(entry: dict[str, Any]) -> str:
    """One adapter's page: what it needs, its setup steps and config keys."""
    name = entry["name"]
    labels = {f["key"]: f for f in entry.get("fields", [])}
    out = [f"# {entry['display_name']} (`{name}`)", "", entry.get("description", ""), "",
           f"Category: {entry.get('category', '')} · difficulty: {entry.get('difficulty', '')} · "
           f"setup: {entry.get('setup_time', '')}" + (f" · inbound: {entry['inbound']}" if entry.get("inbound") else ""),
           ""]
    if entry.get("protocol"):
        out += [entry["protocol"], ""]
    needs = [f for f in entry.get("fields", []) if f.get("required")]
    out += ["## What it needs", ""]
    if needs:
        for f in needs:
            where = f" (the environment variable `{f['env_var']}`, named by `{f['key']}`)" if f.get("env_var") else ""
            out.append(f"- **{f['label']}**: `{f['key']}`{where}")
    else:
        out.append("- No required keys.")
    if entry.get("quick_setup"):
        out += ["", entry["quick_setup"]]
    rows = adapter_notes().get(name, [])
    if rows:
        out += ["", "## How it works", "", "| variant | inbound | needs a public URL | library | tested against |",
                "|---|---|---|---|---|"]
        out += [f"| {' | '.join(cells[:5])} |" for cells in rows]
        for cells in (rows if all(len(c) > 5 for c in rows) else []):
            out += ["", f"**Status{'' if len(rows) == 1 else ' (' + cells[0] + ')'}:** {cells[5]}"]
    out += ["", "## Setup", ""]
    out += [f"{i}. {step}" for i, step in enumerate(entry.get("setup_steps") or [], 1)] or ["No steps."]
    out += ["", "Then in `config.toml` (or `POST /api/channels/" + name + "/configure`), and "
            "`POST /api/channels/reload`:", "", "```toml", entry.get("config_template") or f"[channels.{name}]",
            "```", "", "## Keys", "",
            "Keys marked *agentd* are agentd's own additions to the reference catalogue. Every "
            "adapter also takes `default_agent`, `allowed_users` and `allowed_channels` "
            "(see [Channels](index.md)).", "",
            "| key | kind | default | label |", "|---|---|---|---|"]
    for key, spec in entry.get("keys", {}).items():
        default = spec.get("default")
        shown = "" if default is None else f"`{_cell(json.dumps(default))}`"
        mark = " *agentd*" if spec.get("agentd") else ""
        label = (labels.get(key) or {}).get("label", "")
        out.append(f"| `{key}`{mark} | {spec.get('kind', '')} | {shown} | {_cell(label)} |")
    out.append("")
    return "\n".join(out)


# -- the MkDocs hooks --------------------------------------------------------------------

def on_config(config: Any) -> Any:
    nav = config.get("nav") or []
    for entry in nav:
        if isinstance(entry, dict) and "Channels" in entry:
            entry["Channels"] = ["channels/index.md", {"Reply formatting": "channels/formatting.md"}] + [
                {c["display_name"]: f"channels/{c['name']}.md"} for c in channel_catalogue()]
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    document, _ = served_app_facts()
    files.append(File.generated(config, "api-reference.md", content=api_reference(document)))
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "changelog.md", content=changelog))
    for entry in channel_catalogue():
        files.append(File.generated(config, f"channels/{entry['name']}.md", content=channel_page(entry)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_table())
    return markdown
