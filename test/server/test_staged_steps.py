"""Synchronous steps staged on a shard (STAGE_UPDATE, COMMIT_UPDATE; docs/protocol.md, "Synchronous
steps") against a real recdev-server, each rank a connection of its own: every rank's part applied
once, in rank order, as one UPDATE of the whole batch would; a missing part named and nothing
applied; staged memory capped, and freed when a step fails or nobody commits it; parts that
contradict their step, or come before HELLO, refused."""

import threading

import numpy as np
import pytest

import wire
from wire import ServerError, frame, init_rule, optimizer, step_tag_bytes, u32, u64, table_ref, array

DIM = 4
ADAGRAD = optimizer("adagrad", lr=0.5)


def fresh_table(conn, name):
    return conn.open_named(name, 1000, DIM, init=init_rule("constant", 1.0), fused=ADAGRAD, reset=True)["table_id"]


def grads_for(ids, scale):
    return (np.arange(len(ids) * DIM, dtype=np.float32).reshape(-1, DIM) + 1) * scale


def in_thread(function):
    """Runs function() on a thread; join() returns what it returned or raises what it raised."""
    result = {}

    def run():
        try:
            result["value"] = function()
        except Exception as error:  # noqa: BLE001 (handed to the test)
            result["error"] = error

    thread = threading.Thread(target=run)
    thread.start()

    def join():
        thread.join(60)
        assert not thread.is_alive(), "the staged part never returned"
        if "error" in result:
            raise result["error"]
        return result.get("value")
    return join


@pytest.fixture
def capped(start_server):
    """A shard that stages at most 4 KiB of gradients, reaping every 0.25 s."""
    return start_server("--max-staged-bytes", "4K", "--lease-seconds", "1")


def test_every_ranks_part_is_applied_once_in_rank_order(server):
    parts = [np.array([1, 2, 2, 3], np.uint64), np.array([3, 5, 1], np.uint64)]  # duplicates within and across ranks
    grads = [grads_for(parts[0], 0.25), grads_for(parts[1], -0.5)]
    with server.connect() as rank0, server.connect() as rank1:
        staged, reference = fresh_table(rank0, "staged.once"), fresh_table(rank0, "staged.reference")
        tag = (7, 1, 0, 2)
        other = in_thread(lambda: rank1.stage_update(staged, (7, 1, 1, 2), parts[1], grads[1], 20_000))
        rank0.stage_update(staged, tag, parts[0], grads[0], 20_000)
        other()
        assert rank0.exists(staged, [1, 2, 3, 5]).tolist() == [0, 0, 0, 0]  # staged, not applied
        rank1.commit_update(staged, (7, 1, 1, 2))
        rank0.commit_update(staged, tag)  # the step was applied by rank 1's commit: this one finds it applied
        # One process's UPDATE of the whole batch, in rank order.
        rank0.update(reference, np.concatenate(parts), np.concatenate(grads))
        ids = [1, 2, 3, 5]
        np.testing.assert_array_equal(rank0.gather(staged, ids), rank0.gather(reference, ids))
        assert rank0.info(staged)["table"]["optimizer_step"] == 1

        # Rows elsewhere but none on this shard: an empty update, so the step counter moves with the others'.
        both = [in_thread(lambda r=r, c=c: c.stage_update(staged, (7, 2, r, 2), [], np.zeros(0), 20_000, rank_rows=3))
                for r, c in enumerate((rank0, rank1))]
        for join in both:
            join()
        rank0.commit_update(staged, (7, 2, 0, 2))
        rank1.commit_update(staged, (7, 2, 1, 2))
        assert rank0.info(staged)["table"]["optimizer_step"] == 2
        # No rank recorded a row anywhere: nothing is applied, as a step without rows in one process.
        both = [in_thread(lambda r=r, c=c: c.stage_update(staged, (7, 3, r, 2), [], np.zeros(0), 20_000))
                for r, c in enumerate((rank0, rank1))]
        for join in both:
            join()
        rank0.commit_update(staged, (7, 3, 0, 2))
        assert rank0.info(staged)["table"]["optimizer_step"] == 2
        np.testing.assert_array_equal(rank0.gather(staged, ids), rank0.gather(reference, ids))


