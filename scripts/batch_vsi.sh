#!/usr/bin/env bash
#SBATCH --job-name=vsi-ppo
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=48:00:00
#SBATCH --output=slurm-%x-%j.out
#SBATCH --requeue
#SBATCH --signal=B:TERM@900
# PPO training on a SLURM cluster, one or many nodes: one task per node, each running
# scripts/run_vsi_qwen.sh (accelerate launch with one process per GPU of its node).
#
# Usage (submit from the repository root):
#   sbatch scripts/batch_vsi.sh SEED NAME OUTDIR [PORT]
#   sbatch --nodes 4 --gpus-per-node 8 scripts/batch_vsi.sh 1 qwen3b-s1 outputs 29500
# PRESET, MODEL_PATH, SFT_ADAPTER, EXTRA_ARGS, DS_STAGE, PYTHON are passed through to
# run_vsi_qwen.sh (see its header). GPUS_PER_NODE overrides the GPU count (default: from
# SLURM_GPUS_ON_NODE, else nvidia-smi on the first node; nodes are assumed identical).
# Preemption and the time limit: SLURM signals this script 900 s before the end (--signal; raise it
# if an iteration plus a checkpoint takes longer). The script writes OUTDIR/NAME/STOP; every process
# finishes its iteration, the run writes a checkpoint and exits 75, and the script requeues the job,
# which continues with --resume auto (run_vsi_qwen.sh's default).
# Rollouts through vLLM: ROLLOUT_SERVER=1 starts one server per GPU on every node (its ranks use their
# own node's), ROLLOUT_URL names running ones (run_vsi_qwen.sh's header).
set -euo pipefail

if [ "$#" -lt 3 ] || [ "$#" -gt 4 ]; then
  sed -n '10,22p' "$0" >&2
  exit 2
fi
SEED=$1
NAME=$2
OUTDIR=$3
PORT=${4:-29500}

# sbatch runs a copy of this file from the spool directory: find the repository from the submit dir.
REPO=${REPO_DIR:-${SLURM_SUBMIT_DIR:-$(pwd)}}
cd "$REPO"
if [ ! -f main_vsi.py ]; then
  echo "$REPO is not the repository root (no main_vsi.py); submit from there or set REPO_DIR" >&2
  exit 2
fi

if [ -z "${SLURM_JOB_NODELIST:-}" ]; then
  echo "not inside a SLURM allocation; submit with sbatch, or use scripts/run_vsi_qwen.sh on one node" >&2
  exit 2
fi
# sed, not head: head exits early and pipefail then fails the job on SIGPIPE (exit 141).
MAIN_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
NUM_MACHINES=${SLURM_NNODES:-1}
if [ -z "${GPUS_PER_NODE:-}" ]; then
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
    GPUS_PER_NODE=$SLURM_GPUS_ON_NODE
  else
    GPUS_PER_NODE=$(nvidia-smi -L | grep -c '^GPU')
  fi
fi
export MAIN_ADDR NUM_MACHINES
export NUM_GPUS=$GPUS_PER_NODE
mkdir -p "$OUTDIR"
# The model once, from this (the first) node, into the shared HF cache; every task then runs offline.
# shellcheck source=scripts/common.sh
. scripts/common.sh
vsi_python
prefetch=(--preset "${PRESET:-qwen2.5-vl-3b}")
if [ -n "${ENV_CONFIG:-}" ]; then prefetch+=(--config "$ENV_CONFIG"); fi
if [ -n "${MODEL_PATH:-}" ]; then prefetch+=(--model-path "$MODEL_PATH"); fi
vsi_prefetch_model "${prefetch[@]}"
echo "[batch_vsi] $NUM_MACHINES node(s) x $NUM_GPUS GPUs, main $MAIN_ADDR:$PORT" >&2

# One task per node; MACHINE_RANK must be read inside each task (SLURM_NODEID differs per node),
# hence the single quotes: the variables expand in the task's shell, not here.
# shellcheck disable=SC2016
RUN_DIR="$OUTDIR/$NAME"
stop_run() {
  echo "[batch_vsi] SIGTERM: asking the run to checkpoint and stop ($RUN_DIR/STOP)" >&2
  mkdir -p "$RUN_DIR" && touch "$RUN_DIR/STOP"
}
trap stop_run TERM
srun --ntasks="$NUM_MACHINES" --ntasks-per-node=1 --kill-on-bad-exit=1 \
  bash -c 'MACHINE_RANK=$SLURM_NODEID exec bash scripts/run_vsi_qwen.sh "$0" "$1" "$2" "$3"' \
  "$SEED" "$NAME" "$OUTDIR" "$PORT" &
SRUN_PID=$!
# A trapped signal interrupts `wait`: wait again until srun itself has ended.
set +e
while :; do
  wait "$SRUN_PID"
  rc=$?
  kill -0 "$SRUN_PID" 2>/dev/null || break
done
set -e
# 75: stopped by the signal; 69: its rollout server died (a checkpoint was written; a requeued job
# starts a fresh server with ROLLOUT_SERVER=1). Both continue with --resume auto.
if [ "$rc" -eq 75 ] || { [ "$rc" -eq 69 ] && [ "${ROLLOUT_SERVER:-0}" = 1 ]; }; then
  echo "[batch_vsi] the run stopped with a checkpoint (exit $rc); requeueing job ${SLURM_JOB_ID:-?}" >&2
  scontrol requeue "${SLURM_JOB_ID:?}"
fi
exit "$rc"
