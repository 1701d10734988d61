#!/usr/bin/env bash
# One-time, idempotent set-up of a fresh machine: .venv with the platform's torch, open3d's system
# library, and this package with its dev and deepspeed extras. Never downloads model weights.
# A second run only checks and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VSI_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
# torch pins per platform: on x86_64 these two lie on local disk and are the CUDA build.
# TORCH_MIN_DRIVER: the oldest NVIDIA driver the default pin's CUDA build runs on (x86_64: CUDA 13.0,
# driver >= 580); empty where unknown. A TORCH_PINS of your own skips the check.
TORCH_MIN_DRIVER=""
case "$(uname -m)" in
  x86_64) [ -z "${TORCH_PINS:-}" ] && TORCH_MIN_DRIVER=580; TORCH_PINS=${TORCH_PINS:-"torch==2.14.1 torchvision==0.29.1"} ;;
  aarch64) TORCH_PINS=${TORCH_PINS:-"torch==2.9.1 torchvision==0.24.1"} ;;
  *) TORCH_PINS=${TORCH_PINS:-"torch torchvision"} ;;
esac

log() { printf '[setup] %s\n' "$*" >&2; }

# On a GPU node, the default torch build must be one the driver can run: otherwise
# torch.cuda.is_available() is False and every run falls back to (or fails on) the CPU.
if [ -n "$TORCH_MIN_DRIVER" ] && command -v nvidia-smi >/dev/null 2>&1; then
  DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sed -n 1p | tr -d ' ')
  if [ -n "$DRIVER" ] && [ "${DRIVER%%.*}" -lt "$TORCH_MIN_DRIVER" ] 2>/dev/null; then
    log "NVIDIA driver $DRIVER cannot run the default $TORCH_PINS (a CUDA 13.0 build, driver >= $TORCH_MIN_DRIVER): set TORCH_PINS to a build for this driver, e.g. TORCH_PINS='torch==2.9.1 torchvision==0.24.1 --index-url https://download.pytorch.org/whl/cu126' bash scripts/setup.sh, or update the driver"
    exit 1
  fi
fi

# open3d links libusb-1.0 at import time.
if ! ldconfig -p 2>/dev/null | grep -q 'libusb-1.0.so.0'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing libusb-1.0-0 (needed by open3d)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libusb-1.0-0 >/dev/null
  else
    log "WARNING: libusb-1.0 missing and not root: ask an admin to 'apt-get install libusb-1.0-0' (open3d needs it)"
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
STAMP="$VENV/.vsi_setup_stamp"
WANT="$(cat setup.py | sha256sum | cut -c1-16) $TORCH_PINS"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$VPY" -c "import torch, torchvision, transformers, open3d, a2c_ppo_acktr, gymnasium; assert 'VSI-v0' in gymnasium.registry" 2>/dev/null; then
  log "environment up to date ($VENV)"
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# --no-compile, then compileall on every core: the bytecode of the ~21,000 modules installed, which pip
# would write one file at a time (and which a run cannot write where PYTHONDONTWRITEBYTECODE is set).
log "installing $TORCH_PINS"
"$VPY" -m pip install -q --no-compile $TORCH_PINS
# DeepSpeed's build imports torch: build it against the torch just installed, not an isolated copy.
log "installing deepspeed"
"$VPY" -m pip install -q --no-compile --no-build-isolation "deepspeed>=0.19.8,<0.20"  # the pin of setup.py's deepspeed extra
log "installing vsi-ppo[dev,deepspeed] (editable)"
"$VPY" -m pip install -q --no-compile -e ".[dev,deepspeed]"
log "compiling the installed modules"
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# A module that does not compile (a package's Python-2 test data) is skipped, as pip skips it.
"$VPY" -m compileall -q -j 0 "$SITE" > /dev/null 2>&1 || true
echo "$WANT" > "$STAMP"
log "done: activate with 'source $VENV/bin/activate'"