def test_a_missing_part_fails_the_step_naming_the_rank_and_nothing_is_applied(capped):
    with capped.connect() as rank0, capped.connect() as rank1:
        table = fresh_table(rank0, "staged.missing")
        ids = np.arange(70, dtype=np.uint64)  # two parts of 1,680 bytes and the step's 448: under the cap
        other = in_thread(lambda: rank1.stage_update(table, (8, 1, 1, 3), ids, grads_for(ids, 1.0), 500))
        with pytest.raises(ServerError) as info:
            rank0.stage_update(table, (8, 1, 0, 3), ids, grads_for(ids, 1.0), 500)
        assert info.value.name == "Unavailable"
        assert "rank 2 of 3 sent no part within 0.5 s (dead or hung); nothing of this step was applied" in str(info.value)
        with pytest.raises(ServerError) as waiting:
            other()
        assert waiting.value.name == "Unavailable" and "rank 2 of 3 sent no part" in str(waiting.value)
        with pytest.raises(ServerError) as commit:
            rank0.commit_update(table, (8, 1, 0, 3))
        assert commit.value.name == "NotFound" and "is not staged here" in commit.value.message
        assert not rank0.exists(table, ids).any()
        # Its parts were freed: the cap admits 2,720 bytes more, which it would not beside them.
        big = np.arange(100, dtype=np.uint64)
        rank0.stage_update(table, (8, 2, 0, 1), big, grads_for(big, 1.0), 20_000)
        rank0.commit_update(table, (8, 2, 0, 1))
        assert rank0.exists(table, big).all()


def test_staged_gradients_are_capped_and_a_step_nobody_commits_is_dropped(capped):
    with capped.connect() as conn:
        table = fresh_table(conn, "staged.capped")
        too_many = np.arange(300, dtype=np.uint64)  # 300 * (8 + 16) bytes > 4 KiB
        with pytest.raises(ServerError) as info:
            conn.stage_update(table, (9, 1, 0, 1), too_many, grads_for(too_many, 1.0), 20_000)
        assert info.value.name == "Full" and "--max-staged-bytes" in info.value.message
        conn.call("PING")  # the connection goes on
    # A fleet of one whose step is ready but never committed: its rank died (its connection closed and
    # its session lapsed, --lease-seconds 1). Dropped after its timeout.
    ids = np.arange(100, dtype=np.uint64)
    with capped.connect() as dead_rank:
        dead_rank.stage_update(table, (9, 2, 0, 1), ids, grads_for(ids, 1.0), 200)
    with capped.connect() as conn:
        for attempt in range(200):  # the lease lapses after 1 s; the housekeeping reaps within 0.25 s
            try:
                conn.stage_update(table, (9, 3, 0, 1), ids, grads_for(ids, 1.0), 20_000)
                break
            except ServerError as error:
                assert error.name == "Full", error
                threading.Event().wait(0.05)
        else:
            pytest.fail("an uncommitted step was never dropped")
        with pytest.raises(ServerError) as dropped:
            conn.commit_update(table, (9, 2, 0, 1))
        assert dropped.value.name == "NotFound"
        assert conn.exists(table, ids).tolist() == [0] * 100


def test_a_ready_step_waits_for_a_late_commit_while_its_rank_lives(capped):
    """A live rank's commit can come after the step's timeout, queued on its connection behind
    another table's request (a periodic checkpoint holds a table for seconds): the ready step must
    still be there, not reaped as if the rank had died."""
    with capped.connect() as rank0:
        table = fresh_table(rank0, "staged.late")
        ids = np.arange(10, dtype=np.uint64)
        rank0.stage_update(table, (13, 1, 0, 1), ids, grads_for(ids, 1.0), 200)
        threading.Event().wait(1.5)  # 7 times the timeout, 6 housekeeping ticks
        rank0.commit_update(table, (13, 1, 0, 1))
        assert rank0.exists(table, ids).all()
        assert rank0.info(table)["table"]["optimizer_step"] == 1


def test_steps_without_parts_cannot_pile_up(capped):
    """Empty parts of steps nobody commits still count (the step's bookkeeping): the cap stops them."""
    with capped.connect() as conn:
        table = fresh_table(conn, "staged.pile")
        for step in range(1, 100):
            try:
                conn.stage_update(table, (12, step, 0, 1), [], np.zeros(0), 3_600_000)
            except ServerError as error:
                assert error.name == "Full" and "--max-staged-bytes" in error.message, error
                break
        else:
            pytest.fail("99 uncommitted steps were all held")
        assert step > 1


