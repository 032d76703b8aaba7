"""`tpu-shards inspect --report DIR`: see a dataset. Contact sheets of sampled records, charts, one HTML page.

Records are read with the project's own TFRecord reader (no TensorFlow). Everything shown comes from the
manifest and the records, so every text is treated as hostile: drawn through `shard_utils.text.printable`, never parsed
as math by matplotlib, and HTML-escaped on a page whose Content-Security-Policy allows no script at all.
Needs the `report` extra (matplotlib); charts are drawn on Agg canvases, never through pyplot's global state.
"""
from __future__ import annotations

from shard_utils.read.report.charts import MANY_CLASSES, as_image, class_chart, rejected_chart, shard_chart, size_chart
from shard_utils.read.report.page import CSP, STYLE, render_page, write_report
from shard_utils.read.report.rejects import FIRST_REJECTED, RejectedRows, first_rejected
from shard_utils.read.report.sample import (
                                            MAX_CLASSES,
                                            MAX_RECORDS,
                                            PER_CLASS,
                                            SplitSample,
                                            Tile,
                                            sample_split,
                                            shown_classes,
)
from shard_utils.read.report.sheets import TILE, Placed, contact_sheet, render_sheet, thumbnail

__all__ = ["PER_CLASS", "MAX_CLASSES", "MAX_RECORDS", "FIRST_REJECTED", "TILE", "MANY_CLASSES", "CSP", "STYLE",
           "Tile", "SplitSample", "shown_classes", "sample_split", "thumbnail", "Placed", "render_sheet",
           "contact_sheet", "class_chart", "shard_chart", "size_chart", "rejected_chart", "as_image",
           "RejectedRows", "first_rejected", "render_page", "write_report"]
