#!/usr/bin/env bash
# The GPU check of docs/benchmarks/training.md ("On a GPU"): the packaged 0.5B model trained on one GPU,
# envforge's ERPO loop next to trl's GRPOTrainer on the same config (h2h), the lookup ERPO run of
# "ERPO on a real pretrained LM" on the GPU (erpo), and trl's GRPOTrainer learning the lookup tasks
# through `envforge.integrations.trl` next to envforge's own trainer, against the lr-0 control (trl).
# Figures and logs go to OUT.
#
#   benchmarks/gpu_train_check.sh OUT            # needs torch with CUDA and envforge importable
#   PARTS="trl" benchmarks/gpu_train_check.sh OUT          # some of the parts (default: h2h erpo trl)
#   DEVICE=cpu QUICK=1 benchmarks/gpu_train_check.sh OUT   # the same path, tiny sizes, on a CPU
#
# `local/qwen2.5-coder-0.5b` must resolve: its packages installed, or its GGUF already in
# $ENVFORGE_CACHE/models (hash-checked either way). Each part has its own time limit, so one
# that fails or hangs still leaves the other's figures.
set -uo pipefail
OUT=${1:?usage: gpu_train_check.sh OUT}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-local/qwen2.5-coder-0.5b}
export LITELLM_LOCAL_MODEL_COST_MAP=True PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

if [ "${QUICK:-0}" = 1 ]; then
    H2H=(--tasks 2 --group 2 --completion-len 8 --steps 1 --micro-batch 4)
    ERPO=(--steps 1 --tasks-per-step 8 --rollouts-per-task 2 --collectors 4 --max-batch 8
          --max-new-tokens 8 --eval-every 1)
else
    H2H=(--tasks 8 --group 8 --completion-len 128 --steps 4 --micro-batch 16)
    ERPO=(--steps 10 --tasks-per-step 8 --rollouts-per-task 4 --collectors 8 --max-batch 64
          --max-new-tokens 48 --eval-every 5)
fi
PARTS=" ${PARTS:-h2h erpo trl} "
PRECISION=bfloat16
[ "$DEVICE" = cpu ] && PRECISION=float32  # trl refuses bf16 without a GPU

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  "$PY" -c 'import sys, torch, transformers, trl; print(sys.version.split()[0], "torch", torch.__version__,
"transformers", transformers.__version__, "trl", trl.__version__)'; } 2>&1 | tee "$OUT/machine.txt"

echo "== model: $MODEL"
t0=$SECONDS
timeout 240 "$PY" -c "import sys; from envforge.trainer import resolve_model; print(resolve_model(sys.argv[1]))" \
    "$MODEL" >"$OUT/model.txt" 2>&1
echo "exit $? in $((SECONDS - t0)) s"; tail -1 "$OUT/model.txt"

if [[ $PARTS == *" h2h "* ]]; then
echo "== envforge ERPO loop vs trl GRPOTrainer, same config"
timeout 210 "$PY" benchmarks/bench_train.py --model "$MODEL" --device "$DEVICE" --precision "$PRECISION" \
    --lr 0 --staleness 0,1 "${H2H[@]}" --json "$OUT/bench_train.jsonl" >"$OUT/bench_train.log" 2>&1
echo "exit $?"; grep -E "^(envforge|trl)" "$OUT/bench_train.log"
fi

if [[ $PARTS == *" erpo "* ]]; then

echo "== ERPO on lookup tasks (docs/benchmarks/training.md, ERPO on a real pretrained LM)"
t0=$SECONDS
timeout 210 "$PY" -m envforge.cli train --model "$MODEL" --device "$DEVICE" \
    --envs envs/car_rental --envs envs/library --envs envs/gym --envs envs/pharmacy --tasks lookup \
    --staleness 1 --max-turns 2 --temperature 0.7 --eval-samples 1 --seed 0 --precision "$PRECISION" \
    --lr 1e-5 "${ERPO[@]}" --save-trajectories --out "$OUT/erpo" >"$OUT/erpo.log" 2>&1
echo "exit $? in $((SECONDS - t0)) s"; tail -2 "$OUT/erpo.log"
"$PY" - "$OUT/erpo" <<'EOF'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
if not (run / "metrics.jsonl").is_file():
    sys.exit(f"no metrics in {run}")
steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines() if x]
timed = steps[1:] or steps
wall = sum(m["step_time_s"] for m in timed)
print(f"steps {len(steps)}: {wall / len(timed):.2f} s a step after the first, "
      f"{sum(m['tokens'] for m in timed) / wall:.0f} tokens/s; train rewards "
      f"{[round(m['reward_mean'], 3) for m in steps]}; non-finite updates not applied: "
      f"{sum(m.get('update_nonfinite', False) for m in steps)}")
print("held-out:", ", ".join(f"step {e['step']}: {e['reward_mean']:.3f} ({e['episodes']} ep)" for e in evals))
EOF
fi

if [[ $PARTS == *" trl "* ]]; then
echo "== trl GRPOTrainer learning the lookup tasks through envforge.integrations.trl, next to envforge's trainer"
t0=$SECONDS
if [ "${QUICK:-0}" = 1 ]; then TRL=(--smoke); else TRL=(--model "$MODEL" --micro-batch 32 --trl-max-minutes "${TRL_MAX_MINUTES:-3}"); fi
# TRL_ARGS: more flags for the script, e.g. "--staleness 0 --collectors 8" for envforge's side
timeout "${TRL_TIMEOUT:-420}" "$PY" benchmarks/trl_vs_envforge.py "${TRL[@]}" ${TRL_ARGS:-} --device "$DEVICE" \
    --out "$OUT/trl_vs_envforge" >"$OUT/trl_vs_envforge.log" 2>&1
echo "exit $? in $((SECONDS - t0)) s"; cat "$OUT/trl_vs_envforge/progress.log" 2>/dev/null | tail -40
cat "$OUT/trl_vs_envforge/table.md" 2>/dev/null
fi
