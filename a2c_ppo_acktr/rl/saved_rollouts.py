"""Saved rollouts: what the policy wrote, turn by turn, every ``log.save_rollouts_every`` iterations.

``log.save_rollouts_every N`` writes, after the advantages of every N-th iteration are computed,
``OUTPUT_DIR/rollouts/iter-<iteration>-rank<rank>.jsonl.gz``: one JSON object per turn, in step order,
with the env id, an episode id, the prompt text (images as references: their content digests and
shapes, never pixels), the reply, the parsed action, reward, done flags, sampling temperature, value,
advantage, return and the rollout log-prob. Files are written atomically (a temporary sibling,
fsynced, then renamed), and only the newest ``log.keep_rollouts`` iterations are kept. They are not
part of a checkpoint: a resumed run simply goes on writing them.

    python -m a2c_ppo_acktr.rl.saved_rollouts show PATH [--episode ID] [--chars 400]

prints a file's episodes readably (every turn's prompt tail, reply, action and numbers). A file that
is not a saved rollout, or that decompresses past the bounds (:data:`MAX_ROW_BYTES` a row,
:data:`MAX_ROLLOUT_BYTES` in all), is one line naming the file and the row.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import zlib
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from a2c_ppo_acktr.config.arguments import ConfigError
from a2c_ppo_acktr.common.atomic import open_atomic
from a2c_ppo_acktr.common.sameness import image_key

ROLLOUTS_SUBDIR = "rollouts"
_FILE = re.compile(r"iter-(\d+)-rank(\d+)\.jsonl\.gz$")


def rollout_file(directory: str | os.PathLike, iteration: int, rank: int) -> Path:
    return Path(directory) / ROLLOUTS_SUBDIR / f"iter-{iteration:06d}-rank{rank}.jsonl.gz"


def _image_ref(image: Any) -> dict[str, Any]:
    """An image by reference: the content digest the rollout's feature store shares images by, and its shape."""
    shape, _, digest = image_key(image)
    return {"digest": digest.hex(), "shape": list(shape)}


def parsed_action(reply: str) -> Optional[Any]:
    """The ``action`` value of a reply in the package's JSON format, or None when it does not parse."""
    try:
        value = json.loads(reply)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return None
    return value.get("action") if isinstance(value, dict) else None


def rollout_rows(storage: Any, tokenizer: Any, env_id: str, iteration: int, rank: int = 0) -> list[dict[str, Any]]:
    """One dict per stored turn (step-major), from a storage whose advantages are computed.

    Episode ids are ``it<iteration>-r<rank>-env<n>-ep<k>``, ``k`` counting the episodes env ``n``
    started or continued in this rollout; ``continued`` marks the first turn of an episode that began
    in an earlier rollout.
    """
    T, N = storage.num_steps, storage.num_envs
    episode = [0] * N
    rows = []
    for t in range(T):
        for n in range(N):
            i = t * N + n
            ids = storage.generated_ids[i]
            reply = tokenizer.decode(ids.tolist(), skip_special_tokens=True) if ids is not None else ""
            rows.append(
                {
                    "iteration": iteration,
                    "rank": rank,
                    "step": t,
                    "env": n,
                    "env_id": env_id,
                    "episode": f"it{iteration}-r{rank}-env{n}-ep{episode[n]}",
                    "continued": bool(t == 0 and not bool(storage.starts_episode[n])),
                    "prompt": storage.prompts[i],
                    "images": [_image_ref(im) for im in (storage.images[i] or [])],
                    "reply": reply,
                    "action": parsed_action(reply),
                    "reward": float(storage.rewards[t, n]),
                    "terminated": bool(storage.terminated[t, n]),
                    "truncated": bool(storage.truncated[t, n]),
                    "temperature": float(storage.temperatures[t, n]),
                    "value": float(storage.values[t, n]),
                    "advantage": float(storage.advantages[t, n]) if storage.advantages is not None else None,
                    "return": float(storage.returns[t, n]) if storage.returns is not None else None,
                    "log_prob": float(storage.old_log_probs[t, n]),
                }
            )
            if storage.terminated[t, n] or storage.truncated[t, n]:
                episode[n] += 1
    return rows


