"""Run configs declared once: a dataclass field carries its type, default, help and choices, and the
CLI flags, the config built from parsed flags and the config recorded in receipts all come from it.

    @dataclass
    class MyConfig:
        output: str = option(help="run directory")                  # no default: a required flag
        steps: int = option(400, help="optimizer steps")            # --steps, help "... (default 400)"
        mode: str = option("fast", help="how", choices=("fast", "exact"))
        progress: bool = option(True, help="progress bar")          # --no-progress

    add_arguments(parser, MyConfig); config = from_arguments(MyConfig, args); config_record(config)
    given_options(args)   # the fields whose flag was on the command line (a resume takes the rest from the run)

Adding a knob is one edit: a field here is a flag, a config value and a receipt entry (under
`run_config`; `summary=True` repeats it at the receipt's top level, `summary_record`). A knob added
after plans were recorded whose default does what those plans did is `neutral=True`: a plan's
identity (`identity_record`) leaves it out while it is at that default, so the plan's sha256 in the
ledger stays the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import MISSING

from glm53_flash.core.argtypes import parse_int_list

_NO_FLAG = "no_flag"
_GIVEN = "_given_options"  # the parsed namespace's set of fields whose flag was on the command line


def _recording(action_class):
    """`action_class` that also notes its field in the namespace's given set (`given_options`)."""

    class Recording(action_class):
        def __call__(self, parser, namespace, values, option_string=None):
            setattr(namespace, _GIVEN, getattr(namespace, _GIVEN, frozenset()) | {self.dest})
            super().__call__(parser, namespace, values, option_string)

    return Recording


_STORE, _STORE_TRUE, _STORE_FALSE = (_recording(argparse._StoreAction), _recording(argparse._StoreTrueAction),
                                     _recording(argparse._StoreFalseAction))


def option(default=MISSING, *, help: str, choices=None, parse=None, metavar: str | None = None,
           default_text: str | None = None, flag: bool = True, factory=None, neutral: bool = False,
           summary: bool = False):
    """A dataclass field with its CLI description. `parse` converts the flag's text (default: the
    field's type); `default_text` describes a default that is computed (e.g. "100,200,400 within
    --steps"); flag=False keeps a field out of the CLI (a documented exception such as a dict of
    overrides that has flags of its own); neutral=True: see the module's docstring; summary=True: the
    value is also a top-level field of the run's receipt (`summary_record`)."""
    metadata = {"help": help, "choices": choices, "parse": parse, "metavar": metavar,
                "default_text": default_text, _NO_FLAG: not flag, "neutral": neutral, "summary": summary}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag_name(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def cli_fields(config_type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(config_type) if "help" in f.metadata and not f.metadata[_NO_FLAG]]


def _base_type(annotation):
    """int for `int`, `int | None` and `"int | None"`; tuple for tuples; the type otherwise."""
    if isinstance(annotation, str):
        text = annotation.replace(" ", "").split("|")
        names = [part for part in text if part != "None"]
        mapping = {"int": int, "float": float, "str": str, "bool": bool}
        head = names[0].split("[")[0] if names else "str"
        return tuple if head == "tuple" else mapping.get(head, str)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(members[0])
    if origin is tuple or annotation is tuple:
        return tuple
    return annotation


def _describe(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) if value else "none"
    if value is None:
        return "none"
    if value == "":
        return "''"
    return str(value)


def _int_list_flag(text: str) -> tuple[int, ...]:
    """The argparse type of a tuple[int, ...] field ('' is the empty tuple)."""
    try:
        return parse_int_list(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser, config_type, defaults: dict | None = None) -> None:
    """One flag per field of `config_type` (`defaults` overrides a field's default for this command)."""
    defaults = defaults or {}
    for field in cli_fields(config_type):
        meta = field.metadata
        kind = _base_type(field.type)
        has_default = field.default is not MISSING or field.default_factory is not MISSING
        default = defaults.get(field.name, field.default if field.default is not MISSING else (
            field.default_factory() if field.default_factory is not MISSING else None))
        shown = meta["default_text"] or _describe(default)
        help_text = meta["help"] + ("" if not has_default else f" (default: {shown})")
        if kind is bool:
            if default:
                parser.add_argument("--no-" + field.name.replace("_", "-"), dest=field.name, action=_STORE_FALSE,
                                    default=True, help=f"turn off: {meta['help']}")
            else:
                parser.add_argument(flag_name(field), dest=field.name, action=_STORE_TRUE, default=False,
                                    help=meta["help"])
            continue
        parse = meta["parse"] or (_int_list_flag if kind is tuple else kind)
        parser.add_argument(flag_name(field), dest=field.name, action=_STORE, type=parse, choices=meta["choices"],
                            default=default, required=not has_default, metavar=meta["metavar"], help=help_text)


def given_options(args: argparse.Namespace) -> frozenset[str]:
    """The fields (added by `add_arguments`) whose flag was on the command line, whatever its value."""
    return getattr(args, _GIVEN, frozenset())


def from_arguments(config_type, args: argparse.Namespace, **values):
    """The config whose flagged fields come from `args`; `values` sets the others."""
    for field in cli_fields(config_type):
        values.setdefault(field.name, getattr(args, field.name))
    return config_type(**values)


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def config_record(config) -> dict:
    """Every field of a run config, JSON-ready (tuples as lists), for receipts."""
    return {field.name: _plain(getattr(config, field.name)) for field in dataclasses.fields(config)}


def summary_record(config) -> dict:
    """The fields declared with summary=True, JSON-ready: what a receipt repeats at its top level."""
    return {field.name: _plain(getattr(config, field.name)) for field in dataclasses.fields(config)
            if field.metadata.get("summary")}


def identity_record(config) -> dict:
    """`config_record` without the neutral fields that are at their default: what a plan's sha256 covers."""
    return {field.name: _plain(getattr(config, field.name)) for field in dataclasses.fields(config)
            if not (field.metadata.get("neutral") and getattr(config, field.name) == field.default)}
