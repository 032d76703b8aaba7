"""Reading a dataset: the tf.data loader, Grain random access, verify, extract, reports and TFDS metadata.
Nothing here imports the write side (media, sharding)."""

__all__: list[str] = []
