"""Beam's DoFn spec look-up, made once per DoFn object: the same answers as Beam's own, each call its own sets."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import userstate
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from beam_jobs.jobs import dofn_specs

COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())


class _Counting(beam.DoFn):
    def process(self, item, count=beam.DoFn.StateParam(COUNT)):
        yield item


def test_a_stateful_dofn_keeps_its_state_spec_and_a_plain_one_has_none():
    dofn_specs.look_up_once()
    dofn_specs.look_up_once()  # idempotent: still one layer over Beam's look-up
    beams_own = userstate.get_dofn_specs.looks_up
    assert not hasattr(beams_own, "looks_up")
    stateful, plain = _Counting(), beam.Map(lambda x: x).fn
    for _ in range(2):
        assert userstate.get_dofn_specs(stateful) == beams_own(stateful) == ({COUNT}, set())
        assert userstate.is_stateful_dofn(stateful) and not userstate.is_stateful_dofn(plain)
    first = userstate.get_dofn_specs(stateful)
    first[0].clear()
    assert userstate.get_dofn_specs(stateful) == ({COUNT}, set())


def test_a_new_dofn_at_a_freed_object_address_is_looked_up_afresh():
    dofn_specs.look_up_once()
    for _ in range(50):  # objects made and freed in turn often reuse an address
        assert userstate.get_dofn_specs(beam.Map(lambda x: x).fn) == (set(), set())
        assert userstate.get_dofn_specs(_Counting()) == ({COUNT}, set())
