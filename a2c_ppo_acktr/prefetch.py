"""Fetch a run's base model into the local Hugging Face cache once, before a launch starts its ranks.

    python -m a2c_ppo_acktr.prefetch [--preset P] [--config OVERLAY] [--model-path M]

The model is the one the run would load: ``--model-path``, else the preset's (and overlay's)
``model.model_path``. A local directory or ``tiny:<family>`` needs nothing; a hub id already in the
cache needs nothing; otherwise the repository is downloaded (``HF_HOME`` should be on a filesystem
every node sees). The launch scripts run this once per node and then start the ranks with
``HF_HUB_OFFLINE=1``, so eight or sixty-four processes never race to the hub. Prints the path.
Offline and not cached: one line saying so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from a2c_ppo_acktr.policy.loading import TINY_PREFIX, ModelLoadError, _in_hf_cache, is_offline


def prefetch(model_path: str) -> str:
    """Make ``model_path`` loadable offline; returns what was done (``local``, ``cached``, ``downloaded``).

    Raises:
        ModelLoadError: a hub id that is not cached while offline mode is on, or a failed download.
    """
    if model_path.startswith(TINY_PREFIX) or Path(model_path).expanduser().exists():
        return "local"
    if _in_hf_cache(model_path):
        return "cached"
    if is_offline():
        raise ModelLoadError(
            f"{model_path!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; fetch it on a machine "
            "with network access (python -m a2c_ppo_acktr.prefetch --model-path ...) or pass a local directory"
        )
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(model_path)
    except Exception as e:  # network, auth, a missing repository: one line either way
        raise ModelLoadError(
            f"could not download {model_path!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    return "downloaded"


def main(argv: Optional[Sequence[str]] = None) -> int:
    from a2c_ppo_acktr.config.arguments import load_config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default=None, help="config preset under configs/ (default: the built-in defaults)")
    parser.add_argument("--config", default=None, help="a YAML overlay (e.g. configs/envs/numberline.yaml)")
    parser.add_argument(
        "--model-path", default=None, help="the model to fetch (default: the config's model.model_path)"
    )
    parser.add_argument(
        "--print-model", action="store_true", help="print the model path and the LoRA rank (`PATH RANK`), fetch nothing"
    )
    args = parser.parse_args(argv)
    path = args.model_path
    cfg = load_config(config=args.config, preset=args.preset)
    if not path:
        path = cfg.model.model_path
    if args.print_model:  # what a rollout server started by the launch scripts serves (scripts/common.sh)
        from a2c_ppo_acktr.policy.loading import resolve_model_path

        served = resolve_model_path(path) if path.startswith(TINY_PREFIX) else path  # a tiny model's built directory
        print(f"{served} {cfg.model.lora_r}")
        return 0
    done = prefetch(path)
    print(f"{path}: {done}")
    return 0


if __name__ == "__main__":
    from a2c_ppo_acktr.config.cli import run_main

    sys.exit(run_main(main, "python -m a2c_ppo_acktr.prefetch"))
