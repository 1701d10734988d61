#!/usr/bin/env bash
# GPU smoke test: run this first on a GPU node, before any real training. A few minutes with the
# offline tiny model (nothing is downloaded); it checks, in order:
#   1. environment  torch/CUDA build, the GPUs, bf16 support, flash-attn, DeepSpeed
#   2. ratio        tiny model in bf16 on CUDA, sdpa (and flash_attention_2 when flash_attn imports):
#                   the first PPO minibatch's max |ratio - 1| stays under the bf16 bound
#                   (a2c_ppo_acktr/gpu_smoke.py ratio_bound: a fraction of ppo.clip_coef in bf16; docs/TRAINING.md); peak GPU memory
#   3. PPO          2 iterations under accelerate + DeepSpeed ZeRO-2 on all visible GPUs through
#                   scripts/run_vsi_qwen.sh (PRESET=debug): ratio deviation, debug/param_rank_max_dev
#                   (must be 0), steps/s
#   4. SFT          oracle labels -> SFT dataset -> one SFT step through scripts/run_vsi_sft.sh
#   5. summary      one table of the numbers
# Prints "GPU SMOKE PASSED" at the end; any failed stage prints "GPU SMOKE FAILED: ..." and exits 1.
#
# Usage:  bash scripts/gpu_smoke.sh
# Environment variables (all optional):
#   GPU_SMOKE_DEVICE  cuda (default) | cpu: the same stages on CPU in float32, one plain process
#                     instead of the ZeRO-2 launches (what the test suite runs on a GPU-less machine)
#   GPU_SMOKE_DIR     where outputs and logs go (default: a new temporary directory; kept on failure)
#   NUM_GPUS          processes for the launches (default: all visible GPUs)
#   PYTHON            interpreter (default .venv/bin/python when present, else python)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/common.sh
. scripts/common.sh
vsi_python

DEVICE=${GPU_SMOKE_DEVICE:-cuda}
case "$DEVICE" in
  cuda) DTYPE=bfloat16 ;;
  cpu) DTYPE=float32 ;;
  *) echo "GPU SMOKE FAILED: GPU_SMOKE_DEVICE=$DEVICE; use cuda or cpu" >&2; exit 2 ;;
esac
WORK=${GPU_SMOKE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_smoke.XXXXXX")}
mkdir -p "$WORK"
# The tiny model is built offline; nothing may reach a hub or wandb.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled

fail() {
  echo "GPU SMOKE FAILED: $*" >&2
  echo "GPU SMOKE FAILED: outputs and logs are in $WORK" >&2
  exit 1
}
smoke() { "$PYTHON" -m a2c_ppo_acktr.gpu_smoke --device "$DEVICE" "$@"; }
# Run a launch with its output in a log file; on failure show the log's tail and fail.
logged() {
  local name=$1
  shift
  if ! "$@" > "$WORK/$name.log" 2>&1; then
    tail -n 40 "$WORK/$name.log" >&2
    fail "$name exited non-zero (full log: $WORK/$name.log)"
  fi
}

echo "== gpu_smoke: device $DEVICE, dtype $DTYPE, python $PYTHON, outputs $WORK"

echo "== 1/5 environment"
smoke info --out "$WORK/info.json" || fail "environment check (see above)"

echo "== 2/5 tiny model: rollout/update ratio in $DTYPE"
smoke ratio --out "$WORK/ratio.json" || fail "ratio check (see above)"

echo "== 3/5 PPO: 2 iterations (EMA reference in the loss, perception weighting, validation)"
# The options whose code paths differ under a launcher: the EMA reference's functional forward, the
# masked-image pass (it re-sums the rollout log-probs: the ratio check below covers it), validation.
PPO_OPTIONS="--ppo.reference ema --ppo.kl_coef 0.05 --ppo.perception_weighting true --log.val_interval 2 --log.val_episodes 4"
PORT=$(smoke free-port) || fail "could not find a free port"
if [ "$DEVICE" = cuda ]; then
  logged ppo env PRESET=debug \
    EXTRA_ARGS="--model.device cuda --model.dtype bfloat16 --ppo.num_iterations 2 --log.progress_bar false $PPO_OPTIONS" \
    bash scripts/run_vsi_qwen.sh 1 smoke "$WORK/ppo" "$PORT"
else
  # One plain CPU process: no DeepSpeed (ZeRO-2 on one CPU process tests nothing the GPU run does not).
  # shellcheck disable=SC2086  # PPO_OPTIONS is a list of words
  logged ppo "$PYTHON" main_vsi.py --preset debug --seed 1 --log.run_name smoke --log.output_dir "$WORK/ppo/smoke" \
    --model.device cpu --model.dtype float32 --ppo.num_iterations 2 --log.progress_bar false $PPO_OPTIONS
fi
smoke check-ppo --run-dir "$WORK/ppo/smoke" --iterations 2 --out "$WORK/ppo.json" || fail "PPO run check (see above)"

echo "== 4/5 SFT: oracle labels, dataset, one step"
logged label "$PYTHON" vlm_traj_label.py --preset debug --label.teacher oracle --label.num_episodes 8 \
  --label.out_dir "$WORK/labels" --log.progress_bar false
logged preprocess "$PYTHON" vlm_traj_preprocess.py --preset debug --label.out_dir "$WORK/labels" \
  --label.dataset_dir "$WORK/sft_data" --label.val_fraction 0
SFT_ARGS="--sft.max_steps 1 --sft.per_device_batch_size 1 --sft.logging_steps 1 --sft.save_steps 1 --log.progress_bar false"
if [ "$DEVICE" = cuda ]; then
  logged sft env PRESET=debug DATA_PATH="$WORK/sft_data" PORT="$(smoke free-port)" \
    EXTRA_ARGS="--model.device cuda --model.dtype bfloat16 $SFT_ARGS" \
    bash scripts/run_vsi_sft.sh "$WORK/sft"
else
  # shellcheck disable=SC2086  # SFT_ARGS is a list of words
  logged sft "$PYTHON" train_sft.py --preset debug --sft.data_path "$WORK/sft_data" --sft.output_dir "$WORK/sft" \
    --model.device cpu --model.dtype float32 $SFT_ARGS
fi
smoke check-sft --run-dir "$WORK/sft" --out "$WORK/sft.json" || fail "SFT check (see above)"

echo "== 5/5 summary"
smoke summary --work "$WORK" || fail "summary"
echo "GPU SMOKE PASSED"
