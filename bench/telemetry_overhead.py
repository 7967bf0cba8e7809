"""What monitoring costs: the engine as users run it, against the plain DDP loop, side by side.

    .venv/bin/python bench/telemetry_overhead.py [--reps 5] [--variants plain,on,off]
    .venv/bin/python bench/telemetry_overhead.py --base /path/to/older/checkout   # before/after
    .venv/bin/python bench/telemetry_overhead.py --sweep [--png docs/overhead_sweep.png]

The workload (issue 16's): an MLP 256-512-512-10 on 80,000 synthetic samples, batch 64 per
rank, SGD (lr 0.01, no momentum), 2 CPU ranks with gloo, OMP_NUM_THREADS=1 for every variant,
600 steps, throughput over steps 150..600. Variants:

- ``plain``: bench/plain_ddp.py, the standard DDP recipe and nothing else, under plain torchrun;
- ``on``: ``python -m ddp_engine launch`` with the default settings (telemetry on, metrics on
  multiples of 10 steps at least 0.2 s apart, an agreed-stop round with each); validation
  off (``eval_every 0``: the plain loop has none);
- ``off``: the same with ``--no-telemetry``;
- ``hook``: ``on`` with ``--sync-timing hook`` (sync timed by Rankscope's comm hook on every
  step, the default before issue 29; ``on`` reads DDP's reducer timers once per report);
- ``before``: ``on`` run from the checkout given with ``--base`` (the engine before a change);
- ``again``: ``plain`` run a second time in the same repetition (an A/A check: how far apart
  two runs of the same loop land, and whether either side of a pair is favoured).

Each repetition runs every variant once, back to back, in a rotating order, so that the
machine's noise hits them alike. Each ratio is taken within a repetition (paired) and reported
as the median over repetitions with its range; the ratio of the medians is printed beside it.
Engine throughput comes from the "time" stamps of rank 0's metrics: the first report at or
after the warm-up and the last step's; the plain loop measures from the warm-up itself.

``--sweep`` repeats ``plain`` against ``on`` at other step times (model width and batch: about
3, 5, 9, 20 and 100 ms per step here; a fixed per-step cost shows most at short steps) and, with
``--png``, plots the ratio against the step time; ``--old FILE`` (up to three) draws an earlier
sweep's points beside it (a JSON list of ``{"step_ms", "median"}``, as bench/results/ keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddp_engine.common.config import RunConfig  # noqa: E402
from ddp_engine.common.run_dir import iter_metrics  # noqa: E402


@dataclass(frozen=True)
class Workload:
    hidden: int
    batch: int
    steps: int
    warmup: int

    def config(self, nproc: int) -> RunConfig:
        return RunConfig(model="mlp", model_args={"hidden": self.hidden, "depth": 2},
                         dataset="synthetic",
                         dataset_args={"num_samples": 80_000, "val_samples": 0,
                                       "input_shape": [256]},
                         nproc=nproc, device="cpu", max_steps=self.steps, eval_every=0,
                         batch_size=self.batch, optimizer="sgd", lr=0.01, momentum=0.0)


DEFAULT = Workload(hidden=512, batch=64, steps=600, warmup=150)
SWEEP = (Workload(32, 16, 1600, 400), Workload(384, 64, 1000, 250), DEFAULT,
         Workload(1024, 64, 300, 80), Workload(2816, 64, 80, 20))
"""About 3, 5, 9, 20 and 100 ms per step on this 2-core machine (3 ms is the shortest a 2-rank
gloo step gets here: the gradient all-reduce and the data loader alone take that long)."""


VARIANT_FLAGS: dict[str, tuple[str, ...]] = {"on": (), "off": ("--no-telemetry",),
                                             "hook": ("--sync-timing", "hook")}
"""The engine's variants: launch flags beside the config."""


