"""The peers benchmark's parts: the per-image work every peer does, the peers' writers, and reading their outputs."""
