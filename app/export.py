"""Export a run: its metrics as CSV or TensorBoard event files, a chart as PNG or SVG.

The metrics come from the run folder's metrics.jsonl (docs/RUN_FOLDER.md), so a run can be
exported whether or not a window watched it. A partly written last line (a run still going) is
left out. Values that are null, or not finite, are treated as not measured: an empty CSV cell,
no TensorBoard point.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyqtgraph as pg

from app.metric_store import RANK_FIELDS
from ddp_engine.common.run_dir import METRICS_FILE, iter_metrics

CSV_HEAD: tuple[str, ...] = ("time", "step", "epoch", "rank")
CSV_EVAL: tuple[str, ...] = ("val_loss", "val_accuracy")
LOGGED_PREFIX = "logged/"
"""Names a logged series' CSV column and TensorBoard tag (``logged/acc``): apart from the
built-in fields, so a key named like one (a script's ``loss``) replaces nothing."""
CHART_SUFFIXES: tuple[str, ...] = (".png", ".svg")
TB_RANK_FIELDS: tuple[str, ...] = (
    "loss", "samples_per_s", "step_time_s", "sync_time_s", "gpu_util_pct")
TB_FILE_SUFFIX = ".rankscope"  # marks the event files we wrote, so a re-export replaces them

_TBPoint = tuple[int, float, list[tuple[str, float]]]  # step, wall time, (tag, value) pairs


class NothingToExport(ValueError):
    """The run folder has no metrics to export: metrics.jsonl is missing or holds none."""


class MetricsMissing(NothingToExport, FileNotFoundError):
    """metrics.jsonl does not exist (also a FileNotFoundError)."""


class ExportUnavailable(RuntimeError):
    """The export needs an optional package that is not installed."""


def _number(value: Any) -> float | int | None:
    """``value`` if it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _rank_entries(message: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(rank, entry) for each well-formed per-rank entry of a metrics line."""
    ranks = message.get("ranks")
    if not isinstance(ranks, list):
        return
    for i, entry in enumerate(ranks):
        if isinstance(entry, dict):
            rank = entry.get("rank", i)
            yield (rank if isinstance(rank, int) else i), entry


def _logged(entry: dict[str, Any]) -> dict[str, float | int]:
    """The finite numbers of a per-rank entry's ``logged`` (the series a rank logged by name)."""
    logged = entry.get("logged")
    if not isinstance(logged, dict):
        return {}
    return {key: number for key, value in logged.items()
            if isinstance(key, str) and (number := _number(value)) is not None}


def _is_eval(message: dict[str, Any]) -> bool:
    return message.get("type") == "event" and message.get("kind") == "eval"


def _read_run(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete line of metrics.jsonl, in file order.

    Raises:
        MetricsMissing: there is no metrics.jsonl.
        NothingToExport: it has no complete metrics line or eval event.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise MetricsMissing(f"{METRICS_FILE}: {path} is missing: nothing to export")
    lines = list(iter_metrics(run_dir))
    if not any(m.get("type") == "metrics" or _is_eval(m) for m in lines):
        raise NothingToExport(
            f"{METRICS_FILE}: {path} has no complete metrics or eval line: nothing to export")
    return lines


def _csv_cell(value: Any) -> float | int | str:
    number = _number(value)
    return "" if number is None else number


def export_csv(run_dir: str | os.PathLike[str], path: str | os.PathLike[str]) -> int:
    """Write the run's metrics.jsonl as a CSV table.

    One row per (metrics line, rank) with columns ``time, step, epoch, rank``, every field of
    RANK_FIELDS, then any other numeric per-rank field found (e.g. ``sync_buckets``, in
    alphabetical order), then ``logged/KEY`` for each series a rank logged by name (its
    entry's ``logged``, e.g. ``logged/acc``; alphabetical; empty where the rank did not log it
    in that report), then ``val_loss, val_accuracy``; and one row per ``eval`` event, with
    ``rank`` empty and the two ``val_*`` columns filled. Rows follow the file's order. Null or
    non-finite values give empty cells.

    Args:
        run_dir: the run folder.
        path: the CSV file to write (replaced if it exists).

    Returns:
        The number of rows written, not counting the header.

    Raises:
        MetricsMissing: there is no metrics.jsonl.
        NothingToExport: it has no complete metrics line or eval event.
    """
    lines = [m for m in _read_run(run_dir) if m.get("type") == "metrics" or _is_eval(m)]
    extra = sorted({key for m in lines for _, entry in _rank_entries(m)
                    for key, value in entry.items()
                    if key != "rank" and key not in RANK_FIELDS and _number(value) is not None})
    logged = sorted({key for m in lines for _, entry in _rank_entries(m)
                     for key in _logged(entry)})
    columns = [*CSV_HEAD, *RANK_FIELDS, *extra, *(LOGGED_PREFIX + k for k in logged), *CSV_EVAL]
    rows = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        for m in lines:
            head = {key: _csv_cell(m.get(key)) for key in ("time", "step", "epoch")}
            if _is_eval(m):
                writer.writerow({**head, **{key: _csv_cell(m.get(key)) for key in CSV_EVAL}})
                rows += 1
                continue
            for rank, entry in _rank_entries(m):
                cells = {key: _csv_cell(entry.get(key)) for key in (*RANK_FIELDS, *extra)}
                cells.update({LOGGED_PREFIX + k: v for k, v in _logged(entry).items()})
                writer.writerow({**head, "rank": rank, **cells})
                rows += 1
    return rows


def export_chart(plot_widget: pg.PlotWidget, path: str | os.PathLike[str],
                 width: int | None = None) -> Path:
    """Save a chart as PNG or SVG, chosen by the suffix of ``path``.

    Args:
        plot_widget: the chart (its plotItem is exported: title, axes, legend, curves).
        path: where to write; must end in .png or .svg.
        width: PNG width in pixels (the height keeps the chart's aspect ratio); default: the
            chart's size on screen. Ignored for SVG.

    Returns:
        ``path`` as a Path.

    Raises:
        ValueError: another suffix, a chart with no size, or a width below 1.
        OSError: the file could not be written.
    """
    # Imported here: the exporters pull in QtSvg, which only an export needs.
    from pyqtgraph.exporters import ImageExporter, SVGExporter

    out = Path(path)
    suffix = out.suffix.lower()
    if suffix not in CHART_SUFFIXES:
        raise ValueError(f"chart export: suffix must be one of {', '.join(CHART_SUFFIXES)}, "
                         f"got {out.suffix or 'none'!r} ({out.name})")
    item = plot_widget.plotItem
    size = item.mapRectToDevice(item.boundingRect())
    if size.width() < 1 or size.height() < 1:
        raise ValueError(f"chart export: the chart has no size yet "
                         f"({size.width():g}x{size.height():g} pixels)")
    if suffix == ".svg":
        SVGExporter(item).export(str(out))
        return out
    exporter = ImageExporter(item)
    if width is not None:
        if width < 1:
            raise ValueError(f"chart export: width must be >= 1 pixel, got {width}")
        # An int: pyqtgraph's QImage size is taken from this parameter (a float once broke it).
        exporter.parameters()["width"] = int(width)
    if not exporter.export(str(out)):  # QImage.save reports failure only by returning False
        raise OSError(f"chart export: could not write {out}")
    return out


def _metrics_scalars(m: dict[str, Any]) -> list[tuple[str, float]]:
    """The TensorBoard scalars of one metrics line."""
    out: list[tuple[str, float]] = []
    losses: list[float] = []
    throughputs: list[float] = []
    for rank, entry in _rank_entries(m):
        for key in TB_RANK_FIELDS:
            value = _number(entry.get(key))
            if value is not None:
                out.append((f"{key}/rank{rank}", float(value)))
        out.extend((f"{LOGGED_PREFIX}{key}/rank{rank}", float(value))
                   for key, value in _logged(entry).items())
        if (loss := _number(entry.get("loss"))) is not None:
            losses.append(float(loss))
        if (throughput := _number(entry.get("samples_per_s"))) is not None:
            throughputs.append(float(throughput))
    if throughputs:
        out.append(("samples_per_s/total", math.fsum(throughputs)))
    if losses:
        out.append(("loss/mean", math.fsum(losses) / len(losses)))
    return out


def _tensorboard_points(lines: list[dict[str, Any]]) -> list[_TBPoint]:
    """(step, wall time, scalars) for each metrics line and eval event.

    A ``run_start`` that starts at step S (a resumed run appends to the same metrics.jsonl)
    drops the earlier points past S, so each tag's steps only go forward, as TensorBoard
    expects. The CSV keeps every line.
    """
    points: list[_TBPoint] = []
    for m in lines:
        step = _number(m.get("step"))
        wall_time = float(_number(m.get("time")) or 0.0)
        if m.get("type") == "event" and m.get("kind") == "run_start":
            start = int(_number(m.get("start_step")) or 0)
            points = [p for p in points if p[0] <= start]
        elif m.get("type") == "metrics" and step is not None:
            points.append((int(step), wall_time, _metrics_scalars(m)))
        elif _is_eval(m) and step is not None:
            points.append((int(step), wall_time, [
                (f"val/{key}", float(value)) for key in ("loss", "accuracy")
                if (value := _number(m.get(f"val_{key}"))) is not None]))
    return [p for p in points if p[2]]


def export_tensorboard(run_dir: str | os.PathLike[str],
                       out_dir: str | os.PathLike[str] | None = None) -> Path:
    """Write the run's metrics as a TensorBoard event file, with tensorboard's own writer.

    Scalars, at each metrics line's step and wall time: ``loss/rank{r}``,
    ``samples_per_s/rank{r}``, ``step_time_s/rank{r}``, ``sync_time_s/rank{r}``,
    ``gpu_util_pct/rank{r}`` (each when measured), ``samples_per_s/total`` (sum over ranks),
    ``loss/mean`` (mean over ranks), ``logged/KEY/rank{r}`` for each series a rank logged by
    name; at each eval event, ``val/loss`` and ``val/accuracy``.
    For a resumed run, the first session's points past the resume step are left out. The
    event file an earlier export wrote to ``out_dir`` is removed: exporting again replaces it.

    Args:
        run_dir: the run folder.
        out_dir: the TensorBoard log folder (created if needed); default
            ``<run_dir>/tensorboard/``.

    Returns:
        The event file written.

    Raises:
        ExportUnavailable: the tensorboard package is not installed.
        MetricsMissing: there is no metrics.jsonl.
        NothingToExport: it has no complete metrics line or eval event.
    """
    try:
        # `tensorboard` itself first: its submodules may still be in sys.modules when the
        # package is gone, and a `from` import of them would not notice.
        import tensorboard  # noqa: F401
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as e:
        raise ExportUnavailable(
            "TensorBoard export needs the tensorboard package: pip install tensorboard") from e
    points = _tensorboard_points(_read_run(run_dir))
    folder = Path(out_dir) if out_dir is not None else Path(run_dir) / "tensorboard"
    pattern = f"events.out.tfevents.*{TB_FILE_SUFFIX}"
    old = set(folder.glob(pattern))
    writer = EventFileWriter(str(folder), filename_suffix=TB_FILE_SUFFIX)
    try:
        for step, wall_time, scalars in points:
            summary = summary_pb2.Summary(value=[
                summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars])
            writer.add_event(event_pb2.Event(step=step, wall_time=wall_time, summary=summary))
    finally:
        writer.close()  # flushes, and ends the writer's thread
    (event_file,) = set(folder.glob(pattern)) - old
    for p in old:
        p.unlink(missing_ok=True)
    return event_file


def export_run(run_dir: Path, kind: str, dest: Path | None = None) -> tuple[Path | None, str]:
    """Export a run's metrics as CSV (``kind`` "csv", to ``dest``, default RUN/metrics.csv) or
    TensorBoard event files (under ``dest``, default RUN/tensorboard).

    Returns:
        What was written (None when nothing was) and a line saying so, or why not.
    """
    try:
        if kind == "csv":
            out = Path(dest or run_dir / "metrics.csv")
            rows = export_csv(run_dir, out)
            return out, f"{rows} rows written to {out}"
        out = export_tensorboard(run_dir, dest)
        return out, f"TensorBoard events written: tensorboard --logdir {out.parent}"
    except (OSError, ValueError, RuntimeError) as e:
        return None, f"not exported: {e}"