def engine_run(repo: Path, config: Path, w: Workload, nproc: int, work: Path,
               *extra: str) -> float:
    run_dir = work / f"engine-{len(list(work.iterdir()))}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "ddp_engine", "launch", "--config", str(config),
                    "--run-dir", str(run_dir), *extra], check=True, capture_output=True,
                   cwd=repo, env=env)
    # Reports are paced (rank/report_pace.py): the first at or after the warm-up, and the
    # last step's.
    reports = [m for m in iter_metrics(run_dir) if m["type"] == "metrics"]
    first = next(m for m in reports if m["step"] >= w.warmup)
    last = reports[-1]
    assert last["step"] == w.steps, (last["step"], w.steps)
    samples = (last["step"] - first["step"]) * w.batch * nproc
    return samples / (last["time"] - first["time"])


def plain_run(config: Path, w: Workload, nproc: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", str(nproc), str(REPO / "bench/plain_ddp.py"),
                          "--config", str(config), "--warmup", str(w.warmup)],
                         check=True, capture_output=True, text=True, cwd=REPO, env=env).stdout
    return float(json.loads(out.strip().splitlines()[-1])["samples_per_s"])


def measure(w: Workload, variants: list[str], reps: int, nproc: int,
            base: Path | None) -> dict[str, list[float]]:
    """samples/s of each variant in each repetition (rotating order)."""
    results: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "bench.json"
        config.write_text(w.config(nproc).to_json())
        for rep in range(reps):
            k = rep % len(variants)
            for name in variants[k:] + variants[:k]:
                if name in ("plain", "again"):
                    value = plain_run(config, w, nproc)
                elif name == "before":
                    assert base is not None, "--base names the checkout to run as 'before'"
                    value = engine_run(base, config, w, nproc, work)
                else:
                    value = engine_run(REPO, config, w, nproc, work, *VARIANT_FLAGS[name])
                results[name].append(value)
                print(f"  rep {rep + 1} {name:>6}: {value:10,.0f} samples/s "
                      f"({1000 * w.batch * nproc / value:.2f} ms/step)", flush=True)
    return results


