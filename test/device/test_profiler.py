"""Store work in torch.profiler traces (docs/device.md, "Profiling"): the recdev::<name> ranges of a
known lookup and update, their fields (with record_shapes=True), their nesting under the aten op,
remote round trips per shard with bytes sent and received, synchronous steps, and the async-op
thread."""

import json
import uuid

import pytest
import torch
from torch.profiler import profile

import torch_recdev
from torch_recdev import _C, ops

DIM = 16
ROW_BYTES = DIM * 4


def _ranges(prof, name):
    return [e for e in prof.events() if e.name == name]


def _ancestors(event):
    names = []
    while event.cpu_parent is not None:
        event = event.cpu_parent
        names.append(event.name)
    return names


def _within(inner, outer):
    """Per-shard ranges overlap (shards answer in any order), so the profiler keeps them out of its
    parent links: where they lie is a matter of time and thread."""
    return (inner.thread == outer.thread and outer.time_range.start <= inner.time_range.start
            and inner.time_range.end <= outer.time_range.end)


def _trained_embedding():
    with torch_recdev.placement("table"):
        emb = torch.nn.Embedding(10**6, DIM, device="recdev")
    return emb, torch_recdev.optim.Adagrad([emb.weight], lr=0.1)


def test_a_lookup_and_its_update_show_their_ranges_with_their_sizes(store_backend):
    emb, opt = _trained_embedding()
    ids = torch.randperm(10**6)[:1000].to("recdev")
    with profile(record_shapes=True) as prof:
        emb(ids).sum().backward()
        opt.step()
    (gather,) = _ranges(prof, "recdev::gather")
    assert gather.kwinputs == {"table": gather.kwinputs["table"], "ids": 1000, "bytes": 1000 * ROW_BYTES}
    assert "aten::embedding" in _ancestors(gather)
    (update,) = _ranges(prof, "recdev::update")
    assert update.kwinputs["ids"] == 1000 and update.kwinputs["table"] == gather.kwinputs["table"]
    if store_backend == "embedded":
        # The rows were never touched: the store computed them from the init rule, inside the gather.
        (first_touch,) = _ranges(prof, "recdev::first_touch")
        assert first_touch.kwinputs["rows"] == 1000 and first_touch.cpu_parent.name == "recdev::gather"
        assert not _ranges(prof, "recdev::remote")
    else:
        # First touches happen on the shards; here, a round trip per shard for the gather and the update.
        remote = _ranges(prof, "recdev::remote")
        gathers = [r for r in remote if r.kwinputs["opcode"] == "GATHER"]
        assert sorted(r.kwinputs["shard"] for r in gathers) == [0, 1]
        assert all("127.0.0.1:" in r.kwinputs["server"] and r.kwinputs["bytes_sent"] > 0 for r in gathers)
        (gather_range,) = _ranges(prof, "recdev::gather")
        assert all(_within(r, gather_range) for r in gathers)
        answers = [a for a in _ranges(prof, "recdev::remote_answer") if a.kwinputs["opcode"] == "GATHER"]
        assert sorted(a.kwinputs["shard"] for a in answers) == [0, 1]
        # Every row's bytes came back, besides each answer's frame header and counts.
        assert sum(a.kwinputs["bytes_received"] for a in answers) >= 1000 * ROW_BYTES
        assert not _ranges(prof, "recdev::first_touch")
    # Touched now: a second lookup computes nothing.
    with profile(record_shapes=True) as again:
        emb(ids)
    assert len(_ranges(again, "recdev::gather")) == 1 and not _ranges(again, "recdev::first_touch")


def test_a_pooled_lookup_counts_its_ids_and_bags(store_backend):
    with torch_recdev.placement("table"):
        bag = torch.nn.EmbeddingBag(10**5, DIM, mode="sum", device="recdev")
    ids = torch.randint(0, 10**5, (4 * 300,), device="recdev")
    offsets = torch.arange(0, 4 * 300, 4, device="recdev")
    with profile(record_shapes=True) as prof:
        bag(ids, offsets)
    pooled = _ranges(prof, "recdev::pooled_gather") or _ranges(prof, "recdev::gather")
    # A remote float32 table pools on its shards (one pooled gather); a lookup pooled on CPU gathers.
    assert len(pooled) == 1
    assert pooled[0].kwinputs["ids"] in (1200, len(set(ids.cpu().tolist())))
    if pooled[0].name == "recdev::pooled_gather":
        assert pooled[0].kwinputs["bags"] == 300
    assert "aten::_embedding_bag" in _ancestors(pooled[0]) or "aten::embedding_bag" in _ancestors(pooled[0])


