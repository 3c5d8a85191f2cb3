"""``watch --job URL|HOST:PORT|PATH``: a running job's own runtime state, read from the page it publishes.

A job publishes its metrics with ``MODEL_CONCURRENCY_EXPORT`` (or ``run --export``; export.py). This reads that
page with prometheus_client's parser and shows, per model, the job's target, bounds, calls in flight, saturation,
whether its last poll worked and what limited the last decision (``model_concurrency_limited_by``, when the job's
version exports it). Nothing is polled here: the numbers are the job's, not a controller of this process's.

A file outlives its job: the last page stays, in-flight count and all, and reads like a job still running. A
running job rewrites it every ``export.FILE_EVERY_S``, so a file not rewritten for :data:`STALE_AFTER_S` says
the job has ended or stopped, and the table says so. (A job publishing on a port takes its page with it: reading
it fails instead.)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from model_concurrency.export import FILE_EVERY_S, parse_address

__all__ = ["JOB_COLUMNS", "STALE_AFTER_S", "job_age_s", "job_page", "job_rows", "job_url", "render_job_table"]

# Ten export periods: a writer thread delayed by a busy machine misses a few periods, not ten.
STALE_AFTER_S = 10 * FILE_EVERY_S

PREFIX = "model_concurrency_"
# (column, field) in display order; fields are the metric names without the prefix.
JOB_COLUMNS = (
    ("model", "model"),
    ("target", "target"),
    ("floor", "floor"),
    ("ceiling", "ceiling"),
    ("in-flight", "inflight"),
    ("saturated", "saturated"),
    ("metrics", "metrics_ok"),
    ("limited by", "limited_by"),
    ("polls ok/failed", "polls"),
)


def job_url(where: str) -> str | None:
    """The URL to read for ``where``: as given when http(s), ``http://HOST:PORT/metrics`` for an address; None
    for a file."""
    if where.startswith(("http://", "https://")):
        return where
    address = parse_address(where)
    if address is None:
        return None
    host = f"[{address[0]}]" if ":" in address[0] else address[0]
    return f"http://{host}:{address[1]}/metrics"


def job_page(where: str, timeout_s: float = 5.0) -> str:
    """The job's metrics page, from its URL or its file."""
    url = job_url(where)
    if url is None:
        path = Path(where).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            reason = exc.strerror or exc
            raise ValueError(f"--job {where}: cannot read: {reason} (is the job exporting there?)") from None
    import httpx

    response = httpx.get(url, timeout=timeout_s)
    response.raise_for_status()
    return response.text


def job_age_s(where: str) -> float | None:
    """Seconds since the job's export file was last rewritten; None for a page served over HTTP (or no file)."""
    if job_url(where) is not None:
        return None
    try:
        return max(0.0, time.time() - Path(where).expanduser().stat().st_mtime)
    except OSError:
        return None


def stale_note(age_s: float | None) -> str | None:
    """The line that says the page is a finished job's, when its file has not been rewritten for a while."""
    if age_s is None or age_s <= STALE_AFTER_S:
        return None
    return (
        f"export not updated for {age_s:.0f} s: the job has ended or stopped "
        f"(a running job rewrites it every {FILE_EVERY_S:g} s); the figures are its last"
    )


def job_rows(text: str) -> list[dict[str, Any]]:
    """One row per model on the page: the job's gauges by field name, ``limited_by`` the reason whose gauge is 1."""
    rows: dict[str, dict[str, Any]] = {}
    polls: dict[str, dict[str, float]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError, IndexError... on garbage
        raise ValueError(f"the job's page is not a Prometheus page: {type(exc).__name__}: {exc}") from None
    for family in families:
        if not family.name.startswith(PREFIX):
            continue
        field = family.name.removeprefix(PREFIX)
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is None:
                continue
            row = rows.setdefault(model, {"model": model})
            if field == "polls" and sample.name.endswith("_total"):
                polls.setdefault(model, {})[sample.labels.get("outcome", "")] = sample.value
            elif field == "limited_by":
                if sample.value >= 1:
                    row["limited_by"] = sample.labels.get("reason", "?")
            elif not sample.name.endswith("_created"):
                row[field] = sample.value
    for model, row in rows.items():
        for key in ("target", "floor", "ceiling", "inflight"):
            if key in row:
                row[key] = int(row[key])
        if "saturated" in row:
            row["saturated"] = bool(row["saturated"])
        if "metrics_ok" in row:
            row["metrics_ok"] = "ok" if row["metrics_ok"] else "failed"
        counts = polls.get(model)
        if counts:
            row["polls"] = f"{int(counts.get('ok', 0))}/{int(counts.get('failed', 0))}"
    return [rows[name] for name in sorted(rows)]


def render_job_table(rows: list[dict[str, Any]], where: str, age_s: float | None = None) -> Any:
    """The rich table ``watch --job`` shows (a function of the page and its file's age, ``job_age_s``, so a test
    renders it without a terminal)."""
    from rich.table import Table

    from model_concurrency.cli._output import fmt

    title = f"watch --job {where}: the job's own state — {time.strftime('%H:%M:%S')}"
    table = Table(title=title)
    for column, _ in JOB_COLUMNS:
        table.add_column(column, justify="left" if column in ("model", "metrics", "limited by") else "right")
    notes = [stale_note(age_s)]
    if not rows:
        notes.append("no model on the page yet (the job publishes after its first poll)")
    caption = "; ".join(note for note in notes if note)
    if caption:
        table.caption = caption
    for row in rows:
        table.add_row(*(fmt(row.get(key)) for _, key in JOB_COLUMNS))
    return table
