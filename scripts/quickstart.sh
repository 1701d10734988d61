#!/usr/bin/env bash
# The whole pipeline on a laptop-class CPU, offline, in minutes: set-up, tiny model, oracle labels,
# SFT, PPO from the SFT adapter, and evaluation before SFT / after SFT / after PPO next to the oracle
# (upper reference), random legal actions (chance reference) and the blind twins of the SFT and PPO
# policies (the same prompts with every frame zeroed), with paired differences between them.
#
# Usage:  bash scripts/quickstart.sh [OUTDIR]        (default OUTDIR: outputs/quickstart)
#
# Environment variables (all optional):
#   PRESET     config preset under configs/ (default cpu-demo); every step uses it
#   ENV_CONFIG env overlay for another env than VSI, e.g. configs/envs/numberline.yaml (the oracle
#              teacher is then the game's own: see docs/USAGE.md "Environments")
#   FAMILY     tiny model family: qwen2_5_vl (default) | qwen2_vl | qwen3_vl
#   OVERWRITE  1 = move an existing OUTDIR aside to OUTDIR.old-<time> first (otherwise a non-empty OUTDIR is an error)
#   PYTHON     interpreter (default: .venv/bin/python, created by scripts/setup.sh)
#   OMP_NUM_THREADS  torch CPU threads (default 1: fastest for the tiny model)
#   PPO_ITERATIONS  PPO iterations of the main run (default: its config's; 30 for VSI_BLOCK=mix)
#   NUMBERLINE 1 = beside VSI, the NumberLine block (default when ENV_CONFIG is unset): labels, SFT
#              stopped at NL_SFT_STEPS (200) with a checkpoint every NL_SFT_EVERY (50) steps; the warm
#              start is the latest one whose greedy success on NL_VAL_DEALS (40) validation deals is at
#              most NL_SFT_CAP (85) percent (else the earliest), so PPO has room to improve; PPO at
#              NL_PPO_LR (1e-4) for NL_PPO_ITERATIONS (100) with a KL penalty NL_PPO_KL (1.0) to the
#              frozen warm start, and the same rows with blind twins on NL_EVAL_DEALS (100) held-out deals
#   PARALLEL   1 = two steps at a time, one process each (default on 2 or more cores; every step is
#              single-threaded and seeded, so the results are those of a serial run)
#   VSI_BLOCK  rooms (default without ENV_CONFIG): VSI-Bench's room-size question
#              (configs/envs/vsi-room-size.yaml) with the build that reads a room's floor area from its
#              sweep (qwen2_5_vl-rooms, made on top of the default build), held-out rooms no stage trained
#              on; mix: all 8 question types with the default build, whose policies read nothing of a
#              room (docs/RESULTS.md)
#   VSI_TINY_SEED  the tiny builds' seed (default 0). The builds of seed 0 ship with the package and are
#              copied; another seed is built here (~2 min, and ~8 min more for the rooms build)
#   TINY_SHIPPED  0 = build the models here even where a shipped build is this code's (default 1)
# Every step logs to OUTDIR/logs/<step>.log; a failing step stops the script with its log's tail.
# The result: OUTDIR/eval/compare.md (table), compare.png (bars), learning_curves.png (PPO), and
# one report.json/report.md/tasks.png/trajectories/ per evaluated row under OUTDIR/eval/<row>/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,36p' "$0"
  exit 0
fi
OUT=${1:-outputs/quickstart}
PRESET=${PRESET:-cpu-demo}
FAMILY=${FAMILY:-qwen2_5_vl}
PY=${PYTHON:-.venv/bin/python}
VSI_BLOCK=${VSI_BLOCK:-$([ -z "${ENV_CONFIG:-}" ] && [ "$FAMILY" = qwen2_5_vl ] && echo rooms || echo mix)}
if [ "$VSI_BLOCK" != mix ] && [ "$VSI_BLOCK" != rooms ]; then
  echo "[quickstart] VSI_BLOCK=$VSI_BLOCK: choose mix (all question types) or rooms (room size, a build that reads rooms)" >&2
  exit 2
