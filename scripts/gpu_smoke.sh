#!/usr/bin/env bash
# GPU smoke test: run this first on a GPU node, before any real training. A few minutes with the
# offline tiny model (nothing is downloaded); it checks, in order:
#   1. environment  torch/CUDA build, the GPUs, bf16 support, flash-attn, DeepSpeed
#   2. ratio        tiny model in bf16 on CUDA, sdpa (and flash_attention_2 when flash_attn imports):
#                   the first PPO minibatch's max |ratio - 1| stays under the bf16 bound
#                   (a2c_ppo_acktr/gpu_smoke.py ratio_bound: a fraction of ppo.clip_coef in bf16; docs/TRAINING.md); peak GPU memory
#   3. PPO          2 iterations under accelerate + DeepSpeed ZeRO-2 on all visible GPUs through
#                   scripts/run_vsi_qwen.sh (PRESET=debug, groups of 2 envs: a shared prefill): ratio deviation, debug/param_rank_max_dev
#                   (must be 0), steps/s
#   3c. vLLM        (cuda; VLLM_PYTHON, `vllm` on PATH or an importable vllm) run_vsi_qwen.sh with ROLLOUT_SERVER=1: a real `vllm serve` of the
#                   tiny model, 2 iterations through it; adapter versions, |logp_engine - logp_policy|,
#                   rollout turns/s against stage 3's HF engine
#   4. SFT          oracle labels -> SFT dataset -> one SFT step through scripts/run_vsi_sft.sh
#   3b. ZeRO-3      (cuda, 2+ GPUs) 2 iterations under ZeRO-3 in bf16 on 2 GPUs with validation on and
#                   4-token logit chunks, so ranks need different numbers of lm_head calls (no hang)
#   4b. real        (GPU_SMOKE_MODEL=/path) the ratio check on a real local checkpoint with
#                   GPU_SMOKE_PRESET's settings: turns outside the clip range, prompt length against the
#                   model's positions, peak reserved memory against python -m a2c_ppo_acktr.memory, phases
#   4c. real size   (GPU_SMOKE_REAL_SIZE=qwen2.5-vl-3b | qwen2.5-vl-7b | qwen3-vl-4b | qwen3-vl-8b) no download:
#                   the preset's checkpoint architecture built on the GPU with random weights in bf16
#                   (python -m a2c_ppo_acktr.real_size; 3B: ~16 s), then with the preset's settings on a
#                   small rollout (4 envs x 2 steps, the preset's 256-token replies and 448 px frames,
#                   minibatches of 4): act against a bare batched generate (s per decoded token; goal
#                   <= 1.15x), one greedy act with the tower on every frame and with the frames' tower
#                   outputs kept (model.vision_cache_images: the tower's share of a turn), the peak allocated memory of that rollout + two training steps against
#                   python -m a2c_ppo_acktr.memory's formula at the shapes that ran (within 25%), and 2 PPO
#                   iterations through scripts/run_vsi_qwen.sh on one GPU: the first minibatch's ratio must
#                   be exactly 1 with ppo.old_log_probs=update, and s per iteration with its phases.
#                   CPU mode: a 2-layer float32 proxy of the architecture and a tiny budget, one plain process
#   5. summary      one table of the numbers
# Prints "GPU SMOKE PASSED" at the end; any failed stage prints "GPU SMOKE FAILED: ..." and exits 1.
#
# Usage:  bash scripts/gpu_smoke.sh
#         GPU_SMOKE_REAL_SIZE=qwen2.5-vl-3b GPU_SMOKE_STAGES=real-size ENV_CONFIG=configs/envs/numberline.yaml \
#           bash scripts/gpu_smoke.sh      (the real-size stage alone: ~5 min on one H100 for 3B, set-up included)
# Environment variables (all optional):
#   GPU_SMOKE_DEVICE  cuda (default) | cpu: the same stages on CPU in float32, one plain process
#                     instead of the ZeRO-2 launches (what the test suite runs on a GPU-less machine)
#   GPU_SMOKE_DIR     where outputs and logs go (default: a new temporary directory; kept on failure)
#   NUM_GPUS          processes for the launches (default: all visible GPUs)
#   GPU_SMOKE_MODEL   a local real checkpoint (e.g. Qwen2.5-VL-3B-Instruct) for stage 4b; unset: skipped
#   GPU_SMOKE_PRESET  the preset stage 4b runs the checkpoint with (default qwen2.5-vl-3b)
#   GPU_SMOKE_REAL_SIZE  a GPU preset for stage 4c (its checkpoint's architecture, random weights); unset: skipped
#   GPU_SMOKE_STAGES  all (default) | real-size: only stages 1, 4c and 5
#   GPU_SMOKE_PROFILE 1: stage 4c also profiles one act and one bare generate (torch.profiler) into act_profile.txt
#   ENV_CONFIG        an env overlay (configs/envs/numberline.yaml, ...): stages 2-4 on that env instead
#                     of VSI; the GPU paths checked are the same, and a node without open3d (VSI's
#                     renderer) can still run them
#   PYTHON            interpreter (default .venv/bin/python when present, else python)
#   VLLM_PYTHON       the python of vLLM's own environment for stage 3c (default: `vllm` on PATH, else PYTHON's vllm)
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
case "${GPU_SMOKE_STAGES:-all}" in
  all) TINY_STAGES=1 ;;
  real-size)
    TINY_STAGES=0
    if [ -z "${GPU_SMOKE_REAL_SIZE:-}" ]; then
      echo "GPU SMOKE FAILED: GPU_SMOKE_STAGES=real-size needs GPU_SMOKE_REAL_SIZE=<preset> (e.g. qwen2.5-vl-3b)" >&2
      exit 2
    fi ;;
  *) echo "GPU SMOKE FAILED: GPU_SMOKE_STAGES=$GPU_SMOKE_STAGES; use all or real-size" >&2; exit 2 ;;
