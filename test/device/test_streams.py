"""recdev's streams and events (csrc/device/guard.cpp, torch.recdev): real handles, a current stream
per thread, and one timeline whose only later work is the async-op thread's: an event recorded after
an async store operation completes with it, and synchronizing a stream, an event or the device waits
for it, also from torch's own bindings (which may hold the interpreter lock the operation needs).
And DCP's file-system writer, which runs on the device module's streams, saves recdev tensors."""

import threading

import pytest
import torch
import torch.distributed.checkpoint as dcp

from torch_recdev import ops, pending


def test_current_stream_is_per_thread_and_stream_contexts_nest():
    default = torch.recdev.current_stream()
    assert default == torch.recdev.default_stream() and default.stream_id == 0
    assert isinstance(default, torch.recdev.Stream) and default.device == torch.device("recdev", 0)
    a, b = torch.recdev.Stream(), torch.recdev.Stream(priority=-1)
    assert len({default.stream_id, a.stream_id, b.stream_id}) == 3
    with torch.recdev.stream(a):
        assert torch.recdev.current_stream() == a
        with torch.recdev.stream(b):
            assert torch.accelerator.current_stream() == b  # torch's generic API sees the same
        with torch.recdev.stream(None):
            assert torch.recdev.current_stream() == a
        seen = []
        thread = threading.Thread(target=lambda: seen.append(torch.recdev.current_stream()))
        thread.start()
        thread.join()
        assert seen == [default]  # another thread keeps its own current stream
    assert torch.recdev.current_stream() == default
    with pytest.raises(ValueError, match="recdev has one device"):
        torch.recdev.Stream("recdev:1")


class Gate:
    """An async operation that runs until opened: what is queued behind it stays pending."""

    def __init__(self):
        self.opened = threading.Event()
        self.future = pending.submit(self.opened.wait)

    def open_later(self, seconds=0.2):
        threading.Timer(seconds, self.opened.set).start()


def test_an_event_completes_with_the_async_operations_issued_before_it():
    gate = Gate()
    before, after = torch.recdev.Event(), torch.recdev.Event()
    before.record()
    assert not before.query() and not torch.recdev.current_stream().query()
    gate.open_later()
    before.synchronize()
    assert before.query() and gate.future.done()
    after.record()
    assert after.query()  # nothing was pending when it was recorded
    with pytest.raises(RuntimeError):
        before.elapsed_time(after)


@pytest.mark.parametrize("wait", ["device", "stream", "event", "accelerator", "wait_stream"])
def test_synchronizing_waits_for_async_store_operations(wait):
    table = ops.init_embedding_table("streams.sync", 1000, 4)
    gate = Gate()
    written = ops.emb_write_async(table, torch.tensor([3]), torch.full((1, 4), 2.0))
    event = torch.recdev.current_stream().record_event()
    gate.open_later()
    other = torch.recdev.Stream()
    {"device": torch.recdev.synchronize, "stream": torch.recdev.current_stream().synchronize,
     "event": lambda: other.wait_event(event),
     "accelerator": torch.accelerator.synchronize,
     "wait_stream": lambda: other.wait_stream(torch.recdev.current_stream())}[wait]()
    assert written.done() and ops.emb_read(table, torch.tensor([3])).cpu().eq(2.0).all()


def test_a_wait_on_the_async_op_thread_returns_at_once():
    """An operation (or a future's callback, which runs there) that synchronizes must not wait for
    itself or for what is queued behind it."""
    done = pending.submit(torch.recdev.synchronize)
    gate = Gate()
    gate.future.then(lambda _: torch.recdev.current_stream().synchronize())
    gate.open_later(0.05)
    done.wait()
    torch.recdev.synchronize()
    assert gate.future.done()


def test_dcp_saves_and_loads_recdev_tensors_through_the_device_module_streams(tmp_path):
    """DCP's FileSystemWriter copies device tensors on torch.recdev.current_stream(); before recdev
    had streams it stopped with "module 'torch.recdev' has no attribute 'current_stream'"."""
    state = {"w": torch.arange(6.0, device="recdev").reshape(2, 3), "cpu": torch.ones(2), "step": 4}
    dcp.save(state, checkpoint_id=str(tmp_path))
    loaded = {"w": torch.zeros(2, 3, device="recdev"), "cpu": torch.zeros(2), "step": 0}
    dcp.load(loaded, checkpoint_id=str(tmp_path))
    assert torch.equal(loaded["w"].cpu(), state["w"].cpu()) and loaded["w"].device.type == "recdev"
    assert torch.equal(loaded["cpu"], state["cpu"]) and loaded["step"] == 4
