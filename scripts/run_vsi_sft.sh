#!/usr/bin/env bash
# SFT warm start: train the policy's LoRA adapter on teacher trajectories, on the GPUs of one node
# (torchrun + DeepSpeed ZeRO through the HF Trainer).
#
# Usage:  bash scripts/run_vsi_sft.sh OUTDIR
#   OUTDIR  where checkpoints go; the final adapter is OUTDIR/adapter
#           (then: bash scripts/run_vsi_qwen.sh ... with SFT_ADAPTER=OUTDIR/adapter,
#            or python main_vsi.py --sft-adapter OUTDIR/adapter)
#
# Environment variables:
#   DATA_PATH    (required) dataset folder from vlm_traj_preprocess.py (train.jsonl, val.jsonl)
#                or one JSONL file
#   MODEL_PATH   base model (HF id, local dir or tiny:<family>); default: the preset's model.model_path
#   PRESET       config preset under configs/ (default qwen2.5-vl-3b)
#   DS_STAGE     0 = no DeepSpeed, 2 (default) = ZeRO-2 with scripts/ds_config.json,
#                3 = ZeRO-3 with scripts/ds_config_zero3.json
#   NUM_GPUS     processes (default: GPUs in CUDA_VISIBLE_DEVICES, else nvidia-smi -L)
#   PORT         main process port (default 29511)
#   RESUME       auto (default: continue from the latest OUTDIR/checkpoint-*) | none | PATH
#   EXTRA_ARGS   more overrides, word-split, e.g. "--sft.lr 1e-4 --sft.num_epochs 2"
#   ENV_CONFIG    env overlay under configs/envs/ (another env than VSI; scripts/run_<env>_sft.sh set it)
#   PYTHON       interpreter (default .venv/bin/python when present, else python)
#
# Pipeline:  python vlm_traj_label.py --preset P --label.teacher openai --label.model M --label.out_dir LABELS
#            python vlm_traj_preprocess.py --preset P --label.out_dir LABELS --label.dataset_dir DATA
#            DATA_PATH=DATA bash scripts/run_vsi_sft.sh OUTDIR
set -euo pipefail

if [ "$#" -ne 1 ]; then
  sed -n '2,26p' "$0" >&2
  exit 2
fi
OUTDIR=$1
if [ -z "${DATA_PATH:-}" ]; then
  echo "DATA_PATH is not set: point it at the folder written by vlm_traj_preprocess.py" >&2
  exit 2
fi

# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# Paths given relative to the caller's directory stay valid after the cd to the repository root.
OUTDIR=$(vsi_abspath "$OUTDIR" always)
DATA_PATH=$(vsi_abspath "$DATA_PATH" always)
if [ -n "${MODEL_PATH:-}" ]; then MODEL_PATH=$(vsi_abspath "$MODEL_PATH" if-exists); fi  # else a hub id
if [ -n "${RESUME:-}" ] && [ "$RESUME" != auto ] && [ "$RESUME" != none ]; then RESUME=$(vsi_abspath "$RESUME" always); fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PRESET=${PRESET:-qwen2.5-vl-3b}
DS_STAGE=${DS_STAGE:-2}
case "$DS_STAGE" in
  0) DS_ARGS=(--dist.zero_stage 0) ;;
  2) DS_ARGS=(--dist.zero_stage 2 --dist.deepspeed_config scripts/ds_config.json) ;;
  3) DS_ARGS=(--dist.zero_stage 3 --dist.deepspeed_config scripts/ds_config_zero3.json) ;;
  *) echo "DS_STAGE=$DS_STAGE: use 0, 2 or 3" >&2; exit 2 ;;
esac

vsi_python
vsi_num_gpus "python train_sft.py --preset debug --sft.data_path \$DATA_PATH --sft.output_dir $OUTDIR"

case "${RESUME:-auto}" in
  none) RESUME_ARGS=() ;;
  *) RESUME_ARGS=(--sft.resume "${RESUME:-auto}") ;;
esac

args=(
  train_sft.py
  --preset "$PRESET"
  --sft.data_path "$DATA_PATH"
  --sft.output_dir "$OUTDIR"
  "${DS_ARGS[@]}"
  "${RESUME_ARGS[@]}"
)
vsi_append_overrides

# torchrun starts the processes (it sets RANK/WORLD_SIZE/MASTER_ADDR, which DeepSpeed needs even
# for one process); DeepSpeed itself is configured by the Trainer from dist.deepspeed_config, with
# the batch sizes filled from the sft section. On CPU (smoke tests): NUM_GPUS=2 DS_ACCELERATOR=cpu
# PRESET=debug bash scripts/run_vsi_sft.sh OUTDIR.
echo "[run_vsi_sft] $NUM_GPUS processes, data $DATA_PATH, output $OUTDIR" >&2
exec "$PYTHON" -m torch.distributed.run \
  --nproc_per_node "$NUM_GPUS" \
  --master_addr 127.0.0.1 \
  --master_port "${PORT:-29511}" \
  "${args[@]}"
