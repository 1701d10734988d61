#!/usr/bin/env bash
# Evaluation on gym-cards Points24: scripts/eval_vsi_qwen.sh with the env overlay
# configs/envs/points24.yaml (ENV_CONFIG); every argument and environment variable of
# scripts/eval_vsi_qwen.sh applies (PRESET picks the model: qwen2.5-vl-3b by default, cpu-demo on CPU).
#
# Usage:  bash scripts/eval_p24_qwen.sh SEED NAME OUTDIR PORT [EXTRA eval_vsi.py ARGS...]   (or OUT=DIR and options only)
set -euo pipefail
# No cd here: paths in the arguments stay relative to the caller's directory.
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
vsi_env_launcher points24 eval_vsi_qwen.sh "$@"
