"""JAX on 8 CPU devices, as many as a TPU v3-8 or v5e-8 has cores, for the tests that import JAX."""
from __future__ import annotations

DEVICES = 8


def eight_cpu_devices():
    """The jax module, its CPU split into 8 devices; set before anything asks JAX for its devices (a backend made
    earlier in this process keeps its count, which is then checked)."""
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", DEVICES)
    except RuntimeError:  # a backend already exists: it must have been made with 8 devices
        pass
    assert jax.device_count() == DEVICES, f"JAX has {jax.device_count()} devices, the tests need {DEVICES}"
    return jax
