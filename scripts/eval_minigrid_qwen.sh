#!/usr/bin/env bash
# Evaluation on MiniGrid (DoorKey-6x6; ENV_CONFIG=configs/envs/minigrid-empty.yaml for Empty-Random-6x6): scripts/eval_vsi_qwen.sh with the env overlay
# configs/envs/minigrid-doorkey.yaml (ENV_CONFIG); every argument and environment variable of
# scripts/eval_vsi_qwen.sh applies (PRESET picks the model: qwen2.5-vl-3b by default, cpu-demo on CPU).
#
# Usage:  bash scripts/eval_minigrid_qwen.sh SEED NAME OUTDIR PORT [EXTRA eval_vsi.py ARGS...]   (or OUT=DIR and options only)
set -euo pipefail
# No cd here: paths in the arguments stay relative to the caller's directory.
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
vsi_env_launcher minigrid-doorkey eval_vsi_qwen.sh "$@"
