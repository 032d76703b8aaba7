"""Beam's reading of DoFns, made once: the same answers as Beam's own, each call with lists and sets of its own."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import core, userstate
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from beam_jobs.jobs import dofn_specs

COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())


class _Counting(beam.DoFn):
    def process(self, item, count=beam.DoFn.StateParam(COUNT)):  # noqa: B008 - Beam's state idiom
        yield item


class _Plain(beam.DoFn):
    def process(self, item, scale=2):
        yield item * scale


def test_a_stateful_dofn_keeps_its_state_spec_and_a_plain_one_has_none():
    dofn_specs.read_once()
    dofn_specs.read_once()  # idempotent: still one layer over Beam's own
    beams_own = userstate.get_dofn_specs.reads
    assert not hasattr(beams_own, "reads") and not hasattr(core.get_function_args_defaults.reads, "reads")
    stateful, plain = _Counting(), beam.Map(lambda x: x).fn
    for _ in range(2):
        assert userstate.get_dofn_specs(stateful) == beams_own(stateful) == ({COUNT}, set())
        assert userstate.is_stateful_dofn(stateful) and not userstate.is_stateful_dofn(plain)
    first = userstate.get_dofn_specs(stateful)
    first[0].clear()
    assert userstate.get_dofn_specs(stateful) == ({COUNT}, set())


def test_a_bound_method_reads_as_its_function_less_the_first_parameter_whatever_it_is_bound_to():
    dofn_specs.read_once()
    for dofn in (_Plain(), _Plain()):
        args, defaults = core.get_function_args_defaults(dofn.process)
        assert (args, defaults) == (["item", "scale"], [2]) == core.get_function_args_defaults.reads(dofn.process)
        args.append("x")
    assert core.get_function_args_defaults(lambda a, b=3: a) == (["a", "b"], [3])


def test_a_new_dofn_at_a_freed_object_address_is_looked_up_afresh():
    dofn_specs.read_once()
    for _ in range(50):  # objects made and freed in turn often reuse an address
        assert userstate.get_dofn_specs(beam.Map(lambda x: x).fn) == (set(), set())
        assert userstate.get_dofn_specs(_Counting()) == ({COUNT}, set())


class _Borrowing(beam.DoFn):
    """A DoFn whose process is another DoFn's bound method: its specs are that method's, not its class's."""

    def __init__(self, lender: beam.DoFn):
        self.process = lender.process


def _yields_and_returns(x):
    if x:
        return [x]
    yield x


def test_specs_are_the_classs_unless_the_object_holds_bound_methods_of_its_own():
    dofn_specs.read_once()
    for _ in range(2):
        assert userstate.get_dofn_specs(_Plain()) == (set(), set())
        assert userstate.get_dofn_specs(_Borrowing(_Counting())) == ({COUNT}, set())
        assert userstate.get_dofn_specs(_Borrowing(_Plain())) == (set(), set())


def test_the_yield_and_return_check_gives_beams_answer_for_each_function():
    dofn_specs.read_once()
    check = core._check_fn_use_yield_and_return
    for _ in range(2):
        assert check(_yields_and_returns) is True is check.reads(_yields_and_returns)
        assert check(_Plain().process) is False is check.reads(_Plain().process)
        assert check(len) is False  # a builtin: as Beam reads it
