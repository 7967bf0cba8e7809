#!/usr/bin/env bash
# Makes docs/screenshot.png: the real window under Xvfb, F5 pressed with xdotool, a live run.
# Needs Debian's xvfb, xdotool, x11-utils and imagemagick, and the X libraries Qt's xcb platform
# loads (see `make screenshot`). Run from anywhere: docs/make_screenshot.sh [OUT [WIDTH HEIGHT]]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/screenshot.png}
width=${2:-1600}
height=${3:-1000}
display=:97
Xvfb "$display" -screen 0 "${width}x${height}x24" -nolisten tcp &
xvfb=$!
app=""
runs=$(mktemp -d)
cleanup() { [ -n "$app" ] && kill "$app" 2>/dev/null; kill "$xvfb" 2>/dev/null; rm -rf "$runs"; }
trap cleanup EXIT
export DISPLAY=$display QT_QPA_PLATFORM=xcb
for _ in $(seq 100); do xdpyinfo >/dev/null 2>&1 && break; sleep 0.1; done
# SCREENSHOT_CONFIG=FILE.toml: the form filled from that file instead (runs_dir is added), e.g.
# a run of your own script; SCREENSHOT_STEP: the step of the report to photograph (400).
if [ -n "${SCREENSHOT_CONFIG:-}" ]; then
  { cat "$SCREENSHOT_CONFIG"; echo "runs_dir = \"$runs\""; } > "$runs/preset.toml"
else
cat > "$runs/preset.toml" <<TOML
model = "convnet"
dataset = "digits"
max_steps = 3000
batch_size = 32
lr = 0.003
nproc = 2
device = "cpu"
runs_dir = "$runs"
TOML
fi
step=${SCREENSHOT_STEP:-400}
# Two earlier runs for the Runs panel (real, short ones).
for steps in 150 300; do
  .venv/bin/python -m ddp_engine launch --model mlp --dataset digits --nproc 2 \
    --max-steps "$steps" --runs-dir "$runs" --name "mlp-digits-$steps" >/dev/null 2>&1
done
.venv/bin/python main.py --runs-dir "$runs" --config "$runs/preset.toml" \
  --settings "$runs/settings.ini" &
app=$!
wid=$(xdotool search --sync --name '^Rankscope')
xdotool windowsize "$wid" "$width" "$height" windowmove "$wid" 0 0
xdotool windowactivate --sync "$wid" 2>/dev/null || xdotool windowfocus --sync "$wid"
xdotool key --window "$wid" F5
# Let the run start and the charts fill; then photograph the live run.
for _ in $(seq 120); do
  grep -qs "\"type\":\"metrics\".*\"step\":$step," "$runs"/*/metrics.jsonl && break
  sleep 0.5
done
sleep 2
import -window root "$out"
xdotool key --window "$wid" shift+F5
for _ in $(seq 120); do
  grep -qs '"kind":"stopped"\|"kind":"completed"' "$runs"/*/metrics.jsonl && break
  sleep 0.5
done
sleep 3
echo "wrote $out"