esac
WORK=${GPU_SMOKE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_smoke.XXXXXX")}
mkdir -p "$WORK"
# ENV_CONFIG: the launchers read it themselves (scripts/common.sh); the plain processes get it as
# --config. Frames are 64 px on another env: the debug preset's 32 px are below what a card game draws
# legibly (64 is the cpu-demo preset's size).
ENV_ARGS=()
RATIO_ARGS=()
LAUNCH_ENV_ARGS=
if [ -n "${ENV_CONFIG:-}" ]; then
  [ -f "$ENV_CONFIG" ] || { echo "GPU SMOKE FAILED: ENV_CONFIG=$ENV_CONFIG does not exist" >&2; exit 2; }
  ENV_CONFIG=$(cd "$(dirname "$ENV_CONFIG")" && pwd)/$(basename "$ENV_CONFIG")
  export ENV_CONFIG
  ENV_ARGS=(--config "$ENV_CONFIG" --env.image_size 64)
  RATIO_ARGS=(--config "$ENV_CONFIG" --set env.image_size=64)
  LAUNCH_ENV_ARGS="--env.image_size 64"
fi
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

# vLLM where the launcher finds it: VLLM_PYTHON (its own environment), else `vllm` on PATH, else this python.
VLLM_VERSION=
if [ -n "${VLLM_PYTHON:-}" ]; then
  VLLM_VERSION=$("$VLLM_PYTHON" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2> /dev/null) \
    || fail "VLLM_PYTHON=$VLLM_PYTHON cannot import vllm"
elif command -v vllm > /dev/null 2>&1; then
  VLLM_VERSION=$(vllm --version 2> /dev/null | tail -n 1) || VLLM_VERSION=unknown
elif "$PYTHON" -c "import vllm" > /dev/null 2>&1; then
  VLLM_VERSION=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("vllm"))')
fi
echo "== gpu_smoke: device $DEVICE, dtype $DTYPE, python $PYTHON, env ${ENV_CONFIG:-VSI, the preset default}, outputs $WORK"

echo "== 1/5 environment"
smoke info --out "$WORK/info.json" || fail "environment check (see above)"

