#!/usr/bin/env bash
# SFT warm start on gym-cards NumberLine: scripts/run_vsi_sft.sh with the env overlay
# configs/envs/numberline.yaml (ENV_CONFIG); every argument and environment variable of
# scripts/run_vsi_sft.sh applies (PRESET picks the model: qwen2.5-vl-3b by default, cpu-demo on CPU).
#
# Usage:  DATA_PATH=DATA bash scripts/run_nl_sft.sh OUTDIR
set -euo pipefail
# No cd here: paths in the arguments stay relative to the caller's directory.
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
vsi_env_launcher numberline run_vsi_sft.sh "$@"
