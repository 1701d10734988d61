"""What the thin entry scripts share: reading the run config from the command line, and turning the
errors a user can fix (bad config, missing model/scan/checkpoint) into one clear line and exit code 2
instead of a traceback. ``VSI_DEBUG=1`` shows the traceback as well.

Every entry script's ``--help`` shows its own flags and the common config keys with the values the
command line's ``--preset``/``--config``/overrides give them (a script's own flags, such as
``--resume``, are not applied there); ``--help-section SECTION`` one section; ``--help-all`` every config
key (``--section.key``) with its type, default and the comment written beside (or above) the field in
``a2c_ppo_acktr/config/arguments.py``, read from that file's source when help is asked for; ``--print-config`` prints
the resolved config as YAML and exits.
This module imports nothing heavy (no torch/transformers): help and config errors come back at once.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import errno
import functools
import inspect
import io
import logging
import os
import sys
import textwrap
import tokenize
import types
import typing
from typing import Any, Callable, Optional, Sequence

from a2c_ppo_acktr.config.arguments import ConfigError, RunConfig, add_config_args, config_from_args
from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.run.preemption import Preempted

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_ROOT_KEYS = frozenset(f.name for f in dataclasses.fields(RunConfig))


# The keys ``--help`` shows with the values the command line resolves to; ``--help-all`` lists every key.
COMMON_KEYS = (
    "seed",
    "model.model_path",
    "model.device",
    "model.dtype",
    "env.env_id",
    "env.image_size",
    "env.max_turns",
    "rollout.num_envs",
    "rollout.num_steps",
    "rollout.engine",
    "ppo.num_iterations",
    "ppo.lr",
    "ppo.advantage_estimator",
    "ppo.kl_coef",
    "sft.data_path",
    "label.teacher",
    "eval.num_episodes",
    "log.output_dir",
    "log.resume",
)


class ConfigArgumentParser(argparse.ArgumentParser):
    """An argparse parser with three levels of help, each printed once the command line is parsed (so
    the values shown are the ones ``--preset``/``--config``/overrides resolve to):

    * ``-h/--help``: the script's own flags and :data:`COMMON_KEYS` with their resolved values;
    * ``--help-section SECTION``: every key of one config section (``ppo``, ``env``...), resolved;
    * ``--help-all``: every config key with its type, code default and comment (:func:`config_keys_help`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["add_help"] = False
        super().__init__(*args, **kwargs)
        sections = config_sections()
        self.add_argument(
            "-h",
            "--help",
            action="store_true",
            help=(
                "show the script's flags and the common config keys with the values this command line gives them, then "
                "exit"
            ),
        )
        self.add_argument(
            "--help-section",
            default=None,
            choices=sections,
            metavar="SECTION",
            help=f"show every key of one config section ({', '.join(sections)}) with its value, then exit",
        )
        self.add_argument(
            "--help-all",
            action="store_true",
            help="show every config key with its type, default and meaning, then exit",
        )

    def format_help(self) -> str:
        """The short help with the code defaults (``--help`` shows the resolved values instead)."""
        return self.short_help(None)

    def format_help_all(self) -> str:
        return super().format_help().rstrip("\n") + "\n\n" + config_keys_help()

    def short_help(
        self, cfg: Optional[RunConfig], keys: Sequence[str] = COMMON_KEYS, title: str = "common config keys"
    ) -> str:
        values = _flat_values(cfg if cfg is not None else RunConfig())
        defaults = {k.key: k.default for k in config_keys()}
        origin = "values from --preset/--config/overrides" if cfg is not None else "code defaults"
        lines = [super().format_help().rstrip("\n"), "", f"{title} ({origin}; set any with --section.key VALUE):"]
        for key in keys:
            value = values[key]
            note = "" if value == defaults[key] else f"   (code default {format_value(defaults[key])})"
            lines.append(f"  --{key} = {format_value(value)}{note}")
        lines += [
            "",
            f"all {len(defaults)} config keys with their meaning: --help-all; one section: --help-section SECTION",
        ]
        return "\n".join(lines) + "\n"

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        ns, extra = super().parse_known_args(args, namespace)
        if ns.help or ns.help_all or ns.help_section:
            self._print_requested_help(ns, list(extra))
            self.exit(0)
        return ns, extra

    def _print_requested_help(self, ns: argparse.Namespace, extra: list[str]) -> None:
        if ns.help_all:
            sys.stdout.write(self.format_help_all())
            return
        try:
            cfg: Optional[RunConfig] = config_from_args(ns, extra) if hasattr(ns, "preset") else None
        except ConfigError as e:
            print(f"(the command line does not resolve to a config: {e}; showing the code defaults)", file=sys.stderr)
            cfg = None
        if ns.help_section:
            keys = [k.key for k in config_keys() if k.key.startswith(ns.help_section + ".")]
            sys.stdout.write(self.short_help(cfg, keys, title=f"{ns.help_section} keys"))
        else:
            sys.stdout.write(self.short_help(cfg))


def config_sections() -> list[str]:
    """The config's section names (``env``, ``model``, ``rollout``, ``ppo``...)."""
    hints = typing.get_type_hints(RunConfig)
    return [f.name for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(hints[f.name])]


def _flat_values(cfg: RunConfig) -> dict[str, Any]:
    """``{"section.key" (or a top-level "key"): value}``; dict-valued fields (``env.game``) stay whole."""
    sections = set(config_sections())
    out: dict[str, Any] = {}
    for name, value in cfg.to_dict().items():
        if name in sections:
            out.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            out[name] = value
    return out


def config_parser(description: Optional[str]) -> argparse.ArgumentParser:
    """A parser with ``--config``/``--preset``/``--print-config``; every other ``--section.key`` is a
    config override (all of them are listed by ``--help``)."""
    parser = ConfigArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    add_config_args(parser)
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (preset, --config file and overrides applied) as YAML and exit",
    )
    return parser


