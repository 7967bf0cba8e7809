#!/bin/bash
# How often a script run fails to end: launch tests/ddp_engine/rank/scripts/variants.py (or
# SCRIPT) N times under Rankscope, 2 CPU ranks; a run still alive after LIMIT seconds counts as
# hung, and every process of it gets a py-spy dump (native frames too) in WORK/I/spy.txt
# before the launcher is interrupted. With PLAIN=1 the same file runs under plain torchrun.
# Prints one line per run and a total. Needs py-spy in .venv (.venv/bin/pip install py-spy).
#   N=40 bench/script_end_loop.sh
#   N=20 PLAIN=1 bench/script_end_loop.sh
set -u
cd "$(dirname "$0")/.."
N=${N:-20} LIMIT=${LIMIT:-80} WORK=${WORK:-/tmp/script_end_loop}
SCRIPT=${SCRIPT:-tests/ddp_engine/rank/scripts/variants.py}
hung=0
for i in $(seq 1 "$N"); do
  d=$WORK/$i; rm -rf "$d"; mkdir -p "$d"
  if [ "${PLAIN:-0}" = 1 ]; then
    CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc-per-node 2 \
      --log-dir "$d/run" "$SCRIPT" --steps 3 > "$d/out.txt" 2>&1 &
  else
    .venv/bin/python -m ddp_engine launch --script "$SCRIPT" --nproc 2 --run-dir "$d/run" \
      -- --steps 3 > "$d/out.txt" 2>&1 &
  fi
  pid=$!
  for _ in $(seq 1 "$LIMIT"); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    hung=$((hung + 1)); echo "run $i: HUNG (py-spy dumps in $d/spy.txt)"
    ranks=""; [ "${PLAIN:-0}" = 1 ] && ranks=$(pgrep -f "$SCRIPT --steps")
    for p in $(pgrep -f "$d/run") $ranks; do
      echo "== $p $(tr '\0' ' ' < /proc/$p/cmdline)"; .venv/bin/py-spy dump --native --pid "$p"
    done > "$d/spy.txt" 2>&1
    kill -INT $pid; sleep 40; pkill -KILL -f "$d/run"; wait $pid
  else
    wait $pid; echo "run $i: rc=$? $(tail -1 "$d/out.txt")"
  fi
done
echo "$hung of $N runs hung"
