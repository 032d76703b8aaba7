"""Beam's look-up of a DoFn's state and timer specs, made once per DoFn object: Beam repeats it about six times
for each DoFn of the graph (when the ParDo is made, checked, translated and run), and each look-up inspects the
signature of every method the DoFn has (about 30), which is most of the time a small build spends in Beam."""
from __future__ import annotations

import weakref
from typing import Any, Callable

from apache_beam.transforms import userstate

Specs = tuple[set, set]
_found: dict[int, tuple[weakref.ref, Specs]] = {}


def _once_per_dofn(look_up: Callable[[Any], Specs]) -> Callable[[Any], Specs]:
    def get_dofn_specs(dofn: Any) -> Specs:
        seen = _found.get(id(dofn))
        if seen is not None and seen[0]() is dofn:
            specs = seen[1]
        else:
            specs = look_up(dofn)
            _remember(dofn, specs)
        return set(specs[0]), set(specs[1])  # callers get sets of their own, as from Beam

    get_dofn_specs.looks_up = look_up  # type: ignore[attr-defined]
    return get_dofn_specs


def _remember(dofn: Any, specs: Specs) -> None:
    key = id(dofn)
    try:
        _found[key] = (weakref.ref(dofn, lambda _: _found.pop(key, None)), specs)
    except TypeError:  # an object without weak references is looked up each time
        pass


def look_up_once() -> None:
    """Make Beam's `get_dofn_specs` remember its answer per DoFn object (idempotent). The specs come from the
    methods' parameters, which a DoFn object keeps for its life, so a remembered answer is the one Beam would give."""
    if not hasattr(userstate.get_dofn_specs, "looks_up"):
        userstate.get_dofn_specs = _once_per_dofn(userstate.get_dofn_specs)