def exit_if_print_config(parser: argparse.ArgumentParser, args: argparse.Namespace, cfg: RunConfig) -> None:
    """With ``--print-config``: print ``cfg`` as YAML on stdout (loadable with ``--config``) and exit 0."""
    if getattr(args, "print_config", False):
        sys.stdout.write(cfg.to_yaml())
        sys.stdout.flush()
        parser.exit(0)


def parse_run_config(
    argv: Optional[Sequence[str]],
    description: Optional[str],
    parser: Optional[argparse.ArgumentParser] = None,
) -> tuple[RunConfig, argparse.Namespace]:
    """Parse ``argv`` into the resolved :class:`RunConfig` and the script's own arguments."""
    parser = parser or config_parser(description)
    args, extra = parser.parse_known_args(argv)
    check_flag_typos(parser, extra)
    cfg = config_from_args(args, list(extra))
    exit_if_print_config(parser, args, cfg)
    return cfg, args


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


# ------------------------------------------------------------------------------------ config help
@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """One config field as ``--help`` lists it."""

    key: str  # dotted: "env.image_size" ("seed" at the top level)
    type: str  # "int", "str or null", "list[str]"...
    default: Any
    comment: str  # the comment lines above the field, then the one beside it ("" when none)


def field_comments(cls: type) -> dict[str, str]:
    """``{field name: comment}`` of a dataclass, read from its module's source: the ``#`` lines
    directly above the field (no blank line between), then the ``#`` comment on the field's own
    line(s), joined by "; ". Fields without a comment are absent."""
    return _module_field_comments(cls.__module__).get(cls.__qualname__, {})


