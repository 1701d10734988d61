"""Export a trained policy for serving: the LoRA adapter merged into the base model's weights.

    python -m a2c_ppo_acktr.export --adapter DIR --out MERGED [--model-path BASE] [--dtype float32]

``--adapter`` is an SFT adapter (``train_sft.py``'s ``OUT/adapter``), a checkpoint's ``policy/`` or a
checkpoint directory itself (``<run>/checkpoints/checkpoint-N``: its ``policy/``, verified against its
checksums first). ``--model-path`` defaults to the base model the checkpoint's run used. The output is
a plain Hugging Face model directory (weights, config, processor files) that ``from_pretrained``, vLLM
or this package (``--model.model_path MERGED``) load with no peft and no path back to the base model;
``export.json`` records where it came from. The value and temperature heads are not part of it (a
served model samples at the temperature its server is given). Written to a temporary sibling and
renamed into place, so ``--out`` is never half-written; a failed export removes its temporary
directory and nothing else.

``--out`` must be a new directory: an existing one is refused unless ``--overwrite`` (it is then moved
to ``OUT.old-<time>``, never deleted), and so are the current directory and any directory that is,
holds or lies inside the adapter or the base model. The export holds the lock of ``--out`` from start
to end: a directory where a run is training (or another export is writing) is refused, with or
without ``--overwrite``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

EXPORT_FILE = "export.json"


def resolve_adapter(path: str | Path) -> tuple[Path, Optional[str]]:
    """``(adapter directory, base model path recorded by the run or None)`` for an adapter, a
    ``policy/`` directory or a checkpoint directory (verified against its checksums). The base is the
    checkpoint's ``model.model_path``, else the adapter's own absolute (or existing) local base path.

    Raises:
        FileNotFoundError: no ``adapter_config.json`` there.
        ModelLoadError: ``adapter_config.json`` is not a JSON object.
        CheckpointError: a damaged checkpoint.
    """
    from a2c_ppo_acktr.run.checkpoint import COMPLETE_MARKER, require_intact
    from a2c_ppo_acktr.eval.evaluation import checkpoint_model_config

    path = Path(path)
    base = None
    if (path / COMPLETE_MARKER).is_file():
        require_intact(path, "export an earlier checkpoint")
        base = checkpoint_model_config(path).get("model_path")
        path = path / "policy"
    if not (path / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"{path} holds no adapter_config.json; pass an SFT adapter, a checkpoint's policy/ or a checkpoint "
            "directory"
        )
    if base is None:
        # Adapters saved by this package record a local base model by its absolute path
        # (loading.record_base_model); a relative one (older adapters) is trusted only if it exists.
        from a2c_ppo_acktr.policy.loading import ModelLoadError

        try:
            recorded = json.loads((path / "adapter_config.json").read_text(encoding="utf-8")).get(
                "base_model_name_or_path"
            )
        except (ValueError, AttributeError) as e:  # not JSON, not UTF-8, or not an object
            raise ModelLoadError(
                f"{path / 'adapter_config.json'} is not an adapter config ({type(e).__name__}); the file is truncated "
                "or damaged"
            ) from e
        if recorded and (Path(recorded).is_absolute() or Path(recorded).is_dir()):
            base = str(recorded)
    return path, base


def merge_adapter(
    adapter: str | Path,
    out: str | Path,
    model_path: Optional[str] = None,
    dtype: str = "float32",
    overwrite: bool = False,
) -> Path:
    """Merge ``adapter`` into its base model and save the result (and the processor) to ``out``.

    Returns:
        ``out``.

    Raises:
        ConfigError: ``out`` is used (without ``overwrite``), is the current directory, or overlaps
            the adapter or the base model.
        RunLockedError: another process (a training run, another export) holds ``out``.
        ModelLoadError: the adapter's files are damaged.
    """
    from a2c_ppo_acktr.config.arguments import ConfigError, ModelConfig
    from a2c_ppo_acktr.policy.loading import load_vlm
    from a2c_ppo_acktr.run.rundir import RunLock, check_output_path, claim_output_dir

    adapter_dir, recorded = resolve_adapter(adapter)
    base = model_path or recorded
    if base is None:
        raise ConfigError(
            f"cannot tell the base model of {adapter}; pass --model-path (the model the adapter was trained on)"
        )
    inputs = [adapter, adapter_dir, base]
    target = check_output_path(out, inputs)  # before the minutes of loading and merging
    # The lock of --out, held to the end: a run training there (or another export) is refused before
    # anything loads, and nothing can start there before the result is in place.
    with RunLock(target):
        if not overwrite:  # a used --out is refused now, not after minutes of merging
            claim_output_dir(out, overwrite=False, inputs=inputs, create=False)
        loaded = load_vlm(ModelConfig(model_path=base, device="cpu", dtype=dtype))
        merged = _merged(loaded.model, adapter_dir)
        if loaded.shipped_generation_config is not None:  # the base checkpoint's decoding defaults travel with it
            merged.generation_config = loaded.shipped_generation_config
        _publish(
            merged,
            loaded.processor,
            target,
            out,
            overwrite,
            inputs,
            {"base_model": str(base), "adapter": str(adapter_dir.resolve()), "dtype": dtype},
        )
    return Path(out)


def _merged(model: Any, adapter_dir: Path) -> Any:
    """``model`` with the adapter of ``adapter_dir`` merged into its weights.

    Raises:
        ModelLoadError: the adapter's files are truncated or damaged.
    """
    from peft import PeftModel
    from safetensors import SafetensorError

    from a2c_ppo_acktr.policy.loading import ModelLoadError

    try:
        return PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    except (SafetensorError, OSError, EOFError, ValueError, RuntimeError, KeyError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelLoadError(
            f"the adapter at {adapter_dir} cannot be read ({type(e).__name__}: {first}); its files are truncated or "
            "damaged, or it "
            "was trained on another base model: export an intact copy, or pass --model-path with its base model"
        ) from e


def _publish(
    merged: Any, processor: Any, target: Path, out: str | Path, overwrite: bool, inputs: list, info: dict
) -> None:
    """Save the merged model into a temporary sibling of ``target``, then claim ``out`` and rename it
    into place (a failure removes the temporary directory and nothing else)."""
    from a2c_ppo_acktr.common.atomic import fsync_tree
    from a2c_ppo_acktr.run.rundir import staged_output_dir

    with staged_output_dir(out, target, overwrite=overwrite, inputs=inputs, prefix=".tmp-export-") as tmp:
        merged.save_pretrained(str(tmp))
        processor.save_pretrained(str(tmp))
        (tmp / EXPORT_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")
        fsync_tree(tmp)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--adapter", required=True, help="SFT adapter, a checkpoint's policy/, or a checkpoint directory"
    )
    parser.add_argument("--out", required=True, help="directory for the merged model")
    parser.add_argument(
        "--model-path", default=None, help="base model (default: the checkpoint's run's model.model_path)"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument(
        "--overwrite", action="store_true", help="move an existing --out aside to OUT.old-<time> (nothing is deleted)"
    )
    args = parser.parse_args(argv)
    out = merge_adapter(args.adapter, args.out, args.model_path, args.dtype, overwrite=args.overwrite)
    print(f"merged model written to {out}")
    return 0


if __name__ == "__main__":
    from a2c_ppo_acktr.config.cli import run_main

    sys.exit(run_main(main, "python -m a2c_ppo_acktr.export"))
