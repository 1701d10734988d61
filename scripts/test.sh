#!/usr/bin/env bash
# The project's test command (README, CI): set-up (idempotent) + the whole pytest suite on CPU.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` or `bash scripts/test.sh tests/test_scoring.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled DS_ACCELERATOR=cpu TOKENIZERS_PARALLELISM=false
# The tiny models' matrices are a few dozen wide: one intra-op thread is as fast as two, and spinning
# OpenMP workers on a busy 2-core machine made generation ~25x slower (measured).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
export VSI_CACHE=${VSI_CACHE:-$(pwd)/.cache/vsi_ppo}
# VSI_TINY_SEED (default 0) passes through to pytest: the seed of the tiny builds the tests use, so
# `VSI_TINY_SEED=1 bash scripts/test.sh ...` checks that no test relies on one build's weights.
# The whole suite (no arguments, as CI runs it) starts with the lint (pyproject.toml's rules, ~1 s),
# then runs on TEST_WORKERS pytest-xdist workers (default: 2, or 1 on a 1-core machine). Each test
# computes on one thread, so a 2-core machine runs two at a time; the tests that start several
# processes (marker multiprocess) take turns (tests/conftest.py). TEST_WORKERS=1: one process.
args=("$@")
if [ "$#" -eq 0 ]; then
  .venv/bin/ruff check . || { echo "scripts/test.sh: ruff check failed (fix the lines above, or mark a deliberate one with # noqa: CODE and why)" >&2; exit 1; }
  .venv/bin/ruff format --check . >/dev/null || { .venv/bin/ruff format --diff . >&2 || true; echo "scripts/test.sh: ruff format --check failed: run .venv/bin/ruff format . (the code is kept in the formatter's layout, 120 columns)" >&2; exit 1; }
  cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc obeys OMP_NUM_THREADS, set above
  workers=${TEST_WORKERS:-$(( cores >= 2 ? 2 : 1 ))}
  if [ "$workers" -gt 1 ]; then args=(-n "$workers"); fi
fi
set +e
.venv/bin/python -m pytest "${args[@]}"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests (exit 5): treating as a failure" >&2
  exit 1
fi
exit "$rc"
