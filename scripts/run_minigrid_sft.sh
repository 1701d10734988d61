#!/usr/bin/env bash
# SFT warm start on MiniGrid (DoorKey-6x6; ENV_CONFIG=configs/envs/minigrid-empty.yaml for Empty-Random-6x6): scripts/run_vsi_sft.sh with the env overlay
# configs/envs/minigrid-doorkey.yaml (ENV_CONFIG); every argument and environment variable of
# scripts/run_vsi_sft.sh applies (PRESET picks the model: qwen2.5-vl-3b by default, cpu-demo on CPU).
#
# Usage:  DATA_PATH=DATA bash scripts/run_minigrid_sft.sh OUTDIR
set -euo pipefail
# No cd here: paths in the arguments stay relative to the caller's directory.
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
vsi_env_launcher minigrid-doorkey run_vsi_sft.sh "$@"
