"""Which GPU a training process uses (perftracker.agent.samplers.gpu_pick.pick_gpu): found and not found."""

from __future__ import annotations

from perftracker.agent.samplers.gpu_pick import pick_gpu

UUIDS = ["GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-cccc3333-0000", "GPU-dddd4444-0000"]
NONE: list[dict[int, int]] = [{}, {}, {}, {}]
GB = 1 << 30


def test_the_nvml_process_list_names_the_gpu_over_the_environment() -> None:
    lists = [{11: GB}, {42: GB, 12: GB}, {}, {}]
    got = pick_gpu(42, lists, UUIDS, {"LOCAL_RANK": "3"})
    assert got.index == 1 and "NVML lists pid 42 on GPU 1" in got.how


def test_a_process_on_two_gpus_takes_the_one_its_environment_names() -> None:
    lists = [{42: GB // 2}, {}, {42: 30 * GB}, {}]  # a stray context on GPU 0 beside its own
    assert pick_gpu(42, lists, UUIDS, {"LOCAL_RANK": "2"}).index == 2
    assert pick_gpu(42, lists, UUIDS, {"CUDA_VISIBLE_DEVICES": "0"}).index == 0  # it names one: GPU 0
    # the environment names none of them, or names none at all (mp.spawn, no LOCAL_RANK): the most memory
    assert pick_gpu(42, lists, UUIDS, {"LOCAL_RANK": "3"}).index == 2
    got = pick_gpu(42, lists, UUIDS, {"PATH": "/bin"})
    assert got.index == 2 and "most memory" in got.how
    assert pick_gpu(42, lists, UUIDS, {}).index == 2
    assert pick_gpu(42, [{42: 0}, {}, {42: 0}, {}], UUIDS, {}).index == 0  # memory unknown: the first


def test_without_an_nvml_entry_local_rank_indexes_the_visible_gpus() -> None:
    assert pick_gpu(42, NONE, UUIDS, {"LOCAL_RANK": "1"}).index == 1  # all visible
    assert pick_gpu(42, NONE, UUIDS, {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "3,2"}).index == 2
    assert pick_gpu(42, NONE, UUIDS, {"CUDA_VISIBLE_DEVICES": "2"}).index == 2  # no LOCAL_RANK: cuda:0
    # more ranks than GPUs (ranks sharing GPUs): modulo
    assert pick_gpu(42, NONE, UUIDS[:1], {"LOCAL_RANK": "1"}).index == 0
    assert pick_gpu(42, NONE, UUIDS, {"LOCAL_RANK": "5", "CUDA_VISIBLE_DEVICES": "0,3"}).index == 3


def test_visible_devices_by_uuid_prefix() -> None:
    env = {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "GPU-cccc"}
    assert pick_gpu(42, NONE, UUIDS, env).index == 2
    assert pick_gpu(42, NONE, UUIDS, {"CUDA_VISIBLE_DEVICES": "dddd4444"}).index == 3  # without "GPU-"


def test_no_gpu_is_picked_where_cuda_sees_none() -> None:
    for visible in ("", "-1", "7", "GPU-ffff", "MIG-abc"):
        got = pick_gpu(42, NONE, UUIDS, {"CUDA_VISIBLE_DEVICES": visible})
        assert got.index is None, visible
        assert "makes no GPU" in got.how
    # CUDA stops at the first invalid entry: "1,7,2" is GPU 1 alone
    assert pick_gpu(42, NONE, UUIDS, {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "1,7,2"}).index == 1


def test_nothing_to_go_on_is_no_gpu() -> None:
    assert pick_gpu(42, NONE, UUIDS, {}).index is None  # unreadable environment, no NVML entry
    assert pick_gpu(42, [], [], {"LOCAL_RANK": "0"}).index is None  # no GPU on the node
    assert pick_gpu(42, NONE, UUIDS, {"LOCAL_RANK": "x"}).index == 0  # a malformed LOCAL_RANK reads as 0
