"""Beam's reading of DoFns made once: for every DoFn of the graph Beam looks up its state and timer specs about
six times (when the ParDo is made, checked, translated and run), and each look-up inspects the signature of each
of the DoFn's methods (about 30, most of them DoFn's own). That was most of the time a small build spent in Beam."""
from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

from apache_beam.transforms import core, userstate

__all__ = ["ArgsDefaults", "Specs", "read_once"]

ArgsDefaults = tuple[list[str], list[Any]]
Specs = tuple[set, set]
_params: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # function: its parameters, bound
_specs: dict[int, tuple[weakref.ref, Specs]] = {}  # id of a DoFn object: (the object, its specs)


def _params_once_per_function(read: Callable[[Any], ArgsDefaults]) -> Callable[[Any], ArgsDefaults]:
    def get_function_args_defaults(f: Any) -> ArgsDefaults:
        if not (isinstance(f, types.MethodType) and isinstance(f.__func__, types.FunctionType)):
            return read(f)  # a plain function, a callable object, a builtin: as Beam reads it
        found = _params.get(f.__func__)
        if found is None:
            found = _params[f.__func__] = read(f)
        return list(found[0]), list(found[1])  # callers get lists of their own, as from Beam

    get_function_args_defaults.reads = read  # type: ignore[attr-defined]
    return get_function_args_defaults


def _specs_once_per_dofn(look_up: Callable[[Any], Specs]) -> Callable[[Any], Specs]:
    def get_dofn_specs(dofn: Any) -> Specs:
        seen = _specs.get(id(dofn))
        if seen is not None and seen[0]() is dofn:
            specs = seen[1]
        else:
            specs = look_up(dofn)
            _remember(dofn, specs)
        return set(specs[0]), set(specs[1])  # callers get sets of their own, as from Beam

    get_dofn_specs.reads = look_up  # type: ignore[attr-defined]
    return get_dofn_specs


def _remember(dofn: Any, specs: Specs) -> None:
    key = id(dofn)
    try:
        _specs[key] = (weakref.ref(dofn, lambda _: _specs.pop(key, None)), specs)
    except TypeError:  # an object without weak references is looked up each time
        pass


def read_once() -> None:
    """Make Beam remember a bound method's parameters per function (they are its function's less the first,
    whatever object it is bound to) and a DoFn's specs per DoFn object (they come from its methods' parameters,
    which it keeps for its life): the answers Beam would give, read once. Idempotent."""
    if not hasattr(core.get_function_args_defaults, "reads"):
        core.get_function_args_defaults = _params_once_per_function(core.get_function_args_defaults)
    if not hasattr(userstate.get_dofn_specs, "reads"):
        userstate.get_dofn_specs = _specs_once_per_dofn(userstate.get_dofn_specs)