@functools.lru_cache(maxsize=None)
def _module_field_comments(module_name: str) -> dict[str, dict[str, str]]:
    """``{class name: {field name: comment}}`` for the top-level classes of a module (one parse); {}
    when its source is not available (help then lists types and defaults only)."""
    try:
        source = inspect.getsource(sys.modules[module_name])
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments: dict[int, str] = {}  # line number -> comment text
    full_line: set[int] = set()  # lines that hold only a comment
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            comments[row] = tok.string.lstrip("#").strip()
            if not lines[row - 1][: tok.start[1]].strip():
                full_line.add(row)
    out: dict[str, dict[str, str]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields = out.setdefault(node.name, {})
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above = []
            row = stmt.lineno - 1
            while row in full_line:
                above.append(comments[row])
                row -= 1
            beside = [
                comments[r]
                for r in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
                if r in comments and r not in full_line
            ]
            text = "; ".join(t for t in (" ".join(reversed(above)), " ".join(beside)) if t)
            if text:
                fields[stmt.target.id] = text
    return out


def type_name(tp: Any) -> str:
    """``int``, ``float``, ``str or null``, ``list[str]``... (how a YAML/CLI value must look)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(inner) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list[{type_name(args[0])}]"
    return getattr(tp, "__name__", str(tp))


def format_value(value: Any) -> str:
    """A value as it is written in YAML or on the command line (``null``, ``true``, ``[a, b]``)."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip()
    return text[: -len("...")].rstrip() if text.endswith("\n...") else text


def config_keys(cls: type = RunConfig, prefix: str = "") -> list[ConfigKey]:
    """Every config field of ``cls`` (recursively into sections), in declaration order."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    out: list[ConfigKey] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += config_keys(tp, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out.append(ConfigKey(prefix + f.name, type_name(tp), default, comments.get(f.name, "")))
    return out


def config_keys_help(width: int = 100) -> str:
    """The config part of ``--help``: every key grouped by section, ``--section.key  TYPE = DEFAULT``
    and the field's comment from ``arguments.py`` below it."""
    hints = typing.get_type_hints(RunConfig)
    sections = [(None, RunConfig)] + [
        (f.name, hints[f.name]) for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(hints[f.name])
    ]
    out = [
        "config keys (set any of them with --section.key VALUE or section.key=VALUE; a preset or --config YAML",
        "sets them per section; precedence: command line > --config > --preset > the defaults shown here):",
    ]
    for name, cls in sections:
        doc = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ").replace("``", "")
        out.append("")
        out.append(f"{name}: {doc}" if name else f"top level: {doc}")
        keys = config_keys(cls, f"{name}.") if name else [k for k in config_keys() if "." not in k.key]
        for k in keys:
            out.append(f"  --{k.key}  {k.type} = {format_value(k.default)}")
            if k.comment:
                out += textwrap.wrap(
                    k.comment, width=width, initial_indent=" " * 6, subsequent_indent=" " * 6, break_on_hyphens=False
                )
    return "\n".join(out) + "\n"


# What an entry script reports in one line (exit 2): errors the user fixes, and a missing input file.
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, FileNotFoundError)


def run_main(main: Callable[[], object], prog: str) -> int:
    """Run an entry script's ``main``; a user-fixable error prints ``prog: error: ...`` and returns 2."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        main()
    except ConfigError as e:
        return _report(prog, e)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - narrowed just below; everything else re-raises
        if isinstance(e, Preempted):  # stopped on a signal with its state saved: not an error
            print(f"{prog}: {e}", file=sys.stderr)
            return e.exit_code
        if not isinstance(e, USER_ERRORS) and not _environment_error(e):
            raise
        return _report(prog, e)
    return 0


# Operating-system errors a user fixes outside the program: permissions, a read-only file system,
# a full disk or quota.
_ENVIRONMENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


def _environment_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _ENVIRONMENT_ERRNOS


# An error message quotes the user's value; a huge value (an expanded YAML alias, a pasted file) must
# not become a gigabyte line.
MAX_ERROR_CHARS = 2000


def _report(prog: str, e: BaseException) -> int:
    if os.environ.get("VSI_DEBUG"):
        raise e
    # A path that is not UTF-8 reaches the message as surrogates, which no UTF-8 stream can print.
    text = str(e).encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        text = f"{text[:MAX_ERROR_CHARS]} ... ({len(text) - MAX_ERROR_CHARS} more characters cut)"
    print(f"{prog}: error: {text}", file=sys.stderr)
    return 2
