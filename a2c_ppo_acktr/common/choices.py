"""The names each option family accepts, in one place.

The config (:mod:`a2c_ppo_acktr.config.arguments`) validates against these tuples, and each registry that
implements a family checks at import that it implements exactly these names
(:func:`check_registry`), so a name added to one and not the other fails on the first import, not in
the middle of a run. This module imports nothing, so the config stays light.
"""

from __future__ import annotations

from typing import Iterable

# ppo.advantage_estimator (storage.ADVANTAGE_ESTIMATORS)
ADVANTAGE_ESTIMATORS = ("gae", "rloo", "grpo")
# ppo.adv_norm
ADV_NORMS = ("batch", "group", "none")
# ppo.kl_estimator: the exact KL over the vocabulary, or a sample estimator (distributions.sample_kl)
KL_ESTIMATORS = ("full", "k1", "k2", "k3")
# ppo.reference (model.VLMPolicy's reference forwards; the perception probes are not references)
REFERENCES = ("start", "base", "ema")
# ppo.old_log_probs: where the update's old log-probs (and the value clip's centre) come from
OLD_LOG_PROBS = ("update", "rollout")
# ppo.ratio_level (algo.surrogate.RATIO_LEVELS)
RATIO_LEVELS = ("token", "sequence", "sequence_mean")
# ppo.loss_agg (algo.surrogate.LOSS_AGGREGATIONS): how per-token losses become one number
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# label.teacher (teachers.TEACHERS)
TEACHERS = ("oracle", "hf", "openai")
# label.oracle_thoughts (envs.protocol.OracleStyle)
THOUGHT_STYLES = ("full", "brief")
# rollout.engine (rollout_engine.make_engine)
ROLLOUT_ENGINES = ("hf", "vllm")


def check_registry(family: str, implemented: Iterable[str], names: Iterable[str]) -> None:
    """Raise if a registry does not implement exactly the names of its family.

    Args:
        family: The config key, for the message (``ppo.advantage_estimator``).
        implemented: The registry's names.
        names: The family's tuple in this module.
    """
    implemented, names = list(implemented), list(names)
    if sorted(implemented) != sorted(names):
        raise ImportError(
            f"{family}: the registry implements {implemented} but a2c_ppo_acktr/common/choices.py lists {names}; "
            "add or remove the name in both"
        )