fi
if [ "$VSI_BLOCK" = rooms ] && { [ -n "${ENV_CONFIG:-}" ] || [ "$FAMILY" != qwen2_5_vl ]; }; then
  echo "[quickstart] VSI_BLOCK=rooms is a VSI block of the qwen2_5_vl family: leave ENV_CONFIG unset and FAMILY at qwen2_5_vl" >&2
  exit 2
fi
if [ -n "${ENV_CONFIG:-}" ] && [ ! -f "$ENV_CONFIG" ]; then
  echo "[quickstart] ENV_CONFIG=$ENV_CONFIG does not exist; env overlays: $(ls configs/envs/*.yaml | tr '\n' ' ')" >&2
  exit 2
fi
if [ ! -f "configs/$PRESET.yaml" ]; then
  echo "[quickstart] PRESET=$PRESET: no configs/$PRESET.yaml; known presets: $(cd configs && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')" >&2
  exit 2
fi

if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  if [ "${OVERWRITE:-0}" = "1" ]; then
    ASIDE="$OUT.old-$(date +%Y%m%d-%H%M%S)"
    mv -- "$OUT" "$ASIDE"
    echo "[quickstart] OVERWRITE=1: the run that was in $OUT was moved to $ASIDE" >&2
  else
    echo "[quickstart] $OUT already holds a run; pick another OUTDIR, or set OVERWRITE=1 (moves it to $OUT.old-<time>)" >&2
    exit 2
  fi
fi
mkdir -p "$OUT/logs"
LOGS=$OUT/logs

# Offline and quiet: nothing is downloaded, no tracker is contacted.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
export DS_ACCELERATOR=cpu
# The tiny model's matrices are a few dozen wide: one intra-op thread is as fast as two, and on a
# busy machine spinning OpenMP workers made generation ~25x slower in CPU time (measured).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}

T0=$SECONDS
# The NumberLine block runs with a VSI quickstart (not beside another env overlay) unless NUMBERLINE=0.
NUMBERLINE=${NUMBERLINE:-$([ -z "${ENV_CONFIG:-}" ] && echo 1 || echo 0)}
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)
PARALLEL=${PARALLEL:-$([ "$CORES" -ge 2 ] && echo 1 || echo 0)}
NL_SFT_STEPS=${NL_SFT_STEPS:-200}
NL_SFT_EVERY=${NL_SFT_EVERY:-50}
NL_SFT_CAP=${NL_SFT_CAP:-85}
NL_VAL_DEALS=${NL_VAL_DEALS:-40}
NL_PPO_LR=${NL_PPO_LR:-1e-4}
NL_PPO_KL=${NL_PPO_KL:-1.0}
# VSI's PPO changes no held-out answer of the mix on this model (docs/RESULTS.md): 30 iterations show the stage
# and keep the budget. The rooms block and an overlay take their config's.
PPO_ITERATIONS=${PPO_ITERATIONS:-$([ -z "${ENV_CONFIG:-}" ] && [ "$VSI_BLOCK" = mix ] && echo 30 || echo "")}
NL_PPO_ITERATIONS=${NL_PPO_ITERATIONS:-100}
NL_EVAL_DEALS=${NL_EVAL_DEALS:-100}
# step NAME COMMAND...: run one step, its output into $LOGS/NAME.log, one line when it ends (the two
# blocks' lines interleave when they run side by side); stop with the log's tail on failure.
step() {
  local name=$1
  shift
  local start=$SECONDS
  if "$@" > "$LOGS/$name.log" 2>&1; then
    printf '[quickstart] %4ds  %-16s ok (%ds)\n' "$((SECONDS - T0))" "$name" "$((SECONDS - start))" >&2
  else
    local rc=$?
    {
      printf '[quickstart] %4ds  %-16s FAILED (exit %d after %ds)\n' "$((SECONDS - T0))" "$name" "$rc" "$((SECONDS - start))"
      echo "[quickstart] step '$name' failed: $*"
      echo "[quickstart] last lines of $LOGS/$name.log:"
      tail -n 40 "$LOGS/$name.log"
    } >&2
    exit 1
  fi
}