def test_parts_that_contradict_their_step_are_refused(capped):
    with capped.connect() as rank0, capped.connect() as rank1:
        table = fresh_table(rank0, "staged.contradictions")
        ids = np.array([4], np.uint64)
        waiting = in_thread(lambda: rank1.stage_update(table, (10, 1, 1, 2), ids, grads_for(ids, 1.0), 20_000))
        # The refusals below need rank 1's part staged: a commit says when it is (NotFound before).
        for attempt in range(400):
            with pytest.raises(ServerError) as early:
                rank0.commit_update(table, (10, 1, 0, 2))
            if early.value.name == "InvalidArgument":
                assert "before every rank's part arrived" in early.value.message
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("rank 1's part was never staged")
        with pytest.raises(ServerError) as twice:
            rank0.stage_update(table, (10, 1, 1, 2), ids, grads_for(ids, 1.0), 20_000)
        assert twice.value.name == "InvalidArgument" and "rank 1 already sent its part" in twice.value.message
        refusals = [((10, 1, 0, 3), "names a fleet of 3 ranks; the step's other parts name 2"),
                    ((10, 1, 2, 2), "rank 2 of 2 is not a rank"),
                    ((10, 1, 0, 0), "rank 0 of 0 is not a rank")]
        for tag, said in refusals:
            with pytest.raises(ServerError) as info:
                rank0.stage_update(table, tag, ids, grads_for(ids, 1.0), 20_000)
            assert info.value.name == "InvalidArgument" and said in info.value.message, info.value
        for payload_ids, grads, name in (([2000], grads_for([1], 1.0), "OutOfRange"),
                                         ([1], np.full((1, DIM), np.nan, np.float32), "InvalidArgument")):
            with pytest.raises(ServerError) as info:
                rank0.stage_update(table, (10, 1, 0, 2), payload_ids, grads, 20_000)
            assert info.value.name == name, info.value
        with pytest.raises(ServerError) as info:
            rank0.stage_update(table, (10, 1, 0, 2), ids, grads_for(ids, 1.0), 0)
        assert info.value.name == "InvalidArgument" and "timeout_ms must be positive" in info.value.message
        rank0.stage_update(table, (10, 1, 0, 2), ids, grads_for(ids, 1.0), 20_000)  # rank 0's true part
        waiting()
        rank0.commit_update(table, (10, 1, 0, 2))
        np.testing.assert_allclose(rank0.gather(table, ids), 1.0 - 0.5 * np.sign(2 * grads_for(ids, 1.0)).ravel(),
                                   rtol=1e-6)


def test_a_part_before_hello_is_refused(server):
    with server.connect(handshake=False) as conn:
        conn.send_raw(frame("STAGE_UPDATE", step_tag_bytes(1, 1, 0, 1) + u64(1) + u32(1000) + table_ref(1)
                            + array([1], np.uint64) + array(np.ones(DIM), np.float32)))
        code, message, _, _ = conn.read_error()
        assert wire.ERROR_NAMES[code] == "Protocol" and "the first frame must be HELLO" in message
        assert conn.is_closed()


def test_shutdown_ends_a_waiting_part_at_once(start_server):
    server = start_server()
    with server.connect() as conn:
        table = fresh_table(conn, "staged.shutdown")
        ids = np.array([1], np.uint64)
        waiting = in_thread(lambda: conn.stage_update(table, (11, 1, 0, 2), ids, grads_for(ids, 1.0), 3_600_000))
        # SIGTERM once the part waits (a commit says so); the part's hour-long timeout must not hold the server.
        with server.connect() as probe:
            for attempt in range(400):
                with pytest.raises(ServerError) as early:
                    probe.commit_update(table, (11, 1, 0, 2))
                if early.value.name == "InvalidArgument":
                    break
                threading.Event().wait(0.05)
        assert server.stop(timeout=30) == 0
        with pytest.raises(ServerError) as info:
            waiting()
        assert info.value.name == "Unavailable" and "shutting down" in info.value.message
