#!/usr/bin/env bash
# The base model on every candidate multi-step task set of docs/benchmarks/erpo-ablation.md ("A
# multi-step set the base model can do"): the held-out evaluation `envforge train --steps 0` runs
# before any update, one candidate a part, each under its own time limit. Nothing is trained but the
# curriculum's lookup run (below).
#
#   benchmarks/gpu_multistep_check.sh OUT            # needs torch with CUDA and envforge importable
#   DEVICE=cpu QUICK=1 benchmarks/gpu_multistep_check.sh OUT   # the same path, tiny sizes, on a CPU
#
# Prints one line a candidate, `NAME: SOLVED/EPISODES solved, ...`, and writes it to OUT/summary.txt;
# each candidate's run folder (eval.jsonl, its episodes in eval_trajectories/step_0.jsonl,
# run.json) and log are under OUT. On a GPU the candidates run side by side (PARALLEL=0 runs them
# one after another); each holds its own copy of the 0.5B model. `local/qwen2.5-coder-0.5b` must
# resolve (its packages installed, or its GGUF already in $ENVFORGE_CACHE/models). The
# curriculum's checkpoint is deleted once evaluated (KEEP_CHECKPOINT=1 keeps it). Candidates:
#   lookup          --tasks lookup on the four lookup envs, single turn (a call, then the answer): the
#                   set ERPO is known to learn on, in the config of docs/benchmarks/training.md (2 of
#                   60 held-out at step 0 on the CPU), here to compare this machine with that figure
#   told            --tasks told on car_rental, library, gym, pharmacy: 2-3 calls, one write, facts
#                   in the request (0 of 58 held-out on the CPU)
#   told-helpdesk   --tasks told on helpdesk_lite: no identity, no confirmation; only the ticket is
#                   read before a write
#   pair            --tasks pair on helpdesk_lite, car_rental, gym, pharmacy, library: one read, then
#                   the one write, values in the request
#   pair-turns10    pair with --max-turns 10 in place of 6
# and a curriculum beside them: ERPO on the lookups first (single turn, where the model learns to
# answer in words after a tool's result, which it never does after a write), then its checkpoint on
#   pair@lookup, told@lookup   the pair and told sets, as above (OUT/curriculum: the lookup run)
set -uo pipefail
OUT=${1:?usage: gpu_multistep_check.sh OUT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-local/qwen2.5-coder-0.5b}
export LITELLM_LOCAL_MODEL_COST_MAP=True PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

if [ "$DEVICE" = cpu ]; then PARALLEL=${PARALLEL:-0} BATCH=16; else PARALLEL=${PARALLEL:-1} BATCH=128; fi
if [ "${QUICK:-0}" = 1 ]; then
    LIMIT=600 SAMPLES=(1 1 1 1 1) TURNS=(2 2 2 2 3) TOKENS=(8 8 8 8 8)
    LOOKUP=(envs/pharmacy) TOLD=(envs/pharmacy) HELPDESK=(envs/helpdesk_lite) PAIR=(envs/pharmacy)
    LEARN=(--steps 1 --tasks-per-step 2 --rollouts-per-task 2 --collectors 1 --max-new-tokens 8)
else
    LIMIT=140 SAMPLES=(2 2 4 3 3) TURNS=(2 6 6 6 10) TOKENS=(48 64 64 64 64)
    LOOKUP=(envs/car_rental envs/library envs/gym envs/pharmacy)
    TOLD=(envs/car_rental envs/library envs/gym envs/pharmacy)
    HELPDESK=(envs/helpdesk_lite)
    PAIR=(envs/helpdesk_lite envs/car_rental envs/gym envs/pharmacy envs/library)
    # the lookup run of docs/benchmarks/training.md on a GPU (held-out 0.600 at step 5), 6 steps
    LEARN=(--steps 6 --tasks-per-step 8 --rollouts-per-task 4 --collectors 8 --max-new-tokens 48)
fi
NAMES=(lookup told told-helpdesk pair pair-turns10)
KINDS=(lookup told told pair pair)
ENVS=("${LOOKUP[*]}" "${TOLD[*]}" "${HELPDESK[*]}" "${PAIR[*]}" "${PAIR[*]}")
# side by side (the candidates, the curriculum's run and then its two), the cores are shared out
[ "$PARALLEL" = 1 ] && export OMP_NUM_THREADS=$(( $(nproc) / 7 > 0 ? $(nproc) / 7 : 1 ))

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  "$PY" -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__,
"transformers", transformers.__version__)'; } 2>&1 | tee "$OUT/machine.txt"

