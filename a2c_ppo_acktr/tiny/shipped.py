"""Tiny builds that ship with the package, so the quickstart starts from them instead of building.

Building the default ``qwen2_5_vl`` takes about 2 minutes on 2 cores and ``qwen2_5_vl-rooms`` about 8
more; each build is ~1.3 MB of weights. ``shipped/<build>-seed<seed>/`` holds such a build as
:func:`~a2c_ppo_acktr.tiny.build.build_tiny_model` wrote it, plus ``SHIPPED.json``: the sha256 of
every file and the ``transformers``/``tokenizers`` versions it was built with.

A shipped build is used only when it is the build this code makes (:func:`find_shipped`): its
``tiny_build.json`` names the build and seed asked for, its spec hash equals
:func:`~a2c_ppo_acktr.tiny.build.spec_hash` of this code with the versions it was built with (same
sizes, corpus, build and sample-drawing code, seed), and every file has its recorded sha256.
Otherwise the caller builds, and the reason is said. Installed library versions other than the
recorded ones do not disqualify it: the files load the same. Weights built on another CPU differ in
their rounding (a build is one draw); a shipped build is the same draw on every machine.

``python -m a2c_ppo_acktr.tiny.shipped --family F --seed 0`` ships the cache's build (built first when
absent); ``--check`` says whether every shipped build is still this code's (exit 1 if not), ``--check
--family F --seed S`` whether that one ships and is (the quickstart asks before it renders samples).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from a2c_ppo_acktr.common.digest import file_sha256

SHIPPED_ROOT = Path(__file__).resolve().parent / "shipped"
MANIFEST = "SHIPPED.json"


def shipped_path(family: str, seed: int, root: Optional[str | os.PathLike] = None) -> Path:
    """Where the shipped build ``family`` of ``seed`` lies (whether or not there is one)."""
    return Path(root or SHIPPED_ROOT) / f"{family}-seed{seed}"


def find_shipped(family: str, seed: int, root: Optional[str | os.PathLike] = None) -> tuple[Optional[Path], str]:
    """The shipped build ``family`` of ``seed`` if it is the one this code makes, else ``(None, why not)``."""
    from a2c_ppo_acktr.tiny.build import spec_hash

    path = shipped_path(family, seed, root)
    if not path.is_dir():
        return None, f"no build of {family} seed {seed} ships with the package"
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files, versions = dict(manifest["files"]), dict(manifest["versions"])
        info = json.loads((path / "tiny_build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError) as err:
        return None, f"{path} is not a complete shipped build ({type(err).__name__}: {err})"
    for name, want in sorted(files.items()):
        if not (path / name).is_file():
            return None, f"{path / name} is missing"
        if file_sha256(path / name) != want:
            return None, f"{path / name} is not the file that was shipped (sha256 differs)"
    got = (info.get("build", info.get("family")), info.get("seed"))
    if got != (family, seed):
        return None, f"{path} holds the build {got[0]!r} of seed {got[1]}, not {family!r} of seed {seed}"
    try:
        expected = spec_hash(family, seed, versions)
    except KeyError as err:
        return None, f"{path}'s {MANIFEST} lacks the version of {err}"
    if info.get("spec_hash") != expected:
        return None, (
            f"{path} was built by other build code (spec hash {info.get('spec_hash')}, this code's {expected} with "
            f"transformers {versions.get('transformers')}): ship it again with python -m a2c_ppo_acktr.tiny.shipped "
            f"--family {family} --seed {seed}"
        )
    return path, ""


def install_shipped(family: str, seed: int, out: str | os.PathLike, root: Optional[str | os.PathLike] = None) -> str:
    """Copy the shipped build ``family`` of ``seed`` into the directory ``out`` (created; its files replaced).

    Returns:
        ``""`` when it was copied (and each copy checked against the recorded sha256), else why not:
        the caller then builds.
    """
    path, reason = find_shipped(family, seed, root)
    if path is None:
        return reason
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = json.loads((path / MANIFEST).read_text(encoding="utf-8"))["files"]
    for name, want in sorted(files.items()):
        tmp = out / f".{name}.tmp"
        shutil.copyfile(path / name, tmp)
        if file_sha256(tmp) != want:
            tmp.unlink()
            return f"copying {path / name} gave another file (sha256 differs)"
        os.replace(tmp, out / name)
    return ""


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ship(family: str, seed: int, build_dir: str | os.PathLike, root: Optional[str | os.PathLike] = None) -> Path:
    """Make ``build_dir`` (this code's build ``family`` of ``seed``) the shipped one, replacing any before it.

    Raises:
        ValueError: ``build_dir`` is not this code's build of ``family`` and ``seed``.
    """
    from a2c_ppo_acktr.common.atomic import publish_dir
    from a2c_ppo_acktr.tiny.build import TinyBaseError, build_versions, check_base_build

    build_dir = Path(build_dir)
    try:
        check_base_build(build_dir, family, seed)  # this code's build of this family and seed
    except TinyBaseError as err:
        raise ValueError(f"not shipped: {err}") from None
    final = shipped_path(family, seed, root)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would follow the files into an installed package
        files = {}
        for src in sorted(p for p in build_dir.iterdir() if p.is_file() and not p.name.startswith(".")):
            shutil.copyfile(src, tmp / src.name)
            files[src.name] = file_sha256(tmp / src.name)
        manifest = {
            "build": family,
            "seed": seed,
            "versions": build_versions(),
            "files": files,
            "built_on": {"machine": platform.machine(), "cpu": _cpu_name()},
            "shipped": time.strftime("%Y-%m-%d"),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        publish_dir(tmp, final, durable=False)  # the old shipped copy stays whole until the new one replaces it
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def shipped_builds(root: Optional[str | os.PathLike] = None) -> list[tuple[str, int]]:
    """The ``(build, seed)`` pairs that have a directory under the shipped root."""
    out = []
    for path in sorted(Path(root or SHIPPED_ROOT).glob("*-seed*")):
        family, _, seed = path.name.rpartition("-seed")
        if path.is_dir() and seed.isdigit():
            out.append((family, int(seed)))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: ship the cache's build of ``--family``/``--seed``, or ``--check`` the shipped ones."""
    from a2c_ppo_acktr.tiny.build import BUILDS, tiny_model_dir

    parser = argparse.ArgumentParser(
        prog="python -m a2c_ppo_acktr.tiny.shipped",
        description="Ship a tiny build with the package (the quickstart copies it instead of building), "
        "or check that the shipped builds are this code's.",
    )
    parser.add_argument("--family", choices=BUILDS, default=None, help="the build to ship")
    parser.add_argument("--seed", type=int, default=0, help="its seed (default 0)")
    parser.add_argument(
        "--from", dest="source", default=None, help="the build directory to ship (default: the cache's, built first)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="check every shipped build (with --family: that one, of --seed); exit 1 if one is not current or absent",
    )
    args = parser.parse_args(argv)
    if args.check:
        if args.source is not None:
            parser.error("--check checks what ships: leave --from out")
        bad = 0
        for family, seed in [(args.family, args.seed)] if args.family else shipped_builds():
            path, reason = find_shipped(family, seed)
            print(f"{family} seed {seed}: " + ("current" if path else f"NOT CURRENT: {reason}"))
            bad += path is None
        return 1 if bad else 0
    if args.family is None:
        parser.error("name the build to ship with --family (or --check)")
    source = Path(args.source) if args.source else tiny_model_dir(args.family, seed=args.seed)
    try:
        print(ship(args.family, args.seed, source))
    except ValueError as err:
        print(f"python -m a2c_ppo_acktr.tiny.shipped: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
