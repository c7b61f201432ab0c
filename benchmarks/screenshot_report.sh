#!/usr/bin/env bash
# Look at the HTML reports in a real browser: real runs on a bundled env, rendered by `envforge
# report`, screenshotted by headless Chromium (installed from Debian when missing).
#
#   benchmarks/screenshot_report.sh [OUT_DIR]      (default: /tmp/envforge-report-shots)
#   benchmarks/screenshot_report.sh REPORT [PNG]   one report as it opens: REPORT is a report's
#                                                  .html or a run folder (its report.html, rendered
#                                                  by `envforge report` when missing); PNG defaults
#                                                  to REPORT's name with .png, beside it or in /tmp
#
# Writes OUT_DIR/{single,single-open,single-narrow,compare}.png and the pages they show:
#   single.png         the run report of a `golden_prefix` run, one trial of it an infra failure
#   single-open.png    the same page with its first failed and first excluded trials opened
#                      (the task, failed reward part and state diff beside the conversation)
#   single-trials.png  its trajectories alone (header, summary and plots hidden), full size
#   single-narrow.png  that page in an 820 px window (the trial body stacks)
#   compare.png        `envforge report A B C`: oracle, noop and a run whose model was down
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/envforge-report-shots}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
ENV_DIR="$ROOT/envs/flight_booking"
TASKS="flight_booking-0-00000,flight_booking-0-00002,flight_booking-0-00005,flight_booking-0-00008"
export LITELLM_LOCAL_MODEL_COST_MAP=True

browser() {
    command -v chromium || command -v chromium-browser || command -v google-chrome || true
}

if [ -z "$(browser)" ]; then
    echo "installing chromium (Debian package)" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
BROWSER="$(browser)"
[ -n "$BROWSER" ] || { echo "error: no chromium after installing it" >&2; exit 1; }

envforge() { "$PY" -m envforge.cli "$@"; }
shot() {  # shot PNG HTML WIDTH HEIGHT
    "$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
        --window-size="$3,$4" --screenshot="$1" "file://$2" >/dev/null 2>&1
    echo "$1"
}

if [ -d "${1:-}" ] && [ -f "$1/manifest.json" ] || [[ "${1:-}" == *.html ]]; then  # one report
    REPORT="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
    if [ -d "$REPORT" ]; then
        [ -f "$REPORT/report.html" ] || envforge report "$REPORT" >/dev/null
        REPORT="$REPORT/report.html"
    fi
    [ -f "$REPORT" ] || { echo "error: no report at $REPORT" >&2; exit 2; }
    PNG="${2:-${REPORT%.html}.png}"
    [ -w "$(dirname "$PNG")" ] || PNG="/tmp/$(basename "$PNG")"
    shot "$PNG" "$REPORT" 1280 2200
    exit 0
fi

rm -rf "$OUT" && mkdir -p "$OUT"

for agent in oracle noop; do  # the runs compared: two envs, three tasks each
    envforge eval "$ENV_DIR" "$ROOT/envs/library" --agent "$agent" --limit 3 --trials 2 \
        --out "$OUT/$agent" --json >/dev/null 2>&1
done
envforge eval "$ENV_DIR" --agent golden_prefix --tasks "$TASKS" --trials 2 --out "$OUT/golden_prefix" \
    --json >/dev/null 2>&1
# a model agent whose server is down: every trial an infra failure (eval exits 1 for that)
envforge eval "$ENV_DIR" --agent openai/nobody --agent-api-base http://127.0.0.1:9/v1 \
    --tasks flight_booking-0-00000 --out "$OUT/down" --json >/dev/null 2>&1 || true
# one run holding passes, failures and an infra failure: golden_prefix's records, with the down
# run's trial appended as its trial 1 of the refund task (the latest record of a key is the one read)
"$PY" - "$OUT/golden_prefix" "$OUT/down/trials.jsonl" <<'EOF'
import json, sys
run_dir, down = sys.argv[1], sys.argv[2]
run_id = json.load(open(f"{run_dir}/manifest.json"))["run_id"]
with open(f"{run_dir}/trials.jsonl", "a") as out:
    for line in open(down):
        rec = json.loads(line)
        rec.update(run_id=run_id, trial=1, trial_key=rec["trial_key"][: -len("/0")] + "/1")
        out.write(json.dumps(rec) + "\n")
EOF

envforge report "$OUT/golden_prefix" >/dev/null
envforge report "$OUT/oracle" "$OUT/noop" "$OUT/down" --out "$OUT/compare.html" >/dev/null

# the same page with the first excluded trial opened too (the first failed one opens by itself)
sed -e '0,/<details class="trial fail"/s//<details open class="trial fail"/' \
    -e '0,/<details class="trial excluded"/s//<details open class="trial excluded"/' \
    "$OUT/golden_prefix/report.html" > "$OUT/single-open.html"

# and its trajectories alone, for a close look at the opened trials
sed -e 's#</style>#main>table.manifest,main>h2,main>p,.plots,table.summary{display:none}</style>#' \
    "$OUT/single-open.html" > "$OUT/single-trials.html"

shot "$OUT/single.png" "$OUT/golden_prefix/report.html" 1280 2200
shot "$OUT/single-open.png" "$OUT/single-open.html" 1280 3600
shot "$OUT/single-trials.png" "$OUT/single-trials.html" 1280 1800
shot "$OUT/single-narrow.png" "$OUT/single-open.html" 820 4400
shot "$OUT/compare.png" "$OUT/compare.html" 1280 1400
