"""The report's page: index.html (every value escaped, a Content-Security-Policy that allows no script)
written with its charts and contact sheets beside it in a local folder."""
from __future__ import annotations

import html
import json
import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from shard_utils import storage
from shard_utils.extras import require
from shard_utils.format import topology
from shard_utils.format.manifest import Manifest, load
from shard_utils.quality import findings
from shard_utils.read.report.charts import class_chart, plain_text, rejected_chart, shard_chart, size_chart
from shard_utils.read.report.quality import QualityFindings, cluster_sample, read_findings
from shard_utils.read.report.rejects import RejectedRows, first_rejected, reason_counts
from shard_utils.read.report.sample import MAX_CLASSES, MAX_RECORDS, PER_CLASS, SplitSample, sample_split
from shard_utils.read.report.sheets import render_sheet
from shard_utils.text import printable

__all__ = ["CSP", "STYLE", "render_page", "write_report"]

CSP = "default-src 'none'; img-src 'self' data: file:; style-src 'unsafe-inline'"


def _e(value: Any) -> str:
    """Any value as escaped HTML text, control characters shown as escapes."""
    return html.escape(printable(str(value)), quote=True)


def _table(rows: Iterable[Sequence[Any]], header: Sequence[str] | None = None, cls: str = "") -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}">{head}{body}</table>'


def _summary_rows(m: Manifest) -> list[tuple[str, Any]]:
    def reasons(part: dict) -> str:
        found = reason_counts(part)
        return f"{part.get('count', 0)}" + (f" ({', '.join(f'{k} {v}' for k, v in found.items())})" if found else "")

    return [
        ("dataset", m.location), ("input", m.input), ("created", m.created), ("tool version", m.tool_version),
        ("media", m.media), ("labels", f"{len(m.labels)}: " + ", ".join(printable(x, 40) for x in m.labels[:30])
                             + (" ..." if len(m.labels) > 30 else "")),
        ("image size", "x".join(map(str, m.image_size)) if m.image_size else "varies"),
        ("TPU layout", topology.cores_x_hosts(m.num_cores, m.num_hosts)),
        ("files seen", m.files_seen), ("rejected", reasons(m.rejected)), ("skipped", reasons(m.skipped)),
    ]


def _split_rows(m: Manifest) -> list[tuple]:
    rows = []
    for name, s in m.splits.items():
        sizes = [x.num_records for x in s.shards]
        spread = str(min(sizes)) if min(sizes) == max(sizes) else f"{min(sizes)} or {max(sizes)}" if max(
            sizes) - min(sizes) == 1 else f"{min(sizes)} to {max(sizes)}"
        rows.append((name, s.num_records, len(s.shards), spread,
                     f"{s.num_bytes / 1e6:.1f}", sum(1 for v in s.class_counts.values() if v > 0)))
    return rows


STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1400px;padding:0 16px;
color:#1a1a1a}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top;word-break:break-word;max-width:640px}th{background:#f4f4f4}
img{max-width:100%;height:auto;border:1px solid #eee;margin:6px 0}.muted{color:#666}.problem{color:#b01e1e}
td.num,th.num{text-align:right}
"""


def render_page(m: Manifest, samples: Sequence[SplitSample], charts: dict[str, str], sheets: list[str],
                rejected: RejectedRows, quality: QualityFindings | None = None,
                quality_sheet: str | None = None) -> str:
    """index.html: every value escaped; images referenced by the file names given (beside the page)."""
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>tpu-shards report: {_e(m.location)}</title><style>{STYLE}</style></head><body>",
        f"<h1>tpu-shards dataset report</h1><p class=\"muted\">{_e(m.location)}</p>",
        "<h2>Summary</h2>", _table(_summary_rows(m)),
        _table(_split_rows(m), ["split", "records", "shards", "records per shard", "MB", "classes"]),
        "<h2>Records per class</h2>", _img(charts.get("classes"), "records per class per split"),
        "<h2>Shards</h2>",
        f"<p class=\"muted\">Target shard size: {_e(m.options.get('target_shard_mb', 'not recorded'))} MB; "
        "within a split, record counts differ by at most one.</p>",
        _img(charts.get("shards"), "records and MB per shard"),
        "<h2>Image sizes</h2>", _img(charts.get("sizes"), "image width and height distribution"),
        "<h2>Contact sheets</h2>",
        "<p class=\"muted\">Records sampled by seed, grouped by class; under each image its label text and "
        "source id.</p>",
    ]
    for sample, sheet in zip(samples, sheets, strict=True):
        parts.append(f"<h3>{_e(sample.split)}</h3>" + _img(sheet, f"contact sheet of split {sample.split}"))
        parts.extend(f'<p class="problem">{_e(p)}</p>' for p in sample.problems)
    parts.append("<h2>Rejected files</h2>")
    if charts.get("rejected"):
        parts.append(_img(charts["rejected"], "rejected and skipped files by reason"))
    if rejected.problem:
        parts.append(f'<p class="problem">{_e(rejected.problem)}</p>')
    if rejected.rows:
        more = f" (first {len(rejected.rows)} of {rejected.total})" if rejected.total > len(rejected.rows) else ""
        parts.append(f"<p>Listed in {_e(m.rejected.get('path', ''))}{_e(more)}:</p>")
        parts.append(_table(rejected.rows, ["source", "reason", "message"]))
    elif not rejected.problem:
        parts.append("<p>No file was rejected.</p>")
    parts += _quality_part(m, quality or QualityFindings(), quality_sheet)
    parts.append("<h2>Build options</h2>")
    parts.append(_table(sorted((k, json.dumps(v, ensure_ascii=False)) for k, v in m.options.items())))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _quality_part(m: Manifest, quality: QualityFindings, sheet: str | None) -> list[str]:
    """The quality section: counts by kind, the clusters (leaks across splits first) drawn and listed, the flags."""
    parts = ["<h2>Quality</h2>"]
    if m.quality is None:
        return parts + ["<p class=\"muted\">This build ran no quality checks (--quality-checks off, a video "
                        "dataset, or a build before them).</p>"]
    counts = reason_counts({"by_reason": m.quality.get("by_kind", {})})
    parts.append(_table(sorted(counts.items()), ["finding", "count"]) if counts
                 else "<p>No finding: no near-duplicate, no flagged image.</p>")
    if quality.problem:
        parts.append(f'<p class="problem">{_e(quality.problem)}</p>')
    if quality.bad_lines:
        parts.append(f'<p class="problem">{quality.bad_lines} lines of {_e(m.quality.get("path", ""))} are not '
                     "findings; run `tpu-shards verify`</p>")
    if quality.clusters:
        leaks = sum(findings.leaks(c) for c in quality.clusters)
        parts.append(f"<h3>Near-duplicates and label conflicts</h3><p>{leaks} of the {len(quality.clusters)} "
                     "shown span several splits (listed first: they inflate evaluation).</p>")
        parts.append(_img(sheet, "near-duplicate clusters, one per row"))
        parts.append(_table([(i, c["kind"], ", ".join(sorted(set(c["splits"]))), ", ".join(c["sources"]),
                              c.get("distance", "")) for i, c in enumerate(quality.clusters, start=1)],
                            ["#", "kind", "splits", "sources", "distance"]))
    if quality.flags:
        more = f" (first {len(quality.flags)})" if len(quality.flags) < quality.total else ""
        parts.append(f"<h3>Flagged images{_e(more)}</h3>")
        parts.append(_table([(f["kind"], f["sources"][0], f["splits"][0], f.get("value", ""), f.get("threshold", ""))
                             for f in quality.flags], ["flag", "source", "split", "value", "threshold"]))
    return parts


def _img(name: str | None, alt: str) -> str:
    if not name:
        return '<p class="muted">(no chart: nothing to show)</p>'
    return f'<img src="{html.escape(name, quote=True)}" alt="{_e(alt)}">'


def write_report(dataset: str | Manifest, out_dir: str, *, seed: int = 0, per_class: int = PER_CLASS,
                 max_classes: int = MAX_CLASSES, max_records: int = MAX_RECORDS) -> str:
    """Write index.html, the charts and a contact sheet per split into a local folder; returns the page's path."""
    require("matplotlib", needed_for="the dataset report")
    if storage.is_gcs(out_dir):
        raise storage.StorageError(f"the report is written to a local folder, not {out_dir}")
    m = dataset if isinstance(dataset, Manifest) else load(dataset)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise storage.StorageError(f"cannot create report folder {out_dir}: {exc.strerror or exc}") from None
    samples = [sample_split(m, name, seed=seed, per_class=per_class, max_classes=max_classes,
                            max_records=max_records) for name in m.splits]
    charts: dict[str, str] = {}
    with warnings.catch_warnings(), plain_text():
        warnings.simplefilter("ignore")  # glyphs missing from DejaVu Sans: shown as boxes, nothing to act on
        figures = {"classes": class_chart(m), "shards": shard_chart(m), "sizes": size_chart(samples),
                   "rejected": rejected_chart(m)}
        for name, fig in figures.items():
            if fig is not None:
                charts[name] = f"{name}.png"
                fig.savefig(os.path.join(out_dir, charts[name]))
    sheets = []
    for i, sample in enumerate(samples):  # numbered, never named after a split: names are data
        sheets.append(f"contact-{i:02d}.png")
        render_sheet(sample)[0].save(os.path.join(out_dir, sheets[-1]), optimize=True)
    quality = read_findings(m)
    quality_sheet = None
    if quality.clusters:
        quality_sheet = "near-duplicates.png"
        render_sheet(cluster_sample(m, quality.clusters), title="near-duplicates and label conflicts",
                     subtitle="one cluster per row, leaks across splits first; under each image its split and "
                              "source id", counted="images")[0].save(os.path.join(out_dir, quality_sheet),
                                                                     optimize=True)
    page = render_page(m, samples, charts, sheets, first_rejected(m), quality, quality_sheet)
    path = os.path.join(out_dir, "index.html")
    storage.write_bytes(path, page.encode("utf-8"))
    return path
