#!/usr/bin/env bash
# Mutation testing of the update's maths with mutmut 3 (config: [mutmut] in setup.cfg). Not part of CI.
#
#   bash scripts/mutation.sh [module ...]
#
# module: ppo kl tally storage distributions scoring prompts checkpoint atomic (default: all nine). Each mutant runs
# against the fast tests listed in setup.cfg that execute the function it mutates. mutmut writes a
# mutants/ tree next to the sources, so the run happens in a scratch copy ($MUTATION_DIR, default
# ${TMPDIR:-/tmp}/vsi-mutation, recreated every run): the working tree is never touched.
# MUTATION_JOBS (default 2) mutants run at once. Prints the kill rate per module and the survivors;
# `cd $MUTATION_DIR && mutmut show NAME` prints a mutant's diff. Needs `pip install mutmut` (dev extra).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV_BIN=${VENV_BIN:-$REPO/.venv/bin}
WORK=${MUTATION_DIR:-${TMPDIR:-/tmp}/vsi-mutation}
JOBS=${MUTATION_JOBS:-2}

declare -A PATHS=(
  [ppo]=a2c_ppo_acktr/algo/ppo.py [storage]=a2c_ppo_acktr/algo/storage.py
  [distributions]=a2c_ppo_acktr/policy/distributions.py [scoring]=a2c_ppo_acktr/common/scoring.py
  [prompts]=a2c_ppo_acktr/common/prompts.py [checkpoint]=a2c_ppo_acktr/run/checkpoint.py
  [kl]=a2c_ppo_acktr/algo/kl.py [tally]=a2c_ppo_acktr/algo/tally.py [atomic]=a2c_ppo_acktr/common/atomic.py
)
modules=("$@")
[ ${#modules[@]} -eq 0 ] && modules=(ppo kl tally storage distributions scoring prompts checkpoint atomic)
globs=()
for m in "${modules[@]}"; do
  if [ -z "${PATHS[$m]:-}" ]; then
    echo "unknown module '$m'; choose from: ${!PATHS[*]}" >&2
    exit 2
  fi
  p=${PATHS[$m]%.py}
  globs+=("${p//\//.}.*")  # mutant names are module.function__mutmut_N
done
if [ ! -x "$VENV_BIN/mutmut" ]; then
  echo "mutmut not found in $VENV_BIN; install it: $VENV_BIN/pip install -e '.[dev]'" >&2
  exit 2
fi

# A fresh copy of what the tests need: the package, the tests and the configs (not .git or .venv).
case "$WORK" in /|"$REPO"|"$REPO"/*) echo "MUTATION_DIR=$WORK must lie outside the repository" >&2; exit 2 ;; esac
rm -rf "$WORK"
mkdir -p "$WORK"
cp -a "$REPO/a2c_ppo_acktr" "$REPO/tests" "$REPO/setup.cfg" "$REPO/pytest.ini" "$WORK/"
cd "$WORK"
find . -name __pycache__ -type d -prune -exec rm -rf {} +

# One thread per test process: the machine is shared and the tests use tiny tensors.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled DS_ACCELERATOR=cpu
start=$(date +%s)
"$VENV_BIN/mutmut" run --max-children "$JOBS" "${globs[@]}" > mutmut-run.log 2>&1 || {
  tail -n 40 mutmut-run.log >&2
  exit 1
}
elapsed=$(( $(date +%s) - start ))

"$VENV_BIN/mutmut" results --all true > mutmut-results.txt
echo "mutation run: ${modules[*]} in ${elapsed}s (log: $WORK/mutmut-run.log)"
# Kill rate per module: killed (and timed out) over every mutant with a verdict.
for m in "${modules[@]}"; do
  prefix=${PATHS[$m]%.py}
  prefix=${prefix//\//.}.
  awk -F': ' -v p="$prefix" -v m="$m" '
    { sub(/^ +/, "", $1) }
    index($1, p) == 1 && substr($1, length(p) + 1) !~ /\./ {
      n++; if ($2 == "killed" || $2 == "timeout") k++; else s[++ns] = $1 ": " $2
    }
    END {
      printf "%-14s %4d/%-4d killed (%.1f%%)\n", m, k, n, n ? 100 * k / n : 0
      for (i = 1; i <= ns; i++) printf "    %s\n", s[i]
    }' mutmut-results.txt
done
