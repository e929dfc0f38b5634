"""Reading and describing a closed, typed config tree (``TrainConfig``, ``SFTConfig``): the raw
mapping of a YAML file with ``--set key.sub=value`` overrides, unknown keys refused with the nearest
valid one, a section's own defaults kept under the user's keys, and ``--help-config``'s listing of
every key with its default and docstring; on ``--resume``, the run's recorded ``config.yaml``
compared with the new config (``check_unchanged``: only ``RESUMABLE`` keys may change). Generic over
pydantic models; the trees live in ``config.py`` and ``recipes/sft_config.py``."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import yaml
from pydantic import BaseModel

from ..errors import ConfigError


def read_config_data(path: str | Path | None, overrides: Sequence[str], values: dict[str, Any]) -> dict[str, Any]:
    """The raw mapping of a YAML config file, then ``key.sub=value`` overrides, then keyword values;
    a file or value that does not parse is a one-line ``ConfigError`` naming where."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {_yaml_problem(exc)}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping, got {type(loaded).__name__}")
        data = loaded
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: the value is not valid YAML: {_yaml_problem(exc)}") from None
        _set_path(data, key.split("."), value)
    data.update(values)
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what is wrong and where (1-based line and column)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def with_section_defaults(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the keys a section's own default sets (``rollout: RolloutConfig(max_turns=4)``)
    under the user's keys of that section: setting ``rollout.max_new_tokens`` keeps ``max_turns`` 4,
    as ``--help-config`` shows it, instead of the class's 8."""
    out = dict(data)
    for name, field in model.model_fields.items():
        if isinstance(field.default, BaseModel) and isinstance(data.get(name), dict):
            out[name] = {**field.default.model_dump(include=field.default.model_fields_set), **data[name]}
    return out


def _set_path(data: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        data = data.setdefault(key, {})
        if not isinstance(data, dict):
            raise ConfigError(f"cannot set {'.'.join(keys)}: {key!r} is not a section")
    data[keys[-1]] = value


def did_you_mean(name: str, valid: Iterable[str], spell: Callable[[str], str] = repr) -> str:
    """``"; did you mean 'NEAREST'?"`` for the valid name nearest ``name``, or ``""`` when none is
    near (config keys, command-line flags, a module's attributes)."""
    near = difflib.get_close_matches(name, list(valid), n=1)
    return f"; did you mean {spell(near[0])}?" if near else ""


def check_keys(model: type[BaseModel], data: Any, where: tuple[str, ...]) -> None:
    """Unknown keys, with the nearest valid one, before pydantic's less helpful message."""
    if not isinstance(data, dict):
        return
    fields = model.model_fields
    for key, value in data.items():
        if key not in fields:
            hint = did_you_mean(str(key), fields, lambda near: repr(".".join((*where, near))))
            valid = ", ".join(fields)
            raise ConfigError(f"unknown config key {'.'.join((*where, str(key)))!r}{hint} (valid here: {valid})")
        for inner in _section_types(fields[key].annotation)[:1]:
            for item in value if isinstance(value, list) else [value]:
                check_keys(inner, item, (*where, key))


def _section_types(annotation: Any) -> list[type[BaseModel]]:
    """The sections a field holds: its own type, a list's item type, or each kind of a tagged union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [kind for arg in typing.get_args(annotation) for kind in _section_types(arg)]


def describe_config(model: type[BaseModel]) -> str:
    """Every key with its default and documentation, one per line (``--help-config``): the
    top-level keys under their own heading, then each section under its heading, the defaults
    those of the section's own default (``rollout.max_turns = 4`` in training). A list's items
    are described once (``environments[].name``), per kind when they come in kinds (``sources``);
    ``--set`` reaches them only as a whole list."""
    return "\n".join(_describe(model, "", None, "top-level keys:"))


def _describe(model: type[BaseModel], prefix: str, defaults: BaseModel | None, heading: str) -> list[str]:
    """``heading``, the keys of ``model`` (values from ``defaults`` when given), then its sections."""
    lines, sections = [heading], []
    for name, field in model.model_fields.items():
        key, default = prefix + name, getattr(defaults, name) if defaults is not None else field.default
        kinds = _section_types(field.annotation)
        if kinds and typing.get_origin(field.annotation) is list:
            shown = [item.model_dump(exclude_unset=True) for item in default or ()]
            each = "has a kind and that kind's keys" if len(kinds) > 1 else "has these keys"
            doc = " ".join((field.description or "").split())
            sections.append(
                [
                    f"{key}: a list (default {shown}); each item {each}; --set {key}=[{{...}}] sets it whole"
                    + (f"  # {doc}" if doc else "")
                ]
            )
            sections += [_describe(kind, f"{key}[].", None, _item_heading(kind, key)) for kind in kinds]
        elif kinds:
            sections.append(
                _describe(kinds[0], f"{key}.", default if isinstance(default, BaseModel) else None, f"{key}:")
            )
        elif not (name == "kind" and typing.get_origin(field.annotation) is Literal):  # in the item's heading
            doc = " ".join((field.description or "").split())
            value = "(required)" if field.is_required() else repr(default)
            lines.append(f"  {key} = {value}" + (f"  # {doc}" if doc else ""))
    return [*lines, *(line for section in sections for line in section)]


def _item_heading(kind: type[BaseModel], key: str) -> str:
    tag = kind.model_fields.get("kind")
    if tag is None or typing.get_origin(tag.annotation) is not Literal:
        return f"{key}[] items:"
    return f"{key}[] items of kind {typing.get_args(tag.annotation)[0]!r}:"


# -- resuming -------------------------------------------------------------------------------------

#: What a resumed run may change in the config it recorded: how far it trains (``steps``, SFT's
#: ``max_steps``: a finished run is extended by raising them), where the run directory now is
#: (``out``), and how it runs and reports. Anything else (the batch, the model, the data, the
#: algorithm) would continue one run as another.
RESUMABLE = (
    "out",
    "steps",
    "max_steps",
    "checkpoint_every",
    "keep_checkpoints",
    "save_trajectories",
    "report_to",
    "eval_every",
    "executor",
    "ray",
    "model.device",
    "model.base_url",
    "model.served_model_name",
)


def changed_keys(recorded: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two config mappings (a list is one value), each
    as ``key OLD -> NEW``. A key only one side has is left out: a field that another version of
    rollforge added or removed, not a change the user made."""
    out = []
    for key in [k for k in recorded if k in current]:
        old, new = recorded[key], current[key]
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            out += changed_keys(old, new, f"{prefix}{key}.")
        elif old != new:
            out.append(f"{prefix}{key} {_short(old)} -> {_short(new)}")
    return out


def check_unchanged(out: Path, config: BaseModel) -> None:
    """Refuse to resume the run in ``out`` with a config that differs from its ``config.yaml`` in
    any key but ``RESUMABLE``'s: one line naming each changed key with both values. Without a
    recorded config there is nothing to compare."""
    recorded_file = Path(out) / "config.yaml"
    if not recorded_file.is_file():
        return
    recorded = yaml.safe_load(recorded_file.read_text()) or {}
    current = config.model_dump(mode="json")
    changed = [
        change
        for change in changed_keys(recorded, current)
        if not any(change == key or change.startswith((f"{key} ", f"{key}.")) for key in RESUMABLE)
    ]
    if changed:
        raise ConfigError(
            f"--resume with a changed config: {', '.join(changed)} ({str(recorded_file)!r} records the run's); a "
            f"resumed run may change only {', '.join(RESUMABLE)}: set the others back, or start over with "
            "--overwrite or another out"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
