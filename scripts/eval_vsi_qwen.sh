#!/usr/bin/env bash
# Evaluate a Qwen-VL agent on a GPU node (one process, bf16) and write the benchmark's reports.
#
# Usage:  bash scripts/eval_vsi_qwen.sh SEED NAME OUTDIR PORT [EXTRA eval_vsi.py ARGS...]
#         OUT=DIR bash scripts/eval_vsi_qwen.sh [EXTRA eval_vsi.py ARGS...]
#   SEED NAME OUTDIR PORT  the run scripts' (and RL4VLM's) four arguments: SEED seeds the evaluated
#           question set (--eval.seed), the reports go to OUTDIR/NAME/eval (or OUT), PORT is accepted
#           for symmetry with the launches (one process needs no port)
#
# Environment variables (all optional):
#   PRESET      config preset under configs/ (default qwen2.5-vl-3b); sets env/eval sizes
#   MODEL_PATH  base model (HF id or local dir); default: the preset's model.model_path
#   ADAPTER     SFT LoRA adapter directory (train_sft.py output) loaded on the base model
#   CHECKPOINT  PPO checkpoint directory (main_vsi.py: <run>/checkpoints/checkpoint-N); its run's
#               model settings are used unless MODEL_PATH is set. Use ADAPTER or CHECKPOINT, not both.
#   OUT         output directory (default OUTDIR/NAME/eval; without the four arguments OUT is required:
#               reports are never written inside the repository by default)
#   VSIBENCH    VSI-Bench rows (parquet/JSON) to evaluate instead of procedural questions;
#   DATA_ROOT   ... and the directory holding their scans (required with VSIBENCH)
#   NUM_EPISODES  procedural questions (default: the preset's eval.num_episodes)
#   BATCH_SIZE    episodes stepped together (default: the preset's eval.batch_size)
#   BLIND=1     withhold images (text-only baseline)
#   DTYPE       bfloat16 (default) | float16 | float32
#   DEVICE      cuda (default) | auto | cpu
#   ENV_CONFIG  env overlay under configs/envs/ (another env than VSI; scripts/eval_<env>_qwen.sh set it)
#   PYTHON      interpreter (default .venv/bin/python when present, else python)
# Examples:
#   MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct PRESET=qwen2.5-vl-7b bash scripts/eval_vsi_qwen.sh 1 base7b /data/eval 0
#   CHECKPOINT=/data/runs/run1/checkpoints/checkpoint-000200 bash scripts/eval_vsi_qwen.sh 1 run1 /data/runs 0
#   ADAPTER=/data/sft/adapter VSIBENCH=data/vsibench/test.parquet DATA_ROOT=data/scans OUT=/data/eval/sft bash scripts/eval_vsi_qwen.sh
# Compare the runs afterwards:
#   python eval_vsi.py compare /data/runs/*/eval/report.json --out /data/eval/compare
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,33p' "$0"
  exit 0
fi
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# The four positional arguments, when given (the first argument is not an option).
SEED="" NAME=""
if [ "$#" -ge 1 ] && [ "${1#-}" = "$1" ]; then
  if [ "$#" -lt 4 ]; then
    echo "eval_vsi_qwen.sh: expected SEED NAME OUTDIR PORT (got $# argument(s): $*); or set OUT and pass eval_vsi.py options only" >&2
    exit 2
  fi
  SEED=$1 NAME=$2 OUTDIR=$3
  shift 4
  OUTDIR=$(vsi_abspath "$OUTDIR" always)
  OUT=${OUT:-$OUTDIR/$NAME/eval}
fi
if [ -z "${OUT:-}" ]; then
  echo "eval_vsi_qwen.sh: pass SEED NAME OUTDIR PORT (reports in OUTDIR/NAME/eval) or set OUT=DIR" >&2
  exit 2
fi
OUT=$(vsi_abspath "$OUT" always)
for p in ADAPTER CHECKPOINT VSIBENCH DATA_ROOT MODEL_PATH; do  # relative to the caller's directory
  if [ -n "${!p:-}" ]; then printf -v "$p" '%s' "$(vsi_abspath "${!p}" if-exists)"; fi
done
cd "$(dirname "${BASH_SOURCE[0]}")/.."
vsi_python
if [ -n "${ADAPTER:-}" ] && [ -n "${CHECKPOINT:-}" ]; then
  echo "eval_vsi_qwen.sh: set ADAPTER or CHECKPOINT, not both (a PPO checkpoint already holds its adapter)" >&2
  exit 2
fi
if [ -n "${VSIBENCH:-}" ] && [ -z "${DATA_ROOT:-}" ]; then
  echo "eval_vsi_qwen.sh: VSIBENCH=$VSIBENCH needs DATA_ROOT (the directory with the scans)" >&2
  exit 2
fi

PRESET=${PRESET:-qwen2.5-vl-3b}

args=(eval_vsi.py --preset "$PRESET" --out "$OUT" --model.dtype "${DTYPE:-bfloat16}" --model.device "${DEVICE:-cuda}")
if [ -n "$SEED" ]; then args+=(--eval.seed "$SEED" --name "$NAME"); fi
if [ -n "${MODEL_PATH:-}" ]; then args+=(--model-path "$MODEL_PATH"); fi
if [ -n "${ADAPTER:-}" ]; then args+=(--adapter "$ADAPTER"); fi
if [ -n "${CHECKPOINT:-}" ]; then args+=(--checkpoint "$CHECKPOINT"); fi
if [ -n "${VSIBENCH:-}" ]; then args+=(--vsibench "$VSIBENCH" --data-root "$DATA_ROOT"); fi
if [ -n "${NUM_EPISODES:-}" ]; then args+=(--eval.num_episodes "$NUM_EPISODES"); fi
if [ -n "${BATCH_SIZE:-}" ]; then args+=(--eval.batch_size "$BATCH_SIZE"); fi
if [ "${BLIND:-0}" = "1" ]; then args+=(--blind); fi
vsi_append_env_config

export TOKENIZERS_PARALLELISM=false
echo "[eval_vsi_qwen] $PYTHON ${args[*]} $*" >&2
exec "$PYTHON" "${args[@]}" "$@"
