"""Dataclass configs on the command line: one ``--flag`` per field.

Every ``keras-trm train-*`` subcommand (and ``recipes/*.py``) builds its
flags from its config dataclass with ``add_config_flags`` and reads them
back with ``config_from_args``, so a new field is a new flag everywhere,
parsed by the same rules:

* ``--some-field VALUE`` for ``some_field`` (underscores become dashes);
* ``bool``: ``--flag true|false`` (also ``1/0``, ``yes/no``, ``on/off``);
  a bare ``--flag`` means true (``parse_bool``, also used by ``serve``);
* ``tuple``: a comma-separated list, items of the default's item type;
* ``int``/``float``/``str``: that type; a field whose default is None
  takes the field's annotated type (``str`` if it has none).
"""

import argparse
import dataclasses

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(text):
    """``"true"``/``"false"`` (and 1/0, yes/no, on/off, any case) -> bool.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse turns it into a
            usage error naming the flag).

    Example:

    >>> parse_bool("True"), parse_bool("off")
    (True, False)
    """
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _tuple_parser(item_type):
    def parse(text):
        try:
            return tuple(item_type(x.strip()) for x in str(text).split(",")
                         if x.strip())
        except ValueError as err:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {item_type.__name__}, "
                f"got {text!r}") from err
    parse.__name__ = f"list of {item_type.__name__}"
    return parse


def _field_type(field):
    annotation = field.type
    if isinstance(annotation, str):  # from __future__ import annotations
        annotation = {"int": int, "float": float, "str": str, "bool": bool,
                      "tuple": tuple}.get(annotation, str)
    return annotation if isinstance(annotation, type) else str


def add_bool_flag(parser, *names, default=False, help=None, **kwargs):
    """A boolean flag under the package's one rule: ``--flag true|false``,
    a bare ``--flag`` meaning true."""
    return parser.add_argument(*names, type=parse_bool, nargs="?", const=True,
                               default=default, metavar="{true,false}",
                               help=help, **kwargs)


def add_config_flags(parser, config_cls):
    """Adds one flag per field of the dataclass ``config_cls`` to
    ``parser`` (rules in the module docstring); returns the parser.

    Raises:
        TypeError: ``config_cls`` is not a dataclass.

    Example:

    >>> import argparse, dataclasses
    >>> @dataclasses.dataclass
    ... class Config:
    ...     epochs: int = 2
    ...     sizes: tuple = (8, 16)
    ...     jit: bool = True
    >>> parser = add_config_flags(argparse.ArgumentParser(), Config)
    >>> config_from_args(Config, parser.parse_args(
    ...     ["--epochs", "3", "--sizes", "4,5", "--jit", "false"]))
    Config(epochs=3, sizes=(4, 5), jit=False)
    """
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(
            f"`config_cls` must be a dataclass, got {config_cls!r}")
    for field in dataclasses.fields(config_cls):
        flag = "--" + field.name.replace("_", "-")
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = None
        if isinstance(default, bool) or _field_type(field) is bool:
            add_bool_flag(parser, flag, dest=field.name, default=default,
                          help=f"(default: {str(default).lower()})")
            continue
        if isinstance(default, tuple):
            kind = _tuple_parser(type(default[0]) if default else str)
            shown = ",".join(str(x) for x in default)
        elif default is None:
            kind, shown = _field_type(field), None
        else:
            kind, shown = type(default), default
        parser.add_argument(flag, dest=field.name, type=kind, default=default,
                            help=f"(default: {shown})")
    return parser


def config_from_args(config_cls, args):
    """The ``config_cls`` instance of parsed ``args`` (``add_config_flags``)."""
    return config_cls(**{f.name: getattr(args, f.name)
                         for f in dataclasses.fields(config_cls)})
