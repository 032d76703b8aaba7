"""Beam's reading of DoFns made once: for every DoFn of the graph Beam looks up its state and timer specs about
six times (when the ParDo is made, checked, translated and run), and each look-up inspects the signature of each
of the DoFn's methods (about 30, most of them DoFn's own). That was most of the time a small build spent in Beam.
The runner looks them up again on its own copies of the DoFns, so specs are kept per class where the class decides
them; and each ParDo's check that its process method does not both yield and return (which reads and tokenizes its
source) is kept per function: a small build has 167 ParDos of 7 DoFn classes and 28 functions."""
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
_class_specs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DoFn class: the specs its objects have
_yields_and_returns: dict[types.CodeType, bool] = {}  # a process method's code: whether it both yields and returns


def _params_once_per_function(read: Callable[[Any], ArgsDefaults]) -> Callable[[Any], ArgsDefaults]:
    def get_function_args_defaults(f: Any) -> ArgsDefaults:
        if not (isinstance(f, types.MethodType) and isinstance(f.__func__, types.FunctionType)):
            return read(f)  # a plain function, a callable object, a builtin: as Beam reads it
        found = _params.get(f.__func__)
        if found is None:
            found = _params[f.__func__] = read(f)
        return list(found[0]), list(found[1])  # callers get lists of their own, as from Beam

    get_function_args_defaults.reads = read  # type: ignore[attr-defined]  # Beam's own, kept on the wrapper
    return get_function_args_defaults


def _decided_by_class(dofn: Any) -> bool:
    """Whether a DoFn's specs are its class's: Beam reads them from the parameters of the DoFn's bound methods,
    which are its class's functions unless the object holds bound methods of its own."""
    attrs = getattr(dofn, "__dict__", None)
    return (attrs is not None and not hasattr(type(dofn), "__slots__")
            and not any(isinstance(value, types.MethodType) for value in attrs.values()))


def _specs_once_per_dofn(look_up: Callable[[Any], Specs]) -> Callable[[Any], Specs]:
    def get_dofn_specs(dofn: Any) -> Specs:
        seen = _specs.get(id(dofn))
        if seen is not None and seen[0]() is dofn:
            specs = seen[1]
        elif _decided_by_class(dofn):
            kept: Specs | None = _class_specs.get(type(dofn))
            specs = kept if kept is not None else _class_specs.setdefault(type(dofn), look_up(dofn))
        else:
            specs = look_up(dofn)
            _remember(dofn, specs)
        return set(specs[0]), set(specs[1])  # callers get sets of their own, as from Beam

    get_dofn_specs.reads = look_up  # type: ignore[attr-defined]  # Beam's own, kept on the wrapper
    return get_dofn_specs


def _yield_check_once_per_function(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def _check_fn_use_yield_and_return(fn: Any) -> bool:
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        if not isinstance(code, types.CodeType):
            return check(fn)  # a builtin, a callable object: as Beam reads it
        found = _yields_and_returns.get(code)
        if found is None:
            found = _yields_and_returns[code] = check(fn)
        return found

    _check_fn_use_yield_and_return.reads = check  # type: ignore[attr-defined]
    return _check_fn_use_yield_and_return


def _remember(dofn: Any, specs: Specs) -> None:
    key = id(dofn)
    try:
        _specs[key] = (weakref.ref(dofn, lambda _: _specs.pop(key, None)), specs)
    except TypeError:  # an object without weak references is looked up each time
        pass


def read_once() -> None:
    """Make Beam remember a bound method's parameters per function (they are its function's less the first,
    whatever object it is bound to), a DoFn's specs per DoFn class, or per object where it holds bound methods of
    its own (they come from its methods' parameters, which it keeps for its life), and whether a function both
    yields and returns per function: the answers Beam would give, read once. Idempotent."""
    # Beam's functions replaced by wrappers taking the same one argument (a Callable type cannot name it: ignored)
    if not hasattr(core.get_function_args_defaults, "reads"):
        core.get_function_args_defaults = _params_once_per_function(  # type: ignore[assignment]
            core.get_function_args_defaults)
    if not hasattr(core._check_fn_use_yield_and_return, "reads"):
        core._check_fn_use_yield_and_return = _yield_check_once_per_function(core._check_fn_use_yield_and_return)
    if not hasattr(userstate.get_dofn_specs, "reads"):
        userstate.get_dofn_specs = _specs_once_per_dofn(userstate.get_dofn_specs)  # type: ignore[assignment]
