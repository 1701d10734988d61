#!/usr/bin/env bash
# Evaluation on Sokoban (6x6, one box): scripts/eval_vsi_qwen.sh with the env overlay
# configs/envs/sokoban.yaml (ENV_CONFIG); every argument and environment variable of
# scripts/eval_vsi_qwen.sh applies (PRESET picks the model: qwen2.5-vl-3b by default, cpu-demo on CPU).
#
# Usage:  bash scripts/eval_sokoban_qwen.sh SEED NAME OUTDIR PORT [EXTRA eval_vsi.py ARGS...]   (or OUT=DIR and options only)
set -euo pipefail
# No cd here: paths in the arguments stay relative to the caller's directory.
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
vsi_env_launcher sokoban eval_vsi_qwen.sh "$@"
