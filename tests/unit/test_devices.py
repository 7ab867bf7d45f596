"""The device a rank uses (cupyglm/distributed/devices.py), through the CuPy double's visible devices."""
from __future__ import annotations

import pytest

from cupy_double.fixtures import cuda_double  # noqa: F401
from cupyglm.distributed.devices import DeviceError, pick_device


class FakeLocal:
    """The host's ranks' allgather, as the other ranks would answer it."""

    def __init__(self, others):
        self.others = others

    def allgather(self, mine):
        return [mine, *self.others]


def test_local_rank_indexes_the_visible_devices(cuda_double, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert [pick_device(r, 4) for r in range(4)] == [0, 1, 2, 3]


def test_more_ranks_than_visible_devices_is_refused(cuda_double, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(DeviceError, match="3 ranks on this host but local rank 2 sees only 2 GPUs"):
        pick_device(2, 3)


def test_one_gpu_per_rank_is_device_zero(cuda_double, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert pick_device(0, 2, FakeLocal(["0000:12:00"])) == 0          # the other rank sees GPU 2
    with pytest.raises(DeviceError, match=r"local ranks \[0, 1\] all see only the GPU at PCI 0000:13:00"):
        pick_device(0, 2, FakeLocal(["0000:13:00"]))                  # the other rank sees GPU 3 too
