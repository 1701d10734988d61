"""Each option family's names live once (a2c_ppo_acktr/common/choices.py); config and registries agree."""

from __future__ import annotations

import pytest
import torch

from a2c_ppo_acktr.algo import surrogate
from a2c_ppo_acktr.common import choices, scoring
from a2c_ppo_acktr.algo import storage
from a2c_ppo_acktr.labels import teachers
from a2c_ppo_acktr.config.arguments import QUESTION_TYPES, ConfigError, load_config
from a2c_ppo_acktr.policy.distributions import sample_kl
from a2c_ppo_acktr.envs.questions import GENERATORS
from a2c_ppo_acktr.policy import references
from a2c_ppo_acktr.policy.model import REFERENCES
from a2c_ppo_acktr.policy.rollout_engine import ENGINES


def test_every_registry_implements_exactly_its_family():
    assert list(storage.ADVANTAGE_ESTIMATORS) == list(choices.ADVANTAGE_ESTIMATORS)
    assert list(teachers.TEACHERS) == list(choices.TEACHERS)
    assert ENGINES == choices.ROLLOUT_ENGINES
    assert list(references.REFERENCES) == list(choices.REFERENCES)
    assert REFERENCES == choices.REFERENCES + tuple(references.PERCEPTION_PROBES)
    assert list(GENERATORS) == list(QUESTION_TYPES) == list(scoring.TASKS)
    assert list(surrogate.RATIO_LEVELS) == list(choices.RATIO_LEVELS)
    assert list(surrogate.LOSS_AGGREGATIONS) == list(choices.LOSS_AGGREGATIONS)
    logits = torch.randn(3)
    for estimator in choices.KL_ESTIMATORS:
        if estimator != "full":  # the exact KL is computed over the vocabulary, not per sample
            assert torch.isfinite(sample_kl(logits, logits + 0.1, estimator)).all()


def test_a_registry_out_of_step_with_its_family_fails_at_import():
    with pytest.raises(ImportError, match="ppo.advantage_estimator: the registry implements"):
        choices.check_registry(
            "ppo.advantage_estimator", ["gae", "rloo", "grpo", "vtrace"], choices.ADVANTAGE_ESTIMATORS
        )
    choices.check_registry("label.teacher", reversed(choices.TEACHERS), choices.TEACHERS)  # order does not matter


@pytest.mark.parametrize(
    "key, family",
    [
        ("ppo.advantage_estimator", choices.ADVANTAGE_ESTIMATORS),
        ("ppo.adv_norm", choices.ADV_NORMS),
        ("ppo.kl_estimator", choices.KL_ESTIMATORS),
        ("ppo.reference", choices.REFERENCES),
        ("label.teacher", choices.TEACHERS),
        ("label.oracle_thoughts", choices.THOUGHT_STYLES),
        ("rollout.engine", choices.ROLLOUT_ENGINES),
        ("ppo.old_log_probs", choices.OLD_LOG_PROBS),
        ("ppo.ratio_level", choices.RATIO_LEVELS),
        ("ppo.loss_agg", choices.LOSS_AGGREGATIONS),
    ],
)
def test_the_config_accepts_the_family_and_names_it_when_refusing(key, family):
    for value in family:  # the name is accepted (a value may still need a companion setting, e.g. rloo a group size)
        try:
            load_config(preset="debug", overrides=[f"{key}={value}"])
        except ConfigError as e:
            assert "is not allowed" not in str(e) and key in str(e), str(e)
    with pytest.raises(ConfigError) as err:
        load_config(preset="debug", overrides=[f"{key}=no_such_name"])
    assert str(list(family)) in str(err.value)
