"""The jobs a user runs: build (and append), reshard, the Flex Template launch; options -> config -> graph -> run."""

__all__: list[str] = []
