"""What this package relies on in a vLLM server, and the versions that provide it.

One home for the facts the launcher (:mod:`a2c_ppo_acktr.rollout_servers`), the engine
(:mod:`a2c_ppo_acktr.policy.rollout_engine`) and the loopback server
(:mod:`a2c_ppo_acktr.policy.loopback_server`) share. They were read from vLLM's released source:

* ``return_token_ids`` (the prompt's and the reply's token ids in the chat-completions reply) first
  shipped in 0.10.2; the engine cannot align tokens without it, so older servers are refused.
* The request and reply fields, the runtime LoRA routes and the server flags the launcher passes
  were checked against 0.10.2, 0.11.0 and 0.33.0; a newer minor version is refused until its
  fields have been checked too (raise :data:`CHECKED_UP_TO` then).
* ``--max-lora-rank`` is a closed set of values (``LORA_RANKS``); 0.10 and 0.11 lack 1, so the
  launcher rounds a preset's rank up within :data:`PORTABLE_LORA_RANKS`, which every supported
  version accepts.
* 0.33 refuses a ``temperature`` above 2 (HTTP 400) and every version raises one in (0, 0.01) to
  0.01, so a policy sampling outside ``[MIN_TEMPERATURE, MAX_TEMPERATURE]`` would be refused or
  sampled at another temperature than the one it scores.
"""

from __future__ import annotations

import re
from typing import Optional

from a2c_ppo_acktr.common.errors import UserError

MIN_VERSION = (0, 10, 2)
# The newest minor release whose fields were checked; any patch release of it is accepted.
CHECKED_UP_TO = (0, 33)
SUPPORTED_RANGE = "0.10.2 to 0.33.x"
PIP_REQUIREMENT = "vllm>=0.10.2,<0.34"
# 0.33's --max-lora-rank choices (config/lora.py, MaxLoRARanks); 0.10.2 and 0.11 accept the same set without 1.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
PORTABLE_LORA_RANKS = LORA_RANKS[1:]
MAX_TEMPERATURE = 2.0
MIN_TEMPERATURE = 0.01


class VLLMVersionError(ValueError, UserError):
    """A vLLM server or installation outside the versions this package supports."""


def parse_version(text: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a version string such as ``0.11.0``, ``0.10.2rc1`` or
    ``0.33.0+cu129`` (a missing patch reads as 0).

    Raises:
        VLLMVersionError: the text does not start with a version number.
    """
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if m is None:
        raise VLLMVersionError(f"cannot read a vLLM version from {str(text)[:80]!r}; expected e.g. 0.11.0")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def check_version(text: str, where: str) -> tuple[int, int, int]:
    """The parsed version ``text`` when it is a supported one.

    Args:
        text: The version as vLLM reports it (``vllm --version``, ``GET /version``).
        where: What reported it, for the message (``the rollout server http://...``).

    Raises:
        VLLMVersionError: outside :data:`SUPPORTED_RANGE` (one line naming the requirement to install).
    """
    version = parse_version(text)
    if version < MIN_VERSION or version[:2] > CHECKED_UP_TO:
        why = "return_token_ids needs >= 0.10.2" if version < MIN_VERSION else "its fields were checked up to 0.33"
        raise VLLMVersionError(
            f"{where} is vLLM {str(text).strip()[:40]}, outside the supported {SUPPORTED_RANGE} ({why}); "
            f"install a supported one there (pip install '{PIP_REQUIREMENT}')"
        )
    return version


def server_lora_rank(lora_r: int) -> int:
    """The smallest ``--max-lora-rank`` every supported vLLM accepts that holds an adapter of rank ``lora_r``.

    Raises:
        VLLMVersionError: ``lora_r`` is larger than vLLM's largest rank.
    """
    for rank in PORTABLE_LORA_RANKS:
        if rank >= int(lora_r):
            return rank
    raise VLLMVersionError(
        f"model.lora_r={lora_r} is above vLLM's largest --max-lora-rank {PORTABLE_LORA_RANKS[-1]}: "
        f"lower model.lora_r, or use rollout.engine=hf"
    )


def temperature_problem(min_temperature: float, max_temperature: float) -> Optional[str]:
    """Why a vLLM server cannot sample the policy's temperature range, or None when it can."""
    if max_temperature > MAX_TEMPERATURE:
        return (
            f"model.max_temperature={max_temperature} is above {MAX_TEMPERATURE:g}, the highest temperature vLLM "
            "serves "
            "(0.33 answers HTTP 400): lower model.max_temperature, or use rollout.engine=hf"
        )
    if 0 < min_temperature < MIN_TEMPERATURE:
        return (
            f"model.min_temperature={min_temperature} is below {MIN_TEMPERATURE:g}, which vLLM samples at "
            f"{MIN_TEMPERATURE:g} "
            "instead: raise model.min_temperature, or use rollout.engine=hf"
        )
    return None