def write_rollouts(
    rows: Sequence[dict[str, Any]], directory: str | os.PathLike, iteration: int, rank: int = 0, keep: int = 10
) -> Path:
    """Write ``rows`` as ``rollouts/iter-<iteration>-rank<rank>.jsonl.gz`` atomically, then remove this
    rank's files beyond the newest ``keep`` iterations. Returns the file."""
    target = rollout_file(directory, iteration, rank)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open_atomic(target, "wb", durable=True) as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            for row in rows:
                gz.write((json.dumps(row, allow_nan=True) + "\n").encode("utf-8"))
    mine = sorted(
        (int(m.group(1)), p) for p in target.parent.iterdir() if (m := _FILE.search(p.name)) and int(m.group(2)) == rank
    )
    for _, old in mine[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return target


# Bounds of what reading a saved rollout decompresses (a small gzip file can expand to gigabytes: a
# decompression bomb). A row holds one turn's prompt text (images by reference) and reply, so even a
# 128k-token context is a few MiB; the rows of a file are held in memory as Python objects, several
# times their text, so 256 MiB of text stays within a couple of GiB.
MAX_ROW_BYTES = 16 * 2**20
MAX_ROLLOUT_BYTES = 256 * 2**20
# The fields show prints, with the types it needs ("number": an int or float, NaN included).
_ROW_FIELDS = {
    "episode": (str,),
    "env_id": (str,),
    "iteration": (int,),
    "env": (int,),
    "step": (int,),
    "continued": (bool,),
    "prompt": (str, type(None)),
    "images": (list,),
    "reply": (str,),
    "action": (object,),
    "reward": ("number",),
    "value": ("number",),
    "advantage": ("number", type(None)),
    "temperature": ("number",),
    "log_prob": ("number",),
    "terminated": (bool,),
    "truncated": (bool,),
}


class RolloutFileError(ConfigError):
    """A saved rollout file that cannot be shown: not gzip, a row that is not one, or past the size bounds."""


def _type_ok(value: Any, kinds: tuple) -> bool:
    for kind in kinds:
        if kind == "number":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif isinstance(value, kind):
            return True
    return False


def _row(line: bytes, path: Path, n: int) -> dict[str, Any]:
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RolloutFileError(
            f"{path}: row {n} is not a JSON line ({type(e).__name__}); the file is damaged or not a saved rollout"
        ) from None
    if not isinstance(row, dict):
        raise RolloutFileError(
            f"{path}: row {n} is a JSON {type(row).__name__}, not a saved turn; the file is not a saved rollout"
        )
    for key, kinds in _ROW_FIELDS.items():
        if key not in row or not _type_ok(row[key], kinds):
            got = "missing" if key not in row else f"a {type(row[key]).__name__}"
            raise RolloutFileError(
                f"{path}: row {n} has no valid {key!r} ({got}); the file is damaged or not a saved rollout"
            )
    return row


def read_rollouts(
    path: str | os.PathLike, max_row_bytes: int = MAX_ROW_BYTES, max_bytes: int = MAX_ROLLOUT_BYTES
) -> list[dict[str, Any]]:
    """The rows of a saved rollout file, each checked to hold the fields of a saved turn.

    Decompresses at most ``max_bytes`` in all and ``max_row_bytes`` per row (see :data:`MAX_ROW_BYTES`).

    Raises:
        RolloutFileError: not a gzip file, a malformed row, or a row or file past its bound (the
            message names the file, the row and the bound).
    """
    path = Path(path)
    rows: list[dict[str, Any]] = []
    total = 0
    try:
        with gzip.open(path, "rb") as f:
            while line := f.readline(max_row_bytes + 1):
                total += len(line)
                if len(line) > max_row_bytes:
                    raise RolloutFileError(
                        f"{path}: row {len(rows) + 1} decompresses to more than {max_row_bytes // 2**20} MiB (a saved "
                        "turn is a few MiB "
                        "at most); the file is damaged or not a saved rollout"
                    )
                if total > max_bytes:
                    raise RolloutFileError(
                        f"{path} decompresses to more than {max_bytes // 2**20} MiB after {len(rows)} rows (saved "
                        "rollouts are far "
                        "smaller); the file is damaged or not a saved rollout"
                    )
                if line.strip():
                    rows.append(_row(line, path, len(rows) + 1))
    except (OSError, EOFError, zlib.error) as e:
        raise RolloutFileError(f"{path} is not a readable saved rollout ({type(e).__name__}: {e})") from e
    return rows


def format_episodes(rows: Iterable[dict[str, Any]], episode: Optional[str] = None, chars: int = 400) -> str:
    """Readable text of ``rows`` grouped by episode (one episode when ``episode`` is given): per turn
    the prompt's last ``chars`` characters, the reply, the parsed action and the numbers."""
    by_episode: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_episode.setdefault(row["episode"], []).append(row)
    if episode is not None:
        if episode not in by_episode:
            raise ConfigError(f"no episode {episode!r} in this file; it holds {sorted(by_episode)[:10]}")
        by_episode = {episode: by_episode[episode]}
    out = []
    for name, turns in by_episode.items():
        first = turns[0]
        out.append(
            f"=== episode {name} ({first['env_id']}, iteration {first['iteration']}, env {first['env']}"
            f"{', continued from the previous rollout' if first['continued'] else ''}) ==="
        )
        for r in turns:
            prompt = r["prompt"] or ""
            tail = prompt if len(prompt) <= chars else "..." + prompt[-chars:]
            done = "terminated" if r["terminated"] else "truncated" if r["truncated"] else ""
            out += [
                f"--- step {r['step']}: {len(r['images'])} image(s)",
                f"prompt: {tail}",
                f"reply: {r['reply']}",
                f"action: {r['action']!r}   reward {r['reward']:+.3f}   value {r['value']:+.3f}   "
                f"advantage {r['advantage'] if r['advantage'] is None else format(r['advantage'], '+.3f')}   "
                f"T {r['temperature']:.3f}   log-prob {r['log_prob']:.2f}   {done}".rstrip(),
            ]
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m a2c_ppo_acktr.rl.saved_rollouts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print a saved rollout's episodes")
    show.add_argument("path", help="a rollouts/iter-*-rank*.jsonl.gz file")
    show.add_argument("--episode", default=None, help="only this episode id")
    show.add_argument("--chars", type=int, default=400, help="characters of each prompt's end to show")
    args = parser.parse_args(argv)
    path = Path(args.path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; saved rollouts are OUTPUT_DIR/rollouts/iter-*-rank*.jsonl.gz")
    if args.chars < 0:
        parser.error(f"--chars={args.chars} must be >= 0")
    print(format_episodes(read_rollouts(path), args.episode, args.chars))
    return 0


if __name__ == "__main__":
    from a2c_ppo_acktr.config.cli import run_main

    sys.exit(run_main(main, "python -m a2c_ppo_acktr.rl.saved_rollouts"))
