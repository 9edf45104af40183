"""The worker's identity (perftracker/runtime/identity.py) without a process group: job ids the
localizer accepts, a process that never trains, one that trains alone, torchrun's environment (the
job id agreed through a real process group: tests/system/test_identity.py)."""

from __future__ import annotations

from perftracker.localizer.service.validate import _NAME_RE

from perftracker.runtime.identity import provisional_identity, sanitize_job, settle_identity


def test_job_ids_are_sanitized_to_what_the_localizer_accepts() -> None:
    for raw, want in [("train v2", "train_v2"), ("my job/ä", "my_job"), ("ok-1.2_x", "ok-1.2_x"), ("  ", "job")]:
        got = sanitize_job(raw)
        assert got == want and _NAME_RE.match(got), (raw, got)
    assert len(sanitize_job("x" * 500)) == 200


def test_a_process_that_does_not_train_never_settles_and_one_that_trains_alone_is_rank_0_of_1() -> None:
    guess = provisional_identity("", {})
    assert not guess.settled
    assert settle_identity(guess, "", iteration=0, environ={}) is None  # a launcher, a DataLoader worker
    alone = settle_identity(guess, "", iteration=1, environ={})
    assert alone is not None and alone.settled and (alone.rank, alone.world_size, alone.local_rank) == (0, 1, 0)
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "r7"}
    ranks = settle_identity(provisional_identity("", env), "", iteration=5, environ=env)  # torchrun, no group
    assert ranks is not None and (ranks.rank, ranks.world_size, ranks.local_rank, ranks.job) == (3, 4, 1, "r7")
