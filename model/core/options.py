"""A component's options are its constructor's keyword-only parameters: their names, types and defaults live there
and nowhere else. `schema` turns them into a dataclass that Hydra's ConfigStore holds as `<group>/<name>_schema`;
each yaml preset in conf/backbone/ and conf/pe/ lists it first in its defaults, so `python train.py backbone=gla
--cfg job` shows every option with its default, and OmegaConf checks each value's type and refuses unknown keys
while composing."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any, Optional

SIMPLE = (int, float, bool, str)


def _type(hint):
    """The hint as OmegaConf takes it: a simple type, Optional of one, else Any."""
    if hint in SIMPLE:
        return hint
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return Optional[inner] if inner in SIMPLE else Any
    return Any


def options(cls) -> dict[str, inspect.Parameter]:
    init = cls.__init__ if isinstance(cls, type) else cls
    return {n: p for n, p in inspect.signature(init).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def defaults(cls) -> dict:
    return {n: p.default for n, p in options(cls).items()}


def schema(cls, name: str) -> type:
    """The dataclass of cls's options, plus `name` (the registry key the yaml selects)."""
    init = cls.__init__ if isinstance(cls, type) else cls
    hints = typing.get_type_hints(init)
    fields = [("name", str, dataclasses.field(default=name))]
    for n, p in options(cls).items():
        d = p.default
        default = dataclasses.field(default_factory=lambda d=d: list(d)) if isinstance(d, (list, tuple)) \
            else dataclasses.field(default=d)
        fields.append((n, _type(hints.get(n, Any)) if not isinstance(d, (list, tuple)) else Any, default))
    return dataclasses.make_dataclass(f"{getattr(cls, '__name__', name)}Options", fields)


def register_schemas(group: str, registry: dict) -> None:
    """Every registered class's schema into Hydra's ConfigStore (nothing without Hydra installed)."""
    try:
        from hydra.core.config_store import ConfigStore
    except ImportError:
        return
    cs = ConfigStore.instance()
    for name, cls in registry.items():
        cs.store(group=group, name=f"{name}_schema", node=schema(cls, name))