step setup bash scripts/setup.sh
if [ ! -x "$PY" ]; then
  echo "[quickstart] $PY does not exist after scripts/setup.sh; set PYTHON to the environment's interpreter" >&2
  exit 1
fi

# Background steps: at most SLOTS at a time (one process per core: each step is single-threaded). A
# failing step stops the script, and any exit stops every step still running (its process, then its shell).
SLOTS=$([ "$PARALLEL" = "1" ] && echo 2 || echo 1)
declare -A RUNNING=()  # pid -> what runs there
stop_background() {
  local pid
  for pid in $(jobs -p); do
    pkill -TERM -P "$pid" 2>/dev/null
    kill "$pid" 2>/dev/null
  done
  true
}
trap stop_background EXIT
# reap: wait until one background job ends; stop if it failed
reap() {
  local rc=0 ended=
  [ "${#RUNNING[@]}" -gt 0 ] || return 0
  wait -n -p ended "${!RUNNING[@]}" || rc=$?
  [ -n "$ended" ] || return 0
  local what=${RUNNING[$ended]}
  unset "RUNNING[$ended]"
  if [ "$rc" != 0 ]; then
    echo "[quickstart] $what failed (exit $rc; its step's log tail is above)" >&2
    exit 1
  fi
}
# spawn WHAT COMMAND...: run COMMAND in the background as soon as fewer than SLOTS jobs run
spawn() {
  local what=$1
  shift
  while [ "${#RUNNING[@]}" -ge "$SLOTS" ]; do reap; done
  "$@" &
  RUNNING[$!]=$what
}
# is_running WHAT: whether the background job WHAT runs; others_running WHAT: whether another job does
is_running() {
  local what
  for what in "${RUNNING[@]}"; do [ "$what" = "$1" ] && return 0; done
  return 1
}
others_running() {
  local what
  for what in "${RUNNING[@]}"; do [ "$what" != "$1" ] && return 0; done
  return 1
}
# finish WHAT: wait until the background job WHAT has ended
finish() {
  while is_running "$1"; do reap; done
}

# The models. The builds that ship with the package are copied when they are this code's builds of this
# seed (python -m a2c_ppo_acktr.tiny.shipped --check); other seeds, or TINY_SHIPPED=0, build them here.
SEED=${VSI_TINY_SEED:-0}
TINY_FLAGS=()
if [ "${TINY_SHIPPED:-1}" = "1" ]; then TINY_FLAGS=(--shipped); fi
MODEL=$OUT/model
ROOMS_MODEL=$OUT/model-rooms
ROOMS_SAMPLES=$OUT/model-rooms-samples.npz
ROOMS_ARGS=()
if [ "$VSI_BLOCK" = rooms ] && [ "$PARALLEL" = "1" ] && ! { [ "${TINY_SHIPPED:-1}" = "1" ] &&
  "$PY" -m a2c_ppo_acktr.tiny.shipped --check --family qwen2_5_vl-rooms --seed "$SEED" > /dev/null 2>&1; }; then
  # The rooms build is built here: its 1000 rooms are drawn on the core the default build leaves idle.
  spawn "rendering the rooms build's samples" \
    step tiny-rooms-render "$PY" -m a2c_ppo_acktr.tiny --family qwen2_5_vl-rooms --render-samples "$ROOMS_SAMPLES"
  ROOMS_ARGS=(--samples "$ROOMS_SAMPLES")
