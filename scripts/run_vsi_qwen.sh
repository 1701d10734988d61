#!/usr/bin/env bash
# PPO training of a Qwen-VL policy under accelerate + DeepSpeed ZeRO-2 on the GPUs of one node
# (also the per-node launcher used by scripts/batch_vsi.sh on SLURM).
#
# Usage:  bash scripts/run_vsi_qwen.sh SEED NAME OUTDIR PORT
#   SEED    run seed (--seed)
#   NAME    run name (wandb/tensorboard); outputs go to OUTDIR/NAME
#   OUTDIR  parent directory of the run directory
#   PORT    main process port for torch.distributed (pick a free one per concurrent run)
#
# Environment variables (all optional):
#   PRESET        config preset under configs/ (default qwen2.5-vl-3b)
#   MODEL_PATH    model to train (HF id or local dir); overrides the preset's model.model_path
#   SFT_ADAPTER   LoRA adapter directory from train_sft.py to warm-start from
#   EXTRA_ARGS    more overrides, word-split, e.g. "--ppo.lr 2e-5 --rollout.num_envs 8"
#   DS_STAGE      2 (default; scripts/config_zero2.yaml) or 3 (scripts/config_zero3.yaml)
#   NUM_GPUS      processes on this node (default: GPUs in CUDA_VISIBLE_DEVICES, else nvidia-smi -L)
#   NUM_MACHINES  nodes in the job (default 1); MACHINE_RANK (default $SLURM_NODEID or 0);
#   MAIN_ADDR     address of the rank-0 node (default 127.0.0.1)
#   ENV_CONFIG    env overlay under configs/envs/ (another env than VSI; scripts/run_<env>_qwen.sh set it)
#   PYTHON        interpreter (default .venv/bin/python when present, else python)
#   RESUME        auto (default: continue from the latest complete checkpoint) | none | PATH
#   ROLLOUT_URL   roll out through running vLLM servers (rollout.engine=vllm), e.g. http://node1:8000
#   ROLLOUT_SERVER 1 = start this node's vLLM servers first, one per GPU (ROLLOUT_TP, ROLLOUT_PORT,
#                 ROLLOUT_GPU_MEMORY, ROLLOUT_MAX_MODEL_LEN, VLLM_PYTHON, ROLLOUT_START_TIMEOUT:
#                 scripts/common.sh, vsi_rollout_engine)
# Before the ranks start, the model is fetched once into the HF cache and the ranks run with
# HF_HUB_OFFLINE=1; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and OMP_NUM_THREADS = cores /
# processes unless set (scripts/common.sh, vsi_gpu_env, also lists the NCCL interface variables).
set -euo pipefail

if [ "$#" -ne 4 ]; then
  sed -n '2,29p' "$0" >&2
  exit 2
fi
SEED=$1
NAME=$2
OUTDIR=$3
PORT=$4

# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# Paths given relative to the caller's directory stay valid after the cd to the repository root.
OUTDIR=$(vsi_abspath "$OUTDIR" always)
if [ -n "${SFT_ADAPTER:-}" ]; then SFT_ADAPTER=$(vsi_abspath "$SFT_ADAPTER" always); fi
if [ -n "${MODEL_PATH:-}" ]; then MODEL_PATH=$(vsi_abspath "$MODEL_PATH" if-exists); fi  # else an HF hub id
if [ -n "${RESUME:-}" ] && [ "$RESUME" != auto ] && [ "$RESUME" != none ]; then RESUME=$(vsi_abspath "$RESUME" always); fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PRESET=${PRESET:-qwen2.5-vl-3b}
DS_STAGE=${DS_STAGE:-2}
case "$DS_STAGE" in
  2) ACCEL_CONFIG=scripts/config_zero2.yaml; DS_JSON=scripts/ds_config.json ;;
  3) ACCEL_CONFIG=scripts/config_zero3.yaml; DS_JSON=scripts/ds_config_zero3.json ;;
  *) echo "DS_STAGE=$DS_STAGE: use 2 or 3" >&2; exit 2 ;;
esac

vsi_python
vsi_num_gpus "python main_vsi.py --preset debug"
NUM_MACHINES=${NUM_MACHINES:-1}
MACHINE_RANK=${MACHINE_RANK:-${SLURM_NODEID:-0}}
MAIN_ADDR=${MAIN_ADDR:-127.0.0.1}
NUM_PROCESSES=$((NUM_MACHINES * NUM_GPUS))

args=(
  main_vsi.py
  --preset "$PRESET"
  --seed "$SEED"
  --log.run_name "$NAME"
  --log.output_dir "$OUTDIR/$NAME"
  --dist.zero_stage "$DS_STAGE"
  --dist.deepspeed_config "$DS_JSON"
  --resume "${RESUME:-auto}"
)
if [ -n "${SFT_ADAPTER:-}" ]; then args+=(--sft-adapter "$SFT_ADAPTER"); fi
vsi_append_overrides

prefetch=(--preset "$PRESET")
if [ -n "${ENV_CONFIG:-}" ]; then prefetch+=(--config "$ENV_CONFIG"); fi
if [ -n "${MODEL_PATH:-}" ]; then prefetch+=(--model-path "$MODEL_PATH"); fi
vsi_prefetch_model "${prefetch[@]}"
vsi_rollout_engine "$OUTDIR/$NAME" "${args[@]:1}"
vsi_gpu_env "$NUM_GPUS"
echo "[run_vsi_qwen] node $MACHINE_RANK/$NUM_MACHINES, $NUM_GPUS GPUs here, $NUM_PROCESSES processes, main $MAIN_ADDR:$PORT" >&2
# Not exec'd when a rollout server was started here: the launcher's EXIT trap stops it.
exec_or_run=exec
if [ -n "${ROLLOUT_SERVER_PIDS[*]:-}" ]; then exec_or_run=; fi
$exec_or_run "$PYTHON" -m accelerate.commands.launch \
  --config_file "$ACCEL_CONFIG" \
  --num_machines "$NUM_MACHINES" \
  --num_processes "$NUM_PROCESSES" \
  --machine_rank "$MACHINE_RANK" \
  --main_process_ip "$MAIN_ADDR" \
  --main_process_port "$PORT" \
  --deepspeed_multinode_launcher standard \
  "${args[@]}"
