"""What the thin entry scripts share: reading the run config from the command line, and turning the
errors a user can fix (bad config, missing model/scan/checkpoint) into one clear line and exit code 2
instead of a traceback. ``VSI_DEBUG=1`` shows the traceback as well.
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import os
import sys
from typing import Callable, Optional, Sequence

from a2c_ppo_acktr.arguments import ConfigError, RunConfig, add_config_args, config_from_args

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_ROOT_KEYS = frozenset(f.name for f in dataclasses.fields(RunConfig))


def config_parser(description: Optional[str]) -> argparse.ArgumentParser:
    """A parser with ``--config``/``--preset``; every other ``--section.key`` is a config override."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    add_config_args(parser)
    return parser


def parse_run_config(
    argv: Optional[Sequence[str]],
    description: Optional[str],
    parser: Optional[argparse.ArgumentParser] = None,
) -> tuple[RunConfig, argparse.Namespace]:
    """Parse ``argv`` into the resolved :class:`RunConfig` and the script's own arguments."""
    parser = parser or config_parser(description)
    args, extra = parser.parse_known_args(argv)
    check_flag_typos(parser, extra)
    return config_from_args(args, list(extra)), args


def check_flag_typos(parser: argparse.ArgumentParser, extra: Sequence[str]) -> None:
    """A left-over ``--flag`` without a section (``--resum``) is a mistyped script flag, not a config
    key: exit 2 naming the closest flag the script has."""
    import difflib

    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    for token in extra:
        if not token.startswith("--"):
            continue
        key = token[2:].split("=", 1)[0]
        if "." in key or key.replace("-", "_") in _ROOT_KEYS:
            continue  # --section.key or --seed: a config override (checked against the config's keys)
        close = difflib.get_close_matches(token.split("=", 1)[0], flags, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; this script's flags: {', '.join(sorted(flags))}"
        parser.error(f"unrecognized argument {token}{hint} (config keys are written --section.key VALUE)")


def _user_errors() -> tuple[type[BaseException], ...]:
    # Imported here: these modules pull in torch/open3d, which a config error should not wait for.
    from a2c_ppo_acktr.checkpoint import CheckpointError
    from a2c_ppo_acktr.envs.real_scans import SceneLoadError
    from a2c_ppo_acktr.envs.vsibench import VSIBenchRowError
    from a2c_ppo_acktr.jsonl import JsonlError
    from a2c_ppo_acktr.loading import ModelLoadError

    return (ConfigError, ModelLoadError, SceneLoadError, VSIBenchRowError, CheckpointError, FileNotFoundError, JsonlError)


def run_main(main: Callable[[], object], prog: str) -> int:
    """Run an entry script's ``main``; a user-fixable error prints ``prog: error: ...`` and returns 2."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        main()
    except ConfigError as e:
        return _report(prog, e)
    except Exception as e:  # noqa: BLE001 - narrowed just below; everything else re-raises
        if not isinstance(e, _user_errors()) and not _environment_error(e):
            raise
        return _report(prog, e)
    return 0


# Operating-system errors a user fixes outside the program: permissions, a read-only file system,
# a full disk or quota.
_ENVIRONMENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


def _environment_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _ENVIRONMENT_ERRNOS


def _report(prog: str, e: BaseException) -> int:
    if os.environ.get("VSI_DEBUG"):
        raise e
    print(f"{prog}: error: {e}", file=sys.stderr)
    return 2
