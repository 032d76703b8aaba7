"""Cloud TPU slices by name: `v5e-16` is 4 hosts of 4 chips. No Beam, no TensorFlow.

The build balances shards over `devices per host x hosts` (what TensorFlow and JAX see as devices: a
TensorCore on v2/v3, a chip on v4/v5p with megacore, a chip on v5e/v6e), and the loader compares a
dataset's slice with the one it runs on. Names follow the accelerator types of `gcloud compute tpus`:
v2/v3/v4/v5p count TensorCores (two per chip), v5e/v6e count chips; `v5litepod-N` is `v5e-N`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from shard_utils.errors import TpuShardsError

__all__ = ["TABLE", "Topology", "TopologyError", "cores_x_hosts", "lookup", "shard_division"]


class TopologyError(ValueError, TpuShardsError):
    """An accelerator type this table does not know; the message lists the ones it does."""


@dataclass(frozen=True)
class Topology:
    """A TPU slice: `hosts` VMs, each with `devices_per_host` devices (one input pipeline per host)."""

    name: str
    hosts: int
    devices_per_host: int

    @property
    def devices(self) -> int:
        return self.hosts * self.devices_per_host


def cores_x_hosts(cores: int, hosts: int) -> str:
    """A layout in words, singular where it is one: "8 cores x 1 host", "4 cores x 2 hosts"."""
    return f"{cores} {'core' if cores == 1 else 'cores'} x {hosts} {'host' if hosts == 1 else 'hosts'}"


def _family(generation: str, sizes, devices_per_host, hosts) -> dict[str, tuple[int, int]]:
    return {f"{generation}-{n}": (hosts(n), devices_per_host(n)) for n in sizes}


# Accelerator type -> (hosts, devices per host).
# v2/v3: 8 TensorCores (4 chips) per host, each core a device; the slices Cloud TPU offers.
# v4/v5p: 4 chips (8 TensorCores) per host, one megacore device per chip; slices come in many 3D shapes, so any
#   multiple of 8 TensorCores names one (v4 up to 4096, v5p up to 12288).
# v5e/v6e: 1, 4 or 8 chips on one host, or 4 chips on each of 4 .. 64 hosts.
_SMALL_OR_PODS = (1, 4, 8, 16, 32, 64, 128, 256)
TABLE: dict[str, tuple[int, int]] = {
    **_family("v2", (8, 32, 128, 256, 512), lambda n: 8, lambda n: n // 8),
    **_family("v3", (8, 32, 64, 128, 256, 512, 1024, 2048), lambda n: 8, lambda n: n // 8),
    **_family("v4", range(8, 4097, 8), lambda n: 4, lambda n: n // 8),
    **_family("v5p", range(8, 12289, 8), lambda n: 4, lambda n: n // 8),
    **_family("v5e", _SMALL_OR_PODS, lambda n: min(n, 8) if n <= 8 else 4, lambda n: 1 if n <= 8 else n // 4),
    **_family("v6e", _SMALL_OR_PODS, lambda n: min(n, 8) if n <= 8 else 4, lambda n: 1 if n <= 8 else n // 4),
}
_ALIASES = {"v5litepod": "v5e"}
_KNOWN = ("v2-8 .. v2-512, v3-8 .. v3-2048, v4-N and v5p-N (N a multiple of 8 TensorCores), v5e-N and v6e-N "
          "(N chips: 1, 4, 8, 16, 32, 64, 128 or 256)")


def lookup(name: str) -> Topology:
    """The slice an accelerator type names (case-insensitive), or a TopologyError listing the known ones."""
    text = str(name).strip().lower()
    match = re.fullmatch(r"(v\d+[a-z]*|v5litepod)-(\d+)", text)
    if not match:
        raise TopologyError(f"unknown TPU type {name!r}: give an accelerator type such as v4-32 or v5e-16 "
                            f"(known: {_KNOWN})")
    generation = _ALIASES.get(match.group(1), match.group(1))
    canonical = f"{generation}-{int(match.group(2))}"
    if canonical not in TABLE:
        sizes = [k for k in TABLE if k.startswith(generation + "-")]
        shown = (f"{generation} slices are {', '.join(sizes)}" if 0 < len(sizes) <= 12 else
                 f"{generation}-N takes N a multiple of 8 from {sizes[0].split('-')[1]} to {sizes[-1].split('-')[1]}"
                 if sizes else f"known: {_KNOWN}")
        raise TopologyError(f"unknown TPU type {name!r}: {shown}")
    hosts, per_host = TABLE[canonical]
    return Topology(canonical, hosts, per_host)


def shard_division(num_shards: int, num_pipelines: int) -> str | None:
    """None when shard i -> pipeline i % n gives every pipeline as many shards; else how many each reads."""
    if num_pipelines < 1 or num_shards % num_pipelines == 0 or num_shards < num_pipelines:
        return None
    more, fewer = num_shards % num_pipelines, num_shards // num_pipelines

    def who(first: int, last: int, count: int) -> str:
        return f"pipeline {first} reads {count}" if first == last else f"pipelines {first}-{last} read {count}"

    return f"{who(0, more - 1, fewer + 1)} shards, {who(more, num_pipelines - 1, fewer)}"