if [ "$TINY_STAGES" = 1 ]; then
  echo "== 2/5 tiny model: rollout/update ratio in $DTYPE"
  smoke ratio --out "$WORK/ratio.json" ${RATIO_ARGS[@]+"${RATIO_ARGS[@]}"} || fail "ratio check (see above)"

  echo "== 3/5 PPO: 2 iterations (EMA reference in the loss, perception weighting, validation)"
  # The options whose code paths differ under a launcher: the EMA reference's functional forward, the
  # masked-image pass (it re-sums the rollout log-probs: the ratio check below covers it), validation;
  # and groups of 2 envs, whose first turns share one prefill (model.shared_prefill) in bf16 on CUDA
  # (flash attention when it imports), with the vision tower's outputs reused in the update: the ratio
  # check covers both.
  PPO_OPTIONS="--ppo.reference ema --ppo.kl_coef 0.05 --ppo.perception_weighting true --log.val_interval 2 --log.val_episodes 4 --rollout.group_size 2"
  PORT=$(smoke free-port) || fail "could not find a free port"
  if [ "$DEVICE" = cuda ]; then
    logged ppo env PRESET=debug \
      EXTRA_ARGS="--model.device cuda --model.dtype bfloat16 --ppo.num_iterations 2 --log.progress_bar false $PPO_OPTIONS $LAUNCH_ENV_ARGS" \
      bash scripts/run_vsi_qwen.sh 1 smoke "$WORK/ppo" "$PORT"
  else
    # One plain CPU process: no DeepSpeed (ZeRO-2 on one CPU process tests nothing the GPU run does not).
    # shellcheck disable=SC2086  # PPO_OPTIONS is a list of words
    logged ppo "$PYTHON" main_vsi.py --preset debug ${ENV_ARGS[@]+"${ENV_ARGS[@]}"} --seed 1 --log.run_name smoke --log.output_dir "$WORK/ppo/smoke" \
      --model.device cpu --model.dtype float32 --ppo.num_iterations 2 --log.progress_bar false $PPO_OPTIONS
  fi
  smoke check-ppo --run-dir "$WORK/ppo/smoke" --iterations 2 --out "$WORK/ppo.json" || fail "PPO run check (see above)"

  if [ "$DEVICE" = cuda ]; then
    vsi_num_gpus "GPU_SMOKE_DEVICE=cpu bash scripts/gpu_smoke.sh"
    if [ "$NUM_GPUS" -ge 2 ]; then
      echo "== 3b/5 PPO under ZeRO-3 on 2 GPUs: bf16, validation on, 4-token logit chunks (unequal lm_head calls per rank)"
      logged ppo_zero3 env PRESET=debug DS_STAGE=3 NUM_GPUS=2 \
        EXTRA_ARGS="--model.device cuda --model.dtype bfloat16 --ppo.num_iterations 2 --log.progress_bar false --ppo.kl_coef 0.05 --log.val_interval 1 --log.val_episodes 3 --model.logits_chunk_tokens 4 $LAUNCH_ENV_ARGS" \
        timeout 900 bash scripts/run_vsi_qwen.sh 1 smoke3 "$WORK/ppo" "$(smoke free-port)"
      smoke check-ppo --run-dir "$WORK/ppo/smoke3" --iterations 2 --out "$WORK/ppo_zero3.json" || fail "ZeRO-3 PPO run check (see above)"
    else
      echo "== 3b/5 skipped: ZeRO-3 with unequal chunks needs 2 GPUs (NUM_GPUS=$NUM_GPUS)"
    fi
  fi

  if [ "$DEVICE" = cuda ] && [ -n "$VLLM_VERSION" ]; then
    echo "== 3c/5 vLLM $VLLM_VERSION rollout engine: vllm serve on the tiny model (started by run_vsi_qwen.sh), 2 PPO iterations through it"
    # TIS is on by default for rollout.engine=vllm; the server's log is RUN_DIR/rollout_server-0.log.
    if ! env PRESET=debug NUM_GPUS=1 ROLLOUT_SERVER=1 ROLLOUT_PORT="$(smoke free-port)" ROLLOUT_GPU_MEMORY=0.3 \
      EXTRA_ARGS="--model.device cuda --model.dtype bfloat16 --ppo.num_iterations 2 --log.progress_bar false $LAUNCH_ENV_ARGS" \
      timeout 1200 bash scripts/run_vsi_qwen.sh 1 smoke_vllm "$WORK/ppo" "$(smoke free-port)" > "$WORK/ppo_vllm.log" 2>&1; then
      tail -n 30 "$WORK/ppo_vllm.log" >&2
      if [ -f "$WORK/ppo/smoke_vllm/rollout_server-0.log" ]; then
        echo "-- the server's log ($WORK/ppo/smoke_vllm/rollout_server-0.log):" >&2
        tail -n 30 "$WORK/ppo/smoke_vllm/rollout_server-0.log" >&2
      fi
      fail "ppo_vllm exited non-zero (full log: $WORK/ppo_vllm.log)"
    fi
    smoke check-ppo --run-dir "$WORK/ppo/smoke_vllm" --iterations 2 --out "$WORK/ppo_vllm.json" || fail "vLLM-engine PPO run check (see above)"
    smoke check-engine --run-dir "$WORK/ppo/smoke_vllm" --hf-run-dir "$WORK/ppo/smoke" --vllm-version "$VLLM_VERSION" --out "$WORK/engine.json" \
      || fail "vLLM engine check (see above)"
  else
    echo "== 3c/5 skipped: the vLLM rollout engine needs cuda and vLLM (VLLM_PYTHON=/path/to/its/python, \`vllm\` on PATH, or pip install -e .[vllm])"
  fi

  echo "== 4/5 SFT: oracle labels, dataset, one step"
  logged label "$PYTHON" vlm_traj_label.py --preset debug ${ENV_ARGS[@]+"${ENV_ARGS[@]}"} --label.teacher oracle --label.num_episodes 8 \
    --label.out_dir "$WORK/labels" --log.progress_bar false
  logged preprocess "$PYTHON" vlm_traj_preprocess.py --preset debug ${ENV_ARGS[@]+"${ENV_ARGS[@]}"} --label.out_dir "$WORK/labels" \
    --label.dataset_dir "$WORK/sft_data" --label.val_fraction 0
  SFT_ARGS="--sft.max_steps 1 --sft.per_device_batch_size 1 --sft.logging_steps 1 --sft.save_steps 1 --log.progress_bar false"
  if [ "$DEVICE" = cuda ]; then
    logged sft env PRESET=debug DATA_PATH="$WORK/sft_data" PORT="$(smoke free-port)" \
      EXTRA_ARGS="--model.device cuda --model.dtype bfloat16 $SFT_ARGS $LAUNCH_ENV_ARGS" \
      bash scripts/run_vsi_sft.sh "$WORK/sft"
  else
    # shellcheck disable=SC2086  # SFT_ARGS is a list of words
    logged sft "$PYTHON" train_sft.py --preset debug ${ENV_ARGS[@]+"${ENV_ARGS[@]}"} --sft.data_path "$WORK/sft_data" --sft.output_dir "$WORK/sft" \
      --model.device cpu --model.dtype float32 $SFT_ARGS
  fi
  smoke check-sft --run-dir "$WORK/sft" --out "$WORK/sft.json" || fail "SFT check (see above)"

  if [ -n "${GPU_SMOKE_MODEL:-}" ]; then
    echo "== 4b/5 real checkpoint $GPU_SMOKE_MODEL with preset ${GPU_SMOKE_PRESET:-qwen2.5-vl-3b}"
    smoke real --model "$GPU_SMOKE_MODEL" --preset "${GPU_SMOKE_PRESET:-qwen2.5-vl-3b}" --out "$WORK/real.json" || fail "real checkpoint check (see above)"
  fi