def paired(results: dict[str, list[float]], a: str, b: str) -> tuple[float, float, float]:
    """Median, min and max over repetitions of a/b taken within each repetition."""
    ratios = [x / y for x, y in zip(results[a], results[b], strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def report(results: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in results.items()}
    print("  median samples/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in med.items()))
    ref = "plain" if "plain" in results else next(iter(results))
    pairs = [(a, ref) for a in results if a != ref]
    if "on" in results and "before" in results:
        pairs.append(("on", "before"))
    if "on" in results and "off" in results:
        pairs.append(("on", "off"))
    if "on" in results and "hook" in results:
        pairs.append(("on", "hook"))
    if "again" in results:  # the A/A pair: which side of a pair the order favours, if any
        print(f"  A/A: plain's second run faster in "
              f"{sum(a > b for a, b in zip(results['again'], results['plain'], strict=True))}"
              f" of {len(results['plain'])} repetitions")
    print("  ratio            paired median (min..max)   ratio of medians")
    for a, b in pairs:
        m, lo, hi = paired(results, a, b)
        print(f"  {a:>6} / {b:<7}  {m:.3f} ({lo:.3f}..{hi:.3f})          "
              f"{med[a] / med[b]:.3f}")


def plot(points: list[dict[str, float]], path: Path,
         old: Sequence[tuple[str, list[dict[str, float]]]] = ()) -> None:
    """The paired ratio on/plain against the plain loop's step time, with its range, and
    earlier sweeps' medians (``old``: each one's label and points) beside it; drawn with the
    app's own Chart and saved as PNG."""
    import numpy as np
    import pyqtgraph as pg
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from app.charts.base import Chart, color
    from bench.plotting import save_chart

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # a picture, no window: no display
    app = QApplication.instance() or QApplication([])
    chart = Chart("engine with default settings / plain DDP loop (2 CPU ranks)",
                  "throughput ratio", "plain loop's step time, ms (log)")
    x = np.log10([p["step_ms"] for p in points])
    chart.getAxis("bottom").setTicks([[(float(v), f"{p['step_ms']:.1f}")
                                       for v, p in zip(x, points, strict=True)], []])
    lows = [p["min"] for p in points]
    span = x
    for (label, was), hue, symbol in zip(old, (3, 4, 5), ("t", "s", "d"), strict=False):
        ox = np.log10([p["step_ms"] for p in was])
        chart.set_data(label, ox, np.array([p["median"] for p in was]), color(hue),
                       symbol=symbol)
        lows += [p["median"] for p in was]
        span = np.concatenate([span, ox])
    chart.set_data("now: paired median", x, np.array([p["median"] for p in points]), color(0),
                   symbol="o")
    chart.set_data("min", x, np.array([p["min"] for p in points]), color(1), dashed=True)
    chart.set_data("max", x, np.array([p["max"] for p in points]), color(2), dashed=True)
    for level, what, at in ((1.0, "no cost", 0.75), (0.99, "", 0.0),
                            (0.98, "targets: 0.98 at 5 ms, 0.99 from 10 ms", 0.75)):
        chart.addItem(pg.InfiniteLine(level, angle=0, label=what or None,
                                      labelOpts={"position": at, "color": "#555"},
                                      pen=pg.mkPen("#555", style=Qt.PenStyle.DashLine)))
    chart.setXRange(float(span.min()) - 0.1, float(span.max()) + 0.1, padding=0)
    chart.setYRange(min(0.8, min(lows) - 0.02),
                    max(1.2, max(p["max"] for p in points) + 0.12), padding=0)  # the legend
    save_chart(app, chart, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--variants", default=None,
                        help="comma-separated, of plain, on, off, hook, before, again (default: "
                             "plain,on,off and before with --base)")
    parser.add_argument("--base", type=Path, help="a checkout whose engine runs as 'before'")
    parser.add_argument("--sweep", action="store_true", help="plain and on at 5 step times")
    parser.add_argument("--hidden", type=int, choices=[w.hidden for w in SWEEP],
                        help="one of the sweep's workloads instead of the default (by width)")
    parser.add_argument("--png", type=Path, help="with --sweep: plot the ratios here")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--replot", type=Path, help="draw --png from a --json file of an "
                        "earlier sweep instead of measuring")
    parser.add_argument("--old", type=Path, action="append", default=[],
                        help="with --png: an earlier sweep's points (JSON: {\"label\": ..., "
                        "\"points\": [{\"step_ms\", \"median\"}]}); may be given twice")
    args = parser.parse_args()
    variants = (args.variants.split(",") if args.variants
                else ["plain", "on", "off"] + (["before"] if args.base else []))
    workloads = SWEEP if args.sweep else tuple(w for w in SWEEP if w.hidden == args.hidden) \
        if args.hidden else (DEFAULT,)
    if args.sweep and not args.variants:
        variants = ["plain", "on"]
    print(f"{args.nproc} CPU ranks (gloo), OMP_NUM_THREADS=1, {args.reps} repetitions, "
          f"{os.cpu_count()} cores; variants {', '.join(variants)}")
    raw, points = [], []
    if args.replot:
        workloads = ()
        for got in json.loads(args.replot.read_text()):
            w = Workload(**got["workload"])
            m, lo, hi = paired(got["results"], "on", "plain")
            step_ms = 1000 * w.batch * args.nproc / statistics.median(got["results"]["plain"])
            points.append({"step_ms": step_ms, "median": m, "min": lo, "max": hi})
    for w in workloads:
        print(f"mlp 256-{w.hidden}-{w.hidden}-10, batch {w.batch}/rank, SGD, steps "
              f"{w.warmup}..{w.steps}", flush=True)
        results = measure(w, variants, args.reps, args.nproc, args.base)
        report(results)
        raw.append({"workload": w.__dict__, "results": results})
        if "plain" in results and "on" in results:
            m, lo, hi = paired(results, "on", "plain")
            step_ms = 1000 * w.batch * args.nproc / statistics.median(results["plain"])
            points.append({"step_ms": step_ms, "median": m, "min": lo, "max": hi})
    if args.sweep or args.replot:
        print("\nstep time (plain)   on / plain, paired median (min..max)")
        for p in points:
            print(f"  {p['step_ms']:7.1f} ms        {p['median']:.3f} ({p['min']:.3f}.."
                  f"{p['max']:.3f})")
        if args.png:
            olds = [json.loads(path.read_text()) for path in args.old]
            plot(points, args.png, [(old["label"], old["points"]) for old in olds])
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
