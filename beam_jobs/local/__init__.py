"""How Beam's in-process runner executes the heavy steps of a local build on every core: a pool of worker
processes. The graph is the same on every runner; only where a step's function runs differs."""

__all__: list[str] = []