fi
step tiny-model "$PY" -m a2c_ppo_acktr.tiny --family "$FAMILY" --out "$MODEL" "${TINY_FLAGS[@]}"
COMMON=(--preset "$PRESET" --model.model_path "$MODEL" --log.progress_bar false)
if [ -n "${ENV_CONFIG:-}" ]; then COMMON+=(--config "$ENV_CONFIG"); fi

# eval_row PREFIX DIR ROW ADAPTER CKPT ARGS...: one row of a block's table into DIR/ROW (ROW: dummy, oracle,
# base, sft, sft_zeroed, ppo, ppo_zeroed). The blind twins (_zeroed) see the same prompts and tokens with
# every frame zeroed: what a row scores above its twin is what it reads from the pixels.
eval_row() {
  local prefix=$1 dir=$2 row=$3 adapter=$4 ckpt=$5
  shift 5
  case $row in
    dummy) step "${prefix}eval-dummy" "$PY" eval_vsi.py "$@" --dummy --name dummy --out "$dir/dummy" ;;
    oracle) step "${prefix}eval-oracle" "$PY" eval_vsi.py "$@" --oracle --name oracle --out "$dir/oracle" ;;
    base) step "${prefix}eval-base" "$PY" eval_vsi.py "$@" --name "tiny base" --out "$dir/base" ;;
    sft) step "${prefix}eval-sft" "$PY" eval_vsi.py "$@" --adapter "$adapter" --name "tiny + SFT" --out "$dir/sft" ;;
    sft_zeroed) step "${prefix}eval-sft-zero" "$PY" eval_vsi.py "$@" --adapter "$adapter" --zero-images \
      --name "tiny + SFT (zeroed images)" --out "$dir/sft_zeroed" ;;
    ppo) step "${prefix}eval-ppo" "$PY" eval_vsi.py "$@" --checkpoint "$ckpt" --name "tiny + SFT + PPO" --out "$dir/ppo" ;;
    ppo_zeroed) step "${prefix}eval-ppo-zero" "$PY" eval_vsi.py "$@" --checkpoint "$ckpt" --zero-images \
      --name "tiny + SFT + PPO (zeroed images)" --out "$dir/ppo_zeroed" ;;
    *)
      echo "[quickstart] eval_row: no row $row" >&2
      exit 1
      ;;
  esac
}
# compare DIR METRICS LOG [ARGS...]: the seven rows side by side, the paired differences (ARGS: more flags)
compare() {
  local dir=$1 metrics=$2 log=$3
  shift 3
  "$PY" eval_vsi.py --compare "$dir"/{dummy,base,sft,sft_zeroed,ppo,ppo_zeroed,oracle}/report.json \
    --paired "tiny + SFT + PPO" "tiny + SFT" \
    --paired "tiny + SFT" "tiny + SFT (zeroed images)" \
    --paired "tiny + SFT + PPO" "tiny + SFT + PPO (zeroed images)" \
    --metrics "$metrics" --out "$dir" "$@" \
    > "$log" 2>&1 || { echo "[quickstart] the comparison failed:" >&2; tail -n 40 "$log" >&2; exit 1; }
}
# last_checkpoint DIR: the newest checkpoint under DIR/checkpoints (stops when there is none)
last_checkpoint() {
  local ckpt
  ckpt=$(ls -d "$1"/checkpoints/checkpoint-* 2>/dev/null | sort | tail -n 1)
  if [ -z "$ckpt" ]; then
    echo "[quickstart] main_vsi.py finished but wrote no checkpoint under $1/checkpoints (see its log in $LOGS)" >&2
    exit 1
  fi
  echo "$ckpt"
}
# The NumberLine block (VSI runs only): the default build's vision is pre-trained on NumberLine frames, so
# there its policies read the image. SFT stops early to leave PPO room to improve; the KL penalty to the
# frozen SFT policy keeps PPO from breaking the reply format (bench/README.md).
numberline_block() {
  NLARGS=(--preset "$PRESET" --model.model_path "$MODEL" --log.progress_bar false --config configs/envs/numberline.yaml)
  step nl-label "$PY" vlm_traj_label.py "${NLARGS[@]}" --label.teacher oracle --label.out_dir "$NL/labels"
  step nl-preprocess "$PY" vlm_traj_preprocess.py "${NLARGS[@]}" --label.out_dir "$NL/labels" --label.dataset_dir "$NL/sft_data"
  step nl-sft "$PY" train_sft.py "${NLARGS[@]}" --sft.data_path "$NL/sft_data" --sft.output_dir "$NL/sft" \
    --sft.max_steps "$NL_SFT_STEPS" --sft.save_steps "$NL_SFT_EVERY" --sft.save_total_limit $((NL_SFT_STEPS / NL_SFT_EVERY + 1))
  # The warm start: SFT's latest checkpoint whose greedy success on NL_VAL_DEALS validation deals (seeds
  # from 900000, apart from training and evaluation) is at most NL_SFT_CAP percent, else its earliest.
  local cands=("$NL_SFT_STEPS:$NL/sft/adapter") c k rc row nlsft=
  for ((k = (NL_SFT_STEPS - 1) / NL_SFT_EVERY * NL_SFT_EVERY; k >= NL_SFT_EVERY; k -= NL_SFT_EVERY)); do
    cands+=("$k:$NL/sft/checkpoint-$k")
  done
  for c in "${cands[@]}"; do
    k=${c%%:*}
    nlsft=${c#*:}
    step "nl-val-sft-$k" "$PY" eval_vsi.py "${NLARGS[@]}" --adapter "$nlsft" --eval.num_episodes "$NL_VAL_DEALS" \
      --eval.seed 900000 --name "tiny + SFT, step $k (validation)" --out "$NL/validation/sft-$k"
    rc=0
    "$PY" -m a2c_ppo_acktr.eval.warm_start "$NL/validation/sft-$k/report.json" --cap "$NL_SFT_CAP" \
      >> "$LOGS/nl-warm-start.log" 2>&1 || rc=$?
    if [ "$rc" = 0 ]; then break; fi
    if [ "$rc" != 1 ]; then
      echo "[quickstart] choosing the NumberLine warm start failed:" >&2
      tail -n 5 "$LOGS/nl-warm-start.log" >&2
      exit 1
    fi
  done
  echo "warm start: $nlsft" >> "$LOGS/nl-warm-start.log"
  step nl-ppo "$PY" main_vsi.py "${NLARGS[@]}" --sft-adapter "$nlsft" --log.output_dir "$NL/ppo" \
    --ppo.lr "$NL_PPO_LR" --ppo.num_iterations "$NL_PPO_ITERATIONS" \
    --ppo.reference ema --ppo.ema_decay 1 --ppo.kl_coef "$NL_PPO_KL"
  local ckpt
  ckpt=$(last_checkpoint "$NL/ppo")
  for row in dummy oracle base sft ppo sft_zeroed ppo_zeroed; do
    eval_row nl- "$NLEVAL" "$row" "$nlsft" "$ckpt" "${NLARGS[@]}" --eval.num_episodes "$NL_EVAL_DEALS"
  done
  compare "$NLEVAL" "$NL/ppo/metrics.jsonl" "$LOGS/nl-compare.log"
}

NL=$OUT/numberline
NLEVAL=$NL/eval
if [ "$NUMBERLINE" = "1" ] && [ "$PARALLEL" = "1" ]; then
  echo "[quickstart] the VSI and NumberLine blocks run side by side (PARALLEL=0: one after the other)" >&2
  spawn numberline numberline_block
fi

if [ "$VSI_BLOCK" = rooms ]; then
  # The room-reading build: the default build's weights, then its own vision stage on room sizes.
  finish "rendering the rooms build's samples"
  step tiny-rooms "$PY" -m a2c_ppo_acktr.tiny --family qwen2_5_vl-rooms --base "$MODEL" --out "$ROOMS_MODEL" \
    "${TINY_FLAGS[@]}" "${ROOMS_ARGS[@]}"
  rm -f "$ROOMS_SAMPLES"
  COMMON=(--preset "$PRESET" --config configs/envs/vsi-room-size.yaml --model.model_path "$ROOMS_MODEL"
    --log.progress_bar false)
fi
step label "$PY" vlm_traj_label.py "${COMMON[@]}" --label.teacher oracle --label.out_dir "$OUT/labels"
step preprocess "$PY" vlm_traj_preprocess.py "${COMMON[@]}" --label.out_dir "$OUT/labels" --label.dataset_dir "$OUT/sft_data"
step sft "$PY" train_sft.py "${COMMON[@]}" --sft.data_path "$OUT/sft_data" --sft.output_dir "$OUT/sft"
ADAPTER=$OUT/sft/adapter
if [ ! -d "$ADAPTER" ]; then
  echo "[quickstart] train_sft.py finished but wrote no adapter at $ADAPTER (see $LOGS/sft.log)" >&2
  exit 1
fi
PPO_ARGS=()
if [ -n "$PPO_ITERATIONS" ]; then PPO_ARGS=(--ppo.num_iterations "$PPO_ITERATIONS"); fi
EVAL=$OUT/eval
# PPO, and beside it the rows that need no PPO policy as soon as a core is free (the NumberLine block
# ends or PPO does), then the PPO policy and its twin.
spawn PPO step ppo "$PY" main_vsi.py "${COMMON[@]}" --sft-adapter "$ADAPTER" --log.output_dir "$OUT/ppo" "${PPO_ARGS[@]}"
for row in dummy oracle base sft sft_zeroed; do
  spawn "the $row evaluation" eval_row "" "$EVAL" "$row" "$ADAPTER" - "${COMMON[@]}"
done
finish PPO
CKPT=$(last_checkpoint "$OUT/ppo")
for row in ppo ppo_zeroed; do
  spawn "the $row evaluation" eval_row "" "$EVAL" "$row" "$ADAPTER" "$CKPT" "${COMMON[@]}"
done
while others_running numberline; do reap; done
# VSI: with the best constant answer per question type, chosen in hindsight on these questions, and
# each trained policy paired with it (what a policy scores above it is not one answer given to all).
BEST=()
if [ -z "${ENV_CONFIG:-}" ]; then
  BEST=(--best-constant --paired "tiny + SFT" "best constant (hindsight)"
    --paired "tiny + SFT + PPO" "best constant (hindsight)")
fi
compare "$EVAL" "$OUT/ppo/metrics.jsonl" "$LOGS/compare.log" "${BEST[@]}"

if [ "$NUMBERLINE" = "1" ]; then
  if [ "$PARALLEL" = "1" ]; then
    finish numberline
  else
    numberline_block
  fi
fi
echo
cat "$EVAL/compare.md"
if [ "$NUMBERLINE" = "1" ]; then
  echo
  echo "## NumberLine block"
  echo
  cat "$NLEVAL/compare.md"
fi
echo
echo "[quickstart] done in $((SECONDS - T0))s. Reports:"
echo "  comparison:      $EVAL/compare.md, $EVAL/compare.png"
echo "  PPO curves:      $EVAL/learning_curves.png (metrics: $OUT/ppo/metrics.jsonl)"
echo "  per row:         $EVAL/<dummy|base|sft|sft_zeroed|ppo|ppo_zeroed|oracle>/report.md, tasks.png, trajectories/"
if [ "$NUMBERLINE" = "1" ]; then
  echo "  NumberLine:      $NLEVAL/compare.md, $NLEVAL/compare.png, $NLEVAL/learning_curves.png"
fi
echo "  logs:            $LOGS/"
echo "The tiny model is tiny: its rows show the pipeline works and whether a policy reads its frames, not what a real VLM scores."
