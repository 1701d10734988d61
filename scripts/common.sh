# Shared by the launch scripts (source it from the repository root; it defines functions only).

# vsi_abspath PATH always|if-exists: PATH made absolute against the caller's directory (call it before
# the launcher's cd to the repository root); with if-exists a relative name that is no existing path
# (an HF hub id) is kept as it is.
vsi_abspath() {
  case "$1" in
    /*) printf '%s\n' "$1" ;;
    *) if [ -e "$1" ] || [ "$2" = always ]; then printf '%s/%s\n' "$PWD" "$1"; else printf '%s\n' "$1"; fi ;;
  esac
}

# PYTHON: the interpreter; default .venv/bin/python (scripts/setup.sh) when present, else python.
vsi_python() {
  if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
  fi
}

# NUM_GPUS: processes on this node; default the GPUs in CUDA_VISIBLE_DEVICES, else nvidia-smi -L.
# $1: the CPU command to suggest when no GPU is found.
vsi_num_gpus() {
  if [ -z "${NUM_GPUS:-}" ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
      local gpus
      IFS=',' read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
      NUM_GPUS=${#gpus[@]}
    elif command -v nvidia-smi > /dev/null 2>&1; then
      NUM_GPUS=$(nvidia-smi -L | grep -c '^GPU')
    else
      echo "no GPU found (no CUDA_VISIBLE_DEVICES, no nvidia-smi); set NUM_GPUS, or run on CPU with" >&2
      echo "  $1" >&2
      exit 2
    fi
  fi
  if [ "$NUM_GPUS" -lt 1 ]; then
    echo "NUM_GPUS=$NUM_GPUS: need at least one GPU" >&2
    exit 2
  fi
}

# Append the overrides every launcher takes to the array `args`: ENV_CONFIG (an env overlay such
# as configs/envs/numberline.yaml, passed as --config on top of the preset), MODEL_PATH
# (model.model_path) and EXTRA_ARGS (more --section.key value pairs, word-split).
vsi_append_overrides() {
  vsi_append_env_config
  if [ -n "${MODEL_PATH:-}" ]; then args+=(--model.model_path "$MODEL_PATH"); fi
  if [ -n "${EXTRA_ARGS:-}" ]; then
    local extra
    read -r -a extra <<< "$EXTRA_ARGS"
    args+=("${extra[@]}")
  fi
}

# ENV_CONFIG: an env overlay (configs/envs/<env>.yaml) appended to `args` as --config; it must exist.
vsi_append_env_config() {
  if [ -n "${ENV_CONFIG:-}" ]; then
    if [ ! -f "$ENV_CONFIG" ]; then
      echo "ENV_CONFIG=$ENV_CONFIG does not exist; env overlays: $(ls configs/envs/*.yaml 2>/dev/null | tr '\n' ' ')" >&2
      exit 2
    fi
    args+=(--config "$ENV_CONFIG")
  fi
}

# vsi_env_launcher OVERLAY SCRIPT ARGS...: run a launcher (run_vsi_qwen.sh, run_vsi_sft.sh,
# eval_vsi_qwen.sh) on another env: ENV_CONFIG=configs/envs/OVERLAY.yaml unless already set.
vsi_env_launcher() {
  local overlay=$1 script=$2 here
  shift 2
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  export ENV_CONFIG=${ENV_CONFIG:-$here/../configs/envs/$overlay.yaml}
  exec bash "$here/$script" "$@"
}

# Settings for GPU processes, each kept when the caller already set it:
#   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  prompts of varying length fragment the caching
#                                                    allocator; expandable segments avoid most such OOMs
#   OMP_NUM_THREADS  CPU cores of this node / processes on it (at least 1): torch's default of all
#                    cores per process oversubscribes the node (accelerate would set 1 with a warning)
# NCCL on multi-node clusters (set them yourself; the right values are the cluster's):
#   NCCL_SOCKET_IFNAME=<iface>  the interface NCCL bootstraps on (e.g. ib0, eth0; `ip addr`), and
#   GLOO_SOCKET_IFNAME the same for gloo; NCCL_IB_HCA=<mlx5_0,...> the InfiniBand adapters;
#   NCCL_DEBUG=INFO prints the transport NCCL chose (first thing to read when a launch hangs).
# $1: processes on this node.
vsi_gpu_env() {
  export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
  if [ -z "${OMP_NUM_THREADS:-}" ]; then
    local cores
    cores=$(nproc 2>/dev/null || echo 1)
    OMP_NUM_THREADS=$(( cores / $1 ))
    if [ "$OMP_NUM_THREADS" -lt 1 ]; then OMP_NUM_THREADS=1; fi
    export OMP_NUM_THREADS
  fi
}

# Fetch the run's model into the Hugging Face cache once, before the ranks start, then run them
# offline (HF_HUB_OFFLINE=1): no rank races another to the hub. Skipped when already offline.
# Arguments: the config options that pick the model (--preset P [--config F] [--model-path M]).
vsi_prefetch_model() {
  if [ "${HF_HUB_OFFLINE:-0}" = 1 ]; then return 0; fi
  "$PYTHON" -m a2c_ppo_acktr.prefetch "$@" >&2
  export HF_HUB_OFFLINE=1
}

# The rollout engine (a2c_ppo_acktr/policy/rollout_engine.py), appended to `args`:
#   ROLLOUT_URL=http://host:port[,http://host2:port]  use running vLLM servers: the list names one node's
#     servers (the same list on every node); local rank r of NUM_GPUS uses entry r * count / NUM_GPUS
#   ROLLOUT_SERVER=1  start this node's servers first, planned by `python -m a2c_ppo_acktr.rollout_servers`
#     (its docstring says how each number is derived): NUM_GPUS / ROLLOUT_TP servers (ROLLOUT_TP GPUs
#     each, default 1), server i on the GPUs of local ranks i*ROLLOUT_TP.. (CUDA_VISIBLE_DEVICES) and
#     port ROLLOUT_PORT+i (default 8000), bound to 127.0.0.1, taking ROLLOUT_GPU_MEMORY of each GPU
#     (default 0.3, beside the trainer), with --max-model-len from the run's longest prompt plus
#     model.max_new_tokens (ROLLOUT_MAX_MODEL_LEN overrides), --max-lora-rank model.lora_r rounded up to
#     a rank vLLM accepts, --enable-lora, --logprobs-mode processed_logprobs, --generation-config vllm
#     and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True. VLLM_PYTHON is the python of vLLM's own environment
#     (default: the `vllm` on PATH); a vLLM outside the supported versions is refused before anything
#     starts. Each server appends to RUN_DIR/rollout_server-<i>.log; every /health is awaited for up to
#     ROLLOUT_START_TIMEOUT seconds (default 900) and the servers are stopped when the launcher exits.
# $1: the run directory; the remaining arguments: main_vsi.py's (the run's config options).
vsi_rollout_engine() {
  local run_dir=$1
  shift
  if [ "${ROLLOUT_SERVER:-0}" = 1 ]; then
    local plan plan_args=(--gpus "$NUM_GPUS" --tp "${ROLLOUT_TP:-1}" --port "${ROLLOUT_PORT:-8000}" --gpu-memory "${ROLLOUT_GPU_MEMORY:-0.3}")
    if [ -n "${VLLM_PYTHON:-}" ]; then plan_args+=(--vllm-python "$VLLM_PYTHON"); fi
    if [ -n "${ROLLOUT_MAX_MODEL_LEN:-}" ]; then plan_args+=(--max-model-len "$ROLLOUT_MAX_MODEL_LEN"); fi
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then plan_args+=(--devices "$CUDA_VISIBLE_DEVICES"); fi
    plan=$("$PYTHON" -m a2c_ppo_acktr.rollout_servers "${plan_args[@]}" "$@") || exit 2
    # Assignments of ROLLOUT_SERVE/MODEL/FLAGS/DEVICES/PORTS, every value shell-quoted by the planner.
    eval "$plan"
    mkdir -p "$run_dir"
    local i urls=() log waited=0
    ROLLOUT_SERVER_PIDS=()
    trap 'if [ "${#ROLLOUT_SERVER_PIDS[@]}" -gt 0 ]; then kill "${ROLLOUT_SERVER_PIDS[@]}" 2>/dev/null || true; fi' EXIT
    for i in "${!ROLLOUT_PORTS[@]}"; do
      log="$run_dir/rollout_server-$i.log"
      # Appended: a requeued or resumed job keeps the log of the server that failed before it.
      echo "== $(date -u '+%Y-%m-%d %H:%M:%S') vLLM $ROLLOUT_VLLM_VERSION on GPU(s) ${ROLLOUT_DEVICES[$i]}: ${ROLLOUT_SERVE[*]} $ROLLOUT_MODEL --port ${ROLLOUT_PORTS[$i]} ${ROLLOUT_FLAGS[*]}" >> "$log"
      CUDA_VISIBLE_DEVICES=${ROLLOUT_DEVICES[$i]} VLLM_ALLOW_RUNTIME_LORA_UPDATING=True \
        "${ROLLOUT_SERVE[@]}" "$ROLLOUT_MODEL" --port "${ROLLOUT_PORTS[$i]}" "${ROLLOUT_FLAGS[@]}" >> "$log" 2>&1 &
      ROLLOUT_SERVER_PIDS+=($!)
      urls+=("http://127.0.0.1:${ROLLOUT_PORTS[$i]}")
    done
    for i in "${!urls[@]}"; do
      log="$run_dir/rollout_server-$i.log"
      # timeout bounds each probe as a whole (urlopen's timeout bounds each read only).
      until timeout 10 "$PYTHON" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=5)" "${urls[$i]}" 2>/dev/null; do
        if ! kill -0 "${ROLLOUT_SERVER_PIDS[$i]}" 2>/dev/null; then
          echo "rollout server $i exited before answering; its log: $log" >&2
          tail -n 20 "$log" >&2
          exit 2
        fi
        if [ "$waited" -ge "${ROLLOUT_START_TIMEOUT:-900}" ]; then
          echo "rollout server $i did not answer ${urls[$i]}/health within ${ROLLOUT_START_TIMEOUT:-900} s; its log: $log" >&2
          exit 2
        fi
        sleep 2
        waited=$((waited + 2))
      done
    done
    ROLLOUT_URL=$(IFS=,; echo "${urls[*]}")
    echo "[rollout] servers $ROLLOUT_URL (pids ${ROLLOUT_SERVER_PIDS[*]}) serve $ROLLOUT_MODEL" >&2
  fi
  if [ -n "${ROLLOUT_URL:-}" ]; then
    args+=(--rollout.engine vllm --rollout.engine_url "$ROLLOUT_URL")
  fi
}
