"""perftracker.role: a process says its role; only a training process turns detection on."""

from __future__ import annotations

import pytest

from perftracker.role import AGENT, CLI, ROLE_ENV, SAMPLER, TRAINING, child_env, current_role


@pytest.mark.parametrize(("program", "role"), [
    ("perftracker", CLI),                    # the console script
    ("perftracker.agent", CLI),              # python -m perftracker.agent
    ("perftracker.agent.samplers", CLI),
    ("train.py", TRAINING),
    ("torch.distributed.run", TRAINING),     # torchrun's launcher is not ours
    ("perftracker_train.py", TRAINING),      # a look-alike name is not the program
    ("", TRAINING),
])
def test_role_from_the_program_name(program: str, role: str) -> None:
    assert current_role({}, program) == role


def test_the_environment_says_the_role_first() -> None:
    assert current_role({ROLE_ENV: "agent"}, "train.py") == AGENT
    assert current_role({ROLE_ENV: " Sampler "}, "train.py") == SAMPLER
    assert current_role({ROLE_ENV: "training"}, "perftracker") == TRAINING
    # an unknown value is no role: the program name decides
    assert current_role({ROLE_ENV: "bogus"}, "train.py") == TRAINING
    assert current_role({ROLE_ENV: "bogus"}, "perftracker") == CLI


def test_child_env_sets_the_role_and_keeps_the_rest() -> None:
    env = child_env(SAMPLER, {"PATH": "/bin", ROLE_ENV: "training"})
    assert env == {"PATH": "/bin", ROLE_ENV: SAMPLER}
    with pytest.raises(ValueError, match="unknown perftracker role"):
        child_env("trainer", {})
