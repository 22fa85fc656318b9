import random
import socket
import threading

import pytest

import dedupwire
from dedupwire import DedupError

KEY = dedupwire.Key.from_text("the python tests' shared passphrase")


def serve(listener, handler):
    """Accepts one stream on a thread and runs ``handler`` on it; join() re-raises."""
    box = {}

    def run():
        try:
            with listener.accept() as s:
                box["result"] = handler(s)
        except BaseException as e:  # noqa: BLE001 - handed to the joining test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join(timeout=60):
        t.join(timeout)
        assert not t.is_alive(), "server thread did not finish"
        if "error" in box:
            raise box["error"]
        return box.get("result")

    return join


def echo_until_closed(s):
    n = 0
    while True:
        try:
            m = s.recv()
        except DedupError:
            return n
        s.send(m)
        n += 1


def payload(size, seed):
    return random.Random(seed).randbytes(size)


def test_round_trip_over_loopback():
    with dedupwire.listen("127.0.0.1:0", key=KEY) as listener:
        join = serve(listener, echo_until_closed)
        with dedupwire.connect(listener.address, key=KEY) as s:
            for msg in [b"hello, channel", b"", payload(300_000, 1)]:
                s.send(msg)
                assert s.recv() == msg
            stats = s.stats()
            assert stats["messages_sent"] == 3
            assert stats["messages_received"] == 3
        assert join() == 3


def test_address_as_text_and_tuple():
    with dedupwire.listen(("127.0.0.1", 0), key=KEY) as listener:
        host, port = listener.address
        assert host == "127.0.0.1" and port > 0
        join = serve(listener, lambda s: s.recv())
        with dedupwire.connect(f"{host}:{port}", key=KEY) as s:
            assert s.peer_address == (host, port)
            s.send(b"x")
        assert join() == b"x"


def test_second_similar_send_moves_fewer_socket_bytes():
    first = payload(2 << 20, 2)
    second = bytearray(first)
    second[1_000_000:1_000_100] = b"\xff" * 100
    second = bytes(second)

    with dedupwire.listen("127.0.0.1:0", key=KEY) as listener:
        join = serve(listener, lambda s: [s.recv(), s.recv()])
        with dedupwire.connect(listener.address, key=KEY, mode="dedup") as s:
            s.send(first)
            after_first = s.stats()["socket_bytes_sent"]
            s.send(second)
            stats = s.stats()
        got = join()
    cost_second = stats["socket_bytes_sent"] - after_first
    assert got == [first, second]
    assert after_first > len(first) // 2
    assert cost_second < after_first // 10, (after_first, cost_second)
    assert stats["bytes_hit"] > 0
    assert 0.0 < stats["redundancy"] <= 1.0


def test_environment_keeps_chunks_across_connections(tmp_path):
    data = payload(1 << 20, 3)
    env = dedupwire.Environment(tmp_path / "env", max_bytes=64 << 20, segment_bytes=4 << 20)
    assert str(env.path).endswith("env")
    costs = []
    with dedupwire.listen("127.0.0.1:0", key=KEY, env=env) as listener:
        for _ in range(2):
            join = serve(listener, lambda s: s.recv())
            with dedupwire.connect(listener.address, key=KEY, mode="dedup") as s:
                s.send(data)
                costs.append(s.stats()["socket_bytes_sent"])
            assert join() == data
    env.sync()
    assert env.stats()["chunks"] > 0
    assert costs[1] < costs[0] // 10, costs


def test_context_managers_close():
    with dedupwire.listen("127.0.0.1:0", key=KEY) as listener:
        join = serve(listener, echo_until_closed)
        with dedupwire.connect(listener.address, key=KEY) as s:
            s.send(b"ping")
            assert s.recv() == b"ping"
            assert not s.closed
        assert s.closed
        with pytest.raises(DedupError, match="closed"):
            s.send(b"again")
        assert s.stats()["messages_sent"] == 1
        s.close()
        assert join() == 1
    assert listener.closed
    with pytest.raises(DedupError, match="closed"):
        listener.accept()


def test_connect_to_a_closed_port_is_a_dedup_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(DedupError):
        dedupwire.connect(("127.0.0.1", port), key=KEY)


def test_recv_after_the_peer_closed_is_a_dedup_error():
    with dedupwire.listen("127.0.0.1:0", key=KEY) as listener:
        join = serve(listener, lambda s: None)
        with dedupwire.connect(listener.address, key=KEY) as s:
            join()
            with pytest.raises(DedupError, match="(?i)closed"):
                s.recv()


def test_dedup_error_is_an_exception_with_the_rust_message():
    assert issubclass(DedupError, Exception)
    with pytest.raises(DedupError) as e:
        dedupwire.listen("256.0.0.1:0", key=KEY)
    assert str(e.value)


def test_unknown_mode_is_a_value_error():
    with pytest.raises(ValueError, match="mode"):
        dedupwire.connect("127.0.0.1:1", mode="fast")


def test_send_takes_bytes_only():
    with dedupwire.listen("127.0.0.1:0", key=KEY) as listener:
        join = serve(listener, echo_until_closed)
        with dedupwire.connect(listener.address, key=KEY) as s:
            with pytest.raises(TypeError):
                s.send("text")  # type: ignore[arg-type]
            s.send(b"ok")
            assert s.recv() == b"ok"
        join()


def test_other_threads_run_while_a_stream_waits_in_recv():
    go = threading.Event()

    def reply_when_told(s):
        go.wait(30)
        s.send(b"late")

    with dedupwire.listen("127.0.0.1:0", key=KEY) as listener:
        join = serve(listener, reply_when_told)
        with dedupwire.connect(listener.address, key=KEY) as s:
            got = []
            waiter = threading.Thread(target=lambda: got.append(s.recv()), daemon=True)
            waiter.start()
            waiter.join(0.2)
            assert waiter.is_alive()
            assert not s.closed
            assert "open" in repr(s)
            go.set()
            waiter.join(30)
            assert got == [b"late"]
        join()
