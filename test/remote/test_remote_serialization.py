"""What the remote store does with torch.save / torch.load of a table and whole-table copies today:
torch.save refuses with an error saying what to use instead; copies go row by row, exactly."""

import io

import pytest
import torch
import torch.nn as nn

import torch_recdev
from torch_recdev import local_shards


@pytest.fixture
def remote(start_shards):
    torch_recdev.connect(local_shards.server_list(start_shards(2)))


def test_torch_save_of_a_remote_table_says_what_to_use_instead(remote):
    with torch_recdev.placement("table"):
        weight = nn.Embedding(1000, 8, device="recdev").weight
    with pytest.raises((ValueError, RuntimeError), match=r"torch_recdev\.ops\.save"):
        torch.save({"weight": weight}, io.BytesIO())


def test_whole_table_copy_between_remote_tables_is_exact(remote):
    source = torch.randn(300, 8)
    with torch_recdev.placement("table"):
        a = torch.empty(300, 8, device="recdev")
        b = torch.empty(300, 8, device="recdev")
    a.copy_(source)
    b.copy_(a)
    assert torch.equal(b.cpu(), source)
