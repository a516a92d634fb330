"""Stack config as the Pulumi CLI would hand it to the program, read from the files: Pulumi.yaml's
defaults, then stacks/Pulumi.<stack>.yaml, then KEY=VALUE overrides (mocks read none of them)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
from pathlib import Path
from typing import Any, cast

from common.userfiles import (
    ParseError,
    UnreadableError,
    described,
    key_shown,
    parse_yaml,
    read_text,
    unknown_key,
)
from infra.stack.credentials import CREDENTIAL_KEYS, SECRET
from infra.stack.keys import (
    KNOWN_KEYS,
    LIST_KEYS,
    PROJECT,
    PROJECT_DIR,
    StackConfigError,
    unknown_key_problems,
)


class StackFileError(ValueError):
    """A stack file, project file or override that cannot be read: one line naming it."""


class EscEnvironmentError(StackFileError):
    """A stack file that imports Pulumi ESC environments: only the Pulumi CLI opens them."""


# What the Pulumi CLI accepts as a stack name.
_STACK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


_STACK_NAME_RULE = "a stack name is 1-100 letters, digits, '_', '.' or '-'"


def stack_name(text: str) -> str:
    """--stack, checked as the CLIs parse it (argparse type): the name prefixes their lines."""
    if not _STACK_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{described(text)}: {_STACK_NAME_RULE}")
    return text


def stack_help(project_dir: Path = PROJECT_DIR) -> str:
    """--stack's help: the stack files there are."""
    found = sorted(p.name.split(".")[1] for p in (project_dir / STACKS_DIR).glob("Pulumi.*.yaml"))
    return f"a stack of {STACKS_DIR}/Pulumi.<stack>.yaml: {', '.join(found) or 'none yet'}"


def find_stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> Path:
    """stacks/Pulumi.<stack>.yaml, or StackFileError naming the stacks there are."""
    if not _STACK_NAME.fullmatch(stack):
        raise StackFileError(f"--stack {described(stack)}: {_STACK_NAME_RULE}")
    path = project_dir / STACKS_DIR / f"Pulumi.{stack}.yaml"
    if not os.path.lexists(path):  # one that exists but cannot be read is said by the reader
        found = (project_dir / STACKS_DIR).glob("Pulumi.*.yaml")
        known = sorted(p.name.split(".")[1] for p in found)
        raise StackFileError(f"--stack {stack}: no {path}; stacks: {', '.join(known) or 'none'}")
    return path


def stack_config(
    stack: str, overrides: list[str] | None = None, project_dir: Path = PROJECT_DIR
) -> tuple[dict[str, str], list[str]]:
    """Pulumi.yaml defaults, then stacks/Pulumi.<stack>.yaml, then KEY=VALUE overrides."""
    # the project's file first: another project's checkout is said as such, not as a stack
    defaults = _config_section(project_dir / "Pulumi.yaml", project=True)
    stack_file = find_stack_file(stack, project_dir)
    declared = sorted(
        k.removeprefix(f"{PROJECT}:") for k in defaults if _qualify(k).startswith(f"{PROJECT}:")
    )
    extra = [k for k in declared if k not in KNOWN_KEYS]
    if extra:  # the project's own file: its key names are quoted
        raise StackFileError(
            f"Pulumi.yaml: declares {', '.join(extra[:3])}, which the program does not read: "
            "remove it from Pulumi.yaml, or give it a field in infra/stack/keys.py"
        )
    undeclared = sorted(set(KNOWN_KEYS) - set(declared))
    if undeclared:  # a damaged project file: every key would be "required" otherwise
        what = (
            "no config section (the project's keys, their types and defaults)"
            if not declared
            else f"declares no {', '.join(undeclared[:3])}{', …' if len(undeclared) > 3 else ''}"
        )
        raise StackFileError(f"Pulumi.yaml: {what}: restore it (git checkout Pulumi.yaml)")
    values = _config_section(stack_file, project=False)
    config: dict[str, str] = {_qualify(k): v for k, v in _defaults(defaults).items()}
    secret_keys: list[str] = []
    in_file: set[str] = set()
    for key, value in values.items():
        if _qualify(key) in in_file:  # `region` and `lingjun-rdma:region`: one key
            raise StackFileError(
                f"{stack_file.name}: {_qualify(key)} is given twice (with and without its "
                "namespace): keep one"
            )
        in_file.add(_qualify(key))
        if isinstance(value, dict) and "secure" in value:
            if key.removeprefix(f"{PROJECT}:") not in CREDENTIAL_KEYS:
                raise StackFileError(
                    f"{stack_file.name}: {key} is encrypted (secure:), but only credentials are "
                    "secrets here and only the Pulumi CLI can decrypt: store it in plain text "
                    f"(pulumi config set {key} <value>)"
                )
            # the render shows where a secret goes, never its value
            config[_qualify(key)] = SECRET
            secret_keys.append(_qualify(key))
        elif key.removeprefix(f"{PROJECT}:") in LIST_KEYS and not isinstance(value, list | None):
            # Pulumi.yaml types it array<string>: the CLI refuses anything else
            raise StackFileError(
                f"{stack_file.name}: {_qualify(key)}: {described(cast(object, value))}, not a "
                'YAML list: write it as one, e.g. ["a", "b"] (pulumi config set --path '
                f"'{_qualify(key)}[0]' a)"
            )
        else:
            config[_qualify(key)] = _as_config_string(value)
    overridden: set[str] = set()
    for number, item in enumerate(overrides or [], 1):
        key, sep, value = item.partition("=")
        if not sep or not _CONFIG_KEY.fullmatch(key):
            # not quoted back: a value typed with ':' for '=' may be a password
            raise StackFileError(
                f"--set number {number}: expected KEY=VALUE with KEY a config key (region, "
                "or namespace:key), e.g. --set nonHostNetwork=true"
            )
        if _qualify(key) in overridden:
            raise StackFileError(f"--set {key}: given twice: keep one")
        try:  # bytes the shell passed that are not UTF-8 (Pulumi's config is UTF-8 text)
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise StackFileError(f"--set {key}: its value is not UTF-8 text: retype it") from None
        overridden.add(_qualify(key))
        config[_qualify(key)] = value
        if key.removeprefix(f"{PROJECT}:") in CREDENTIAL_KEYS and _qualify(key) not in secret_keys:
            # as `pulumi config set --secret` would store it
            secret_keys.append(_qualify(key))
    # Under mocks the program cannot list the keys it was given: a misspelt one is caught here.
    problems = unknown_key_problems(config)
    if problems:
        raise StackConfigError("\n".join(problems))
    return config, secret_keys