def test_the_chrome_trace_shows_the_ranges_inside_the_aten_op(tmp_path):
    torch_recdev.connect(None)
    emb, _ = _trained_embedding()
    with profile(record_shapes=True) as prof:
        emb(torch.arange(500, device="recdev"))
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    (gather,) = [e for e in events if e["name"] == "recdev::gather"]
    (first_touch,) = [e for e in events if e["name"] == "recdev::first_touch"]

    def inside(inner, outer):
        return (inner["tid"] == outer["tid"] and outer["ts"] <= inner["ts"]
                and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"])

    # aten::embedding twice (the autograd kernel's call, then the table kernel's): the gather in both.
    embeddings = [e for e in events if e["name"] == "aten::embedding"]
    assert embeddings and all(inside(gather, e) for e in embeddings)
    assert inside(first_touch, gather)
    assert gather["args"]["ids"] == 500 and gather["args"]["bytes"] == 500 * ROW_BYTES


def test_without_record_shapes_the_ranges_are_there_without_fields():
    torch_recdev.connect(None)
    emb, _ = _trained_embedding()
    with profile() as prof:
        emb(torch.arange(10, device="recdev"))
    (gather,) = _ranges(prof, "recdev::gather")
    assert not gather.kwinputs


def test_the_store_api_and_its_async_ops_show_theirs_on_their_thread(store_backend):
    table = ops.init_embedding_table(f"prof_{uuid.uuid4().hex[:8]}", 10**5, DIM, optimizer=("sgd", {"lr": 0.1}))
    keys = torch.arange(300)
    with profile(record_shapes=True) as prof:
        ops.emb_write(table, keys, torch.ones(300, DIM))
        ops.emb_update(table, keys, torch.ones(300, DIM))
        ops.emb_prefetch(table, keys[:100]).wait()
        ops.emb_write_async(table, keys[:50], torch.zeros(50, DIM)).wait()
    (write, async_write) = sorted(_ranges(prof, "recdev::write"), key=lambda e: e.kwinputs["ids"], reverse=True)
    assert write.kwinputs["ids"] == 300 and async_write.kwinputs["ids"] == 50
    (update,) = _ranges(prof, "recdev::update")
    assert update.kwinputs["ids"] == 300
    (prefetch,) = _ranges(prof, "recdev::gather")
    assert prefetch.kwinputs["ids"] == 100
    # The async ops ran on the async-op thread, which the profiler followed there.
    assert prefetch.thread != write.thread and async_write.thread == prefetch.thread


def test_a_synchronous_steps_stage_and_commit_show_per_shard_round_trips(remote_shards):
    torch_recdev.connect(remote_shards)
    try:
        table = ops.init_embedding_table(f"prof_sync_{uuid.uuid4().hex[:8]}", 10**4, 4, init=torch_recdev.Zero(),
                                         optimizer=("sgd", {"lr": 1.0}))
        synced = _C._sync_table(table)
        ids = torch.arange(200)
        with profile(record_shapes=True) as prof:
            _C._stage_step([synced], [ids], [torch.ones(200, 4)], 0x5EED, 1, 0, 1, 10.0)
            _C._commit_step([synced], 0x5EED, 1, 0, 1, 10.0)
        (stage,) = _ranges(prof, "recdev::sync_stage")
        assert stage.kwinputs == {"step": 1, "rank": 0, "tables": 1, "ids": 200}
        (commit,) = _ranges(prof, "recdev::commit")
        assert commit.kwinputs == {"step": 1, "rank": 0, "tables": 1}
        for parent in (stage, commit):
            shards = [r.kwinputs["shard"] for r in _ranges(prof, "recdev::remote") if _within(r, parent)]
            assert sorted(shards) == [0, 1]
            answers = [a for a in _ranges(prof, "recdev::remote_answer") if _within(a, parent)]
            assert sorted(a.kwinputs["shard"] for a in answers) == [0, 1]
        assert torch.equal(ops.emb_read(table, ids).cpu(), torch.full((200, 4), -1.0))
    finally:
        torch_recdev.connect(None)


@pytest.mark.parametrize("record_shapes", [False, True])
def test_ranges_change_no_result(record_shapes):
    torch_recdev.connect(None)
    torch.manual_seed(0)
    emb, opt = _trained_embedding()
    ids = torch.randint(0, 10**6, (256,), device="recdev")
    emb(ids).sum().backward()
    opt.step()
    plain = emb(ids).cpu()
    torch.manual_seed(0)
    emb2, opt2 = _trained_embedding()
    with profile(record_shapes=record_shapes):
        emb2(ids).sum().backward()
        opt2.step()
    assert torch.equal(emb2(ids).cpu(), plain)