echo "== model: $MODEL"
t0=$SECONDS
timeout 240 "$PY" -c "import sys; from envforge.trainer import resolve_model; print(resolve_model(sys.argv[1]))" \
    "$MODEL" >"$OUT/model.txt" 2>&1
echo "exit $? in $((SECONDS - t0)) s"; tail -1 "$OUT/model.txt"

candidate() {  # INDEX [NAME MODEL LIMIT]: the step-0 held-out evaluation of one candidate set, into OUT/NAME
    local i=$1 name=${2:-${NAMES[$1]}} model=${3:-$MODEL} limit=${4:-$LIMIT} envs=() e t0=$SECONDS
    for e in ${ENVS[$i]}; do envs+=(--envs "$e"); done
    timeout "$limit" "$PY" -m envforge.cli train --model "$model" --device "$DEVICE" "${envs[@]}" \
        --tasks "${KINDS[$i]}" --steps 0 --tasks-per-step 16 --eval-every 1 --eval-samples "${SAMPLES[$i]}" \
        --max-turns "${TURNS[$i]}" --max-new-tokens "${TOKENS[$i]}" --max-batch "$BATCH" --temperature 0.7 \
        --precision bfloat16 --seed 0 --save-trajectories --out "$OUT/$name" >"$OUT/$name.log" 2>&1
    echo "exit $? in $((SECONDS - t0)) s" >>"$OUT/$name.log"
}

curriculum() {  # ERPO on the lookups, then candidates pair and told (indexes 3, 1) from its checkpoint
    local envs=() e t0=$SECONDS steps=${LEARN[1]}
    for e in ${LOOKUP[*]}; do envs+=(--envs "$e"); done
    timeout "$LIMIT" "$PY" -m envforge.cli train --model "$MODEL" --device "$DEVICE" "${envs[@]}" \
        --tasks lookup "${LEARN[@]}" --staleness 0 --max-turns 2 --max-batch "$BATCH" --temperature 0.7 \
        --lr 1e-5 --precision bfloat16 --seed 0 --checkpoint-every "$steps" --out "$OUT/curriculum" \
        >"$OUT/curriculum.log" 2>&1
    echo "exit $? in $((SECONDS - t0)) s" >>"$OUT/curriculum.log"
    local ckpt=$OUT/curriculum/checkpoints/step_$steps
    if [ ! -d "$ckpt" ]; then echo "no checkpoint" >>"$OUT/curriculum.log"; return; fi
    local left=$(( LIMIT - (SECONDS - t0) > 10 ? LIMIT - (SECONDS - t0) : 10 ))
    candidate 3 pair@lookup "$ckpt" "$left" &
    candidate 1 told@lookup "$ckpt" "$left" &
    wait
    [ "${KEEP_CHECKPOINT:-0}" = 1 ] || rm -rf "$OUT/curriculum/checkpoints"  # ~2 GB: OUT stays small
}

echo "== candidates: ${NAMES[*]}, pair@lookup, told@lookup (parallel: $PARALLEL)"
t0=$SECONDS
if [ "$PARALLEL" = 1 ]; then curriculum & else curriculum; fi
for i in "${!NAMES[@]}"; do
    if [ "$PARALLEL" = 1 ]; then candidate "$i" & else candidate "$i"; fi
done
wait
echo "all in $((SECONDS - t0)) s"

"$PY" - "$OUT" "${NAMES[@]}" pair@lookup told@lookup <<'EOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
learned = out / "curriculum" / "metrics.jsonl"
if learned.is_file():
    steps = [json.loads(x) for x in learned.read_text().splitlines() if x]
    print(f"curriculum (ERPO on the lookups, {len(steps)} steps): train reward "
          f"{[round(m['reward_mean'], 3) for m in steps]}, updates applied "
          f"{sum(not m.get('update_skipped') and not m.get('update_nonfinite') for m in steps)}")
for name in sys.argv[2:]:
    log = out / f"{name}.log"
    ended = log.read_text().strip().splitlines()[-1] if log.is_file() else "no log"
    evals = out / name / "eval.jsonl"
    rows = [json.loads(x) for x in evals.read_text().splitlines() if x] if evals.is_file() else []
    if not rows:
        print(f"{name}: no evaluation ({ended}; see {log})")
        continue
    r = rows[0]["rewards"]
    solved = sum(x >= 1.0 for x in r)
    print(f"{name}: {solved}/{len(r)} solved, {sum(x > 0 for x in r)} above 0, mean reward "
          f"{sum(r) / len(r):.3f}, eval {rows[0]['seconds']} s ({ended})")
EOF