def _defaults(section: dict[str, Any]) -> dict[str, str]:
    """What Pulumi.yaml's `config:` gives each key it declares a value or default for."""
    found: dict[str, str] = {}
    for key, schema in section.items():
        if not isinstance(schema, dict):  # `key: value`, Pulumi's shorthand for a value
            found[key] = _as_config_string(schema)
        elif "default" in schema or "value" in schema:
            declared = cast(dict[str, Any], schema)
            found[key] = _as_config_string(declared.get("value", declared.get("default")))
    return found


@functools.cache
def project_defaults() -> dict[str, str]:
    """The default of each key of this project's namespace, as the CLI hands it to the program
    (a key a stack sets to something else is that stack's choice)."""
    section = _config_section(PROJECT_DIR / "Pulumi.yaml", project=True)
    prefix = f"{PROJECT}:"
    return {_qualify(k).removeprefix(prefix): v for k, v in _defaults(section).items()}


# A config key as Pulumi spells one: `name`, or `namespace:name`.
_CONFIG_KEY = re.compile(r"(?:[A-Za-z][A-Za-z0-9_.-]*:)?[A-Za-z][A-Za-z0-9_.-]*")
# What a stack file holds besides `config:` (Pulumi's own keys for its secrets provider).
# Where the stack files are (Pulumi.yaml's stackConfigDir, which the CLI follows).
STACKS_DIR = "stacks"
_STACK_FILE_KEYS = {"config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment"}