fi

if [ -n "${GPU_SMOKE_REAL_SIZE:-}" ]; then
  RS_PRESET=$GPU_SMOKE_REAL_SIZE
  RS_DIR=$WORK/real_size_model
  echo "== 4c/5 real size: $RS_PRESET's checkpoint architecture with random weights (nothing downloaded), $DEVICE"
  # The stage's budget, as config overrides. CUDA: the preset's dtype, 448 px frames and 256-token
  # replies on 4 envs x 2 steps in minibatches of 4 (a quarter of its rollout width times 64 fewer
  # steps): each phase of an iteration at its real per-turn size in about a minute.
  # CPU: a 2-layer float32 proxy of the architecture on a tiny budget (what the test suite runs).
  if [ "$DEVICE" = cuda ]; then
    RS_BUILD=(--device cuda --dtype bfloat16)
    RS_SETTINGS=(model.device=cuda rollout.num_envs=4 rollout.num_steps=2 ppo.mini_batch_size=4 ppo.grad_accum_steps=2)
  else
    RS_BUILD=(--device cpu --dtype float32 --text-layers 2 --vision-blocks 2 --hidden 128 --vision-hidden 160)
    RS_SETTINGS=(model.device=cpu model.dtype=float32 model.max_new_tokens=8 env.image_size=64 rollout.num_envs=2 rollout.num_steps=2
      ppo.mini_batch_size=2 ppo.grad_accum_steps=1 ppo.ppo_epochs=1 dist.zero_stage=0 dist.deepspeed_config=null)
  fi
  RS_SETTINGS+=(ppo.num_iterations=2 log.val_interval=0 log.wandb_mode=disabled log.progress_bar=false)
  RS_SET=()
  RS_FLAGS=()
  for kv in "${RS_SETTINGS[@]}"; do
    RS_SET+=(--set "$kv")
    RS_FLAGS+=("--${kv%%=*}" "${kv#*=}")
  done
  RS_OVERLAY=()
  if [ -n "${ENV_CONFIG:-}" ]; then RS_OVERLAY=(--config "$ENV_CONFIG"); fi
  logged real_size_build "$PYTHON" -m a2c_ppo_acktr.real_size --preset "$RS_PRESET" --out "$RS_DIR" "${RS_BUILD[@]}"
  grep "^real_size:" "$WORK/real_size_build.log"
  RS_PROFILE=()
  if [ "${GPU_SMOKE_PROFILE:-0}" = 1 ]; then RS_PROFILE=(--profile "$WORK/act_profile.txt"); fi
  smoke real-size --model "$RS_DIR" --preset "$RS_PRESET" ${RS_OVERLAY[@]+"${RS_OVERLAY[@]}"} "${RS_SET[@]}" ${RS_PROFILE[@]+"${RS_PROFILE[@]}"} --out "$WORK/real_size.json" \
    > "$WORK/real_size_probe.log" || { tail -n 5 "$WORK/real_size_probe.log" >&2; fail "real-size speed and memory check (see above)"; }
  if [ "$DEVICE" = cuda ]; then
    logged real_size_ppo env PRESET="$RS_PRESET" MODEL_PATH="$RS_DIR" NUM_GPUS=1 EXTRA_ARGS="${RS_FLAGS[*]}" \
      bash scripts/run_vsi_qwen.sh 1 real_size "$WORK/ppo" "$(smoke free-port)"
  else
    logged real_size_ppo "$PYTHON" main_vsi.py --preset "$RS_PRESET" ${RS_OVERLAY[@]+"${RS_OVERLAY[@]}"} --model.model_path "$RS_DIR" --seed 1 \
      --log.run_name real_size --log.output_dir "$WORK/ppo/real_size" "${RS_FLAGS[@]}"
  fi
  smoke check-real-size --run-dir "$WORK/ppo/real_size" --iterations 2 --out "$WORK/real_size_ppo.json" || fail "real-size PPO run check (see above)"
fi

echo "== 5/5 summary"
smoke summary --work "$WORK" || fail "summary"
echo "GPU SMOKE PASSED"
