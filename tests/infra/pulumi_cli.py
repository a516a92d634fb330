"""The checks the Pulumi CLI makes on a stack's config before it runs the program, restated in
Python so `make test` holds every committed stack file to them without the CLI (the engine level,
`make engine`, runs the real CLI on the same files).

Source: pulumi v3.277.0, pkg/workspace/config.go (mergeConfig, validateStackConfigValues) and
sdk/go/common/workspace/project.go (Project.Validate, ValidateConfigValue).
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

_INTEGER = re.compile(r"^[+-]?[0-9]+$")  # what Go's strconv.Atoi accepts


def project_errors(project: dict[str, Any]) -> list[str]:
    """Pulumi.yaml's own config schema: a default must have the declared type."""
    errors: list[str] = []
    for key, decl in cast(dict[str, Any], project.get("config") or {}).items():
        if not isinstance(decl, dict):
            continue
        d = cast(dict[str, Any], decl)
        if "default" in d and "value" in d:
            errors.append(f"project config '{key}' cannot have both a 'default' and 'value'")
        if d.get("type") == "array" and "items" not in d:
            errors.append(f"The configuration key '{key}' declares an array but no 'items'")
        if "type" in d and "default" in d and not _valid(d["type"], d.get("items"), d["default"]):
            errors.append(
                f"The default value specified for configuration key '{key}' is not of the "
                f"expected type '{d['type']}'"
            )
    return errors


def stack_errors(project: dict[str, Any], stack: str, stack_doc: dict[str, Any]) -> list[str]:
    """What `pulumi preview`/`up` refuse in a stack file, in the CLI's own words."""
    name = project["name"]
    values = cast(dict[str, Any], stack_doc.get("config") or {})
    decls = cast(dict[str, Any], project.get("config") or {})
    missing: list[str] = []
    merged: dict[str, Any] = {}
    for key in sorted(decls):
        decl = cast(dict[str, Any], decls[key]) if isinstance(decls[key], dict) else {}
        full = key if ":" in key else f"{name}:{key}"
        if full in values:
            merged[key] = values[full]
        elif "default" in decl:
            merged[key] = _default_value(decl["default"])
        elif full.split(":", 1)[0] == name:
            missing.append(key)
    if missing:
        return [_missing(stack, missing)]
    errors: list[str] = []
    for key in sorted(merged):
        decl = cast(dict[str, Any], decls[key])
        value = merged[key]
        secure = isinstance(value, dict) and "secure" in value
        if decl.get("secret") and not secure:
            errors.append(
                f"Stack '{stack}' with configuration key '{key}' must be encrypted as it's secret"
            )
            continue
        content = _text(value)
        if "type" in decl and not secure and not _valid(decl["type"], decl.get("items"), content):
            full_type = decl["type"] if "items" not in decl else f"array<{decl['items']['type']}>"
            errors.append(
                f"Stack '{stack}' with configuration key '{key}' must be of type '{full_type}'"
            )
    return errors


def _default_value(default: Any) -> Any:
    """A project default as the CLI stores it in the stack's config: a primitive as its text, a
    structure as JSON (decoded again to validate)."""
    if isinstance(default, list | dict):
        return json.loads(json.dumps(default))
    return _text(default)


def _text(value: Any) -> Any:
    """A stack file's scalar as the CLI holds it: text (YAML `false` is "false")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def _valid(type_name: str, items: Any, value: Any) -> bool:
    """ValidateConfigValue, on values typed as Go decodes them (YAML or JSON)."""
    if type_name == "string":
        return isinstance(value, str)
    if type_name == "integer":
        if isinstance(value, bool):
            return False
        if isinstance(value, int):
            return True
        if isinstance(value, float):
            return value.is_integer()
        return isinstance(value, str) and bool(_INTEGER.match(value))
    if type_name == "boolean":
        return isinstance(value, bool) or value in ("true", "false")
    if type_name == "object":
        return isinstance(value, dict)
    if not isinstance(value, list) or not isinstance(items, dict):
        return False
    i = cast(dict[str, Any], items)
    return all(_valid(i["type"], i.get("items"), v) for v in cast(list[Any], value))


def _missing(stack: str, keys: list[str]) -> str:
    quoted = [f"'{k}'" for k in keys]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"
    noun = "value" if len(keys) == 1 else "values"
    return f"Stack '{stack}' is missing configuration {noun} {listed}"