def _config_section(path: Path, *, project: bool) -> dict[str, Any]:
    """The `config:` mapping of this project's Pulumi.yaml or of a stack file, or
    StackFileError in one line."""
    where = path.relative_to(PROJECT_DIR) if path.is_relative_to(PROJECT_DIR) else path
    try:
        text = read_text(path)
        doc: Any = parse_yaml(text)
    except (UnreadableError, ParseError) as exc:
        raise StackFileError(f"{where}: {exc}") from None
    if project and (not isinstance(doc, dict) or cast(dict[str, Any], doc).get("name") != PROJECT):
        raise StackFileError(f"{where}: not this project's (it needs name: {PROJECT})")
    if doc is None:
        raise StackFileError(f"{where}: empty: it needs a `config:` mapping of the stack's keys")
    if not isinstance(doc, dict):
        found = type(doc).__name__
        raise StackFileError(f"{where}: a {found}, not a mapping with a `config:` key")
    top = cast(dict[object, Any], doc)
    stray = [k for k in top if not project and k not in _STACK_FILE_KEYS]
    if stray:
        key = stray[0]
        if isinstance(key, str) and key.removeprefix(f"{PROJECT}:") in KNOWN_KEYS:
            fix = "a config key: indent it under `config:`"
        else:
            fix = f"{unknown_key(key, _STACK_FILE_KEYS)} (the stack's settings go under `config:`)"
        raise StackFileError(f"{where}: unknown top-level key, {key_shown(key)}: {fix}")
    if not project and top.get("environment"):
        raise EscEnvironmentError(
            f"{where}: imports Pulumi ESC environments (`environment:`), whose values only the "
            "Pulumi CLI can open: render reads stack files alone, and would check this stack "
            "without them; give their keys under `config:` or with --set, or preview it with "
            "the CLI (make deploy ACTION=preview)"
        )
    if project and top.get("stackConfigDir", STACKS_DIR) != STACKS_DIR:
        # the CLI would read the stacks elsewhere than render, deploy's checks and the tests
        raise StackFileError(
            f"{where}: stackConfigDir is {described(top['stackConfigDir'])}, not {STACKS_DIR}: "
            f"this project's stacks live in {STACKS_DIR}/ (restore `stackConfigDir: "
            f"{STACKS_DIR}`)"
        )
    config: Any = top.get("config")
    if config is None or (project and not config):  # the project's: said as no section, below
        config = {}
    if not isinstance(config, dict):
        found = type(config).__name__
        raise StackFileError(f"{where}: `config:` is a {found}, not a mapping of keys to values")
    for key in cast(dict[object, Any], config):
        if not isinstance(key, str) or not _CONFIG_KEY.fullmatch(key):
            raise StackFileError(
                f"{where}: {_place_of(text, key)}: config key {key_shown(key)} is not a key "
                "(region, or namespace:key; a look-alike character pasted in, such as an en "
                "dash for a hyphen, is not one: type it again)"
            )
    values = cast(dict[str, Any], config)
    for key, value in values.items():
        if key.removeprefix(f"{PROJECT}:") == "config" and isinstance(value, dict):
            raise StackFileError(
                f"{where}: {_place_of(text, key)}: a `config:` inside `config:`: its keys go one "
                "level up: dedent them"
            )
        if _binary(value):  # the CLI hands a program text: bytes were "b'...'" here
            raise StackFileError(
                f"{where}: {_place_of(text, key)}: {key}: a binary value (YAML !!binary), not "
                "text: write the value itself, without the tag"
            )
    if not project and any(_is_number(v) for v in values.values()):
        written = _numbers_as_written(text)
        values = {k: written.get(k, v) if _is_number(v) else v for k, v in values.items()}
    return values


def _binary(value: object) -> bool:
    """Bytes anywhere in a value (YAML's !!binary, in a list or mapping too)."""
    if isinstance(value, list):
        return any(_binary(v) for v in cast(list[object], value))
    if isinstance(value, dict):
        return any(_binary(v) for v in cast(dict[object, object], value).values())
    return isinstance(value, bytes)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _numbers_as_written(text: str) -> dict[str, str]:
    """The stack's config values that YAML reads as numbers, as written (0x10, +5, 1e3): the
    Pulumi CLI hands the program a value's text, which its checks then read (`16` for `0x10`
    planned a node pool the real preview refuses)."""
    import yaml

    return {
        str(k.value): str(v.value)
        for k, v in _config_nodes(text)
        if isinstance(v, yaml.ScalarNode)  # the caller takes those read as numbers
    }


def _place_of(text: str, key: object) -> str:
    """Where a config key YAML read as `key` is written ("line 3, column 3"): a key that is not
    one is not quoted (it may be a secret pasted there), so the user needs its place."""
    for node, _ in _config_nodes(text):
        if _read_key(node) == key:
            return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"
    return "its place unknown"


def _read_key(node: Any) -> object:
    import yaml

    loader: Any = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _config_nodes(text: str) -> list[tuple[Any, Any]]:
    """The (key, value) nodes of the stack file's `config:` mapping."""
    import yaml

    loader: Any = yaml.SafeLoader(text)  # parsed once already: bounded, one document
    try:
        top = loader.get_single_node()
    finally:
        loader.dispose()
    pairs: list[tuple[Any, Any]] = top.value if isinstance(top, yaml.MappingNode) else []
    for key, value in pairs:
        if key.value == "config" and isinstance(value, yaml.MappingNode):
            return cast(list[tuple[Any, Any]], value.value)
    return []


def _qualify(key: str) -> str:
    return key if ":" in key else f"{PROJECT}:{key}"


def _as_config_string(value: Any) -> str:
    """Config values as the Pulumi CLI hands them to a program: strings, JSON for structures."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value)
    if value is None:  # `key:` with nothing after it: unset, as an empty string is
        return ""
    return str(value)
