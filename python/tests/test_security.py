"""Keys, encryption by default, and the channel settings a connecting end proposes."""

import os
import stat
import threading

import pytest

import dedupwire
from dedupwire import DedupError, Key

PASSPHRASE = "a passphrase both ends share"


def accept_outcome(listener):
    """Accepts one connection on a thread; join() gives the stream's (message, config) or the
    DedupError accept raised."""
    box = {}

    def run():
        try:
            with listener.accept() as s:
                box["result"] = (s.recv(), s.config, s.encrypted)
        except DedupError as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join():
        t.join(60)
        assert not t.is_alive()
        return box.get("error", box.get("result"))

    return join


def test_key_generate_save_load_and_id(tmp_path):
    key = Key.generate()
    assert len(key.hex()) == 64
    assert len(key.id) == 8
    assert key.hex() not in repr(key) and key.id in repr(key)
    assert key != Key.generate()
    path = tmp_path / "channel.key"
    key.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Key.load(path) == key
    assert Key.load(str(path)).id == key.id
    with pytest.raises(DedupError, match="cannot write key file"):
        Key.generate().save(path)  # an existing key is never overwritten
    assert Key.from_text(key.hex()) == key
    assert Key.from_text(PASSPHRASE) == Key.from_text(f"  {PASSPHRASE}\n")
    with pytest.raises(DedupError, match="at least 16"):
        Key.from_text("short")
    with pytest.raises(DedupError, match="cannot read key file"):
        Key.load(tmp_path / "missing")


def test_no_key_is_refused_with_directions():
    for call in (
        lambda: dedupwire.listen("127.0.0.1:0"),
        lambda: dedupwire.connect("127.0.0.1:1"),
    ):
        with pytest.raises(DedupError) as e:
            call()
        message = str(e.value)
        assert "Key.generate()" in message and "insecure_plaintext=True" in message, message
    with pytest.raises(DedupError, match="not both"):
        dedupwire.listen("127.0.0.1:0", key=PASSPHRASE, insecure_plaintext=True)


@pytest.mark.parametrize("key", [PASSPHRASE, Key.from_text(PASSPHRASE)])
def test_a_key_as_text_or_key_round_trips_encrypted(key):
    with dedupwire.listen("127.0.0.1:0", key=key) as listener:
        assert listener.encrypted
        join = accept_outcome(listener)
        with dedupwire.connect(listener.address, key=Key.from_text(PASSPHRASE)) as s:
            assert s.encrypted and "encrypted" in repr(s)
            s.send(b"secret")
        message, _, encrypted = join()
    assert message == b"secret" and encrypted


def test_another_key_is_refused_on_both_ends():
    with dedupwire.listen("127.0.0.1:0", key=PASSPHRASE) as listener:
        join = accept_outcome(listener)
        with pytest.raises(DedupError, match="authentication failed"):
            dedupwire.connect(listener.address, key="another passphrase entirely")
        server = join()
    assert isinstance(server, DedupError) and "authentication failed" in str(server)


def test_plaintext_and_encrypted_ends_refuse_each_other():
    with dedupwire.listen("127.0.0.1:0", key=PASSPHRASE) as listener:
        join = accept_outcome(listener)
        with pytest.raises(DedupError, match="encrypted connections only"):
            dedupwire.connect(listener.address, insecure_plaintext=True)
        assert "speaks plaintext" in str(join())
    with dedupwire.listen("127.0.0.1:0", insecure_plaintext=True) as listener:
        assert not listener.encrypted and "INSECURE" in repr(listener)
        join = accept_outcome(listener)
        with pytest.raises(DedupError, match="speaks plaintext"):
            dedupwire.connect(listener.address, key=PASSPHRASE)
        assert "speaks encrypted" in str(join())


def test_insecure_plaintext_on_both_ends_round_trips():
    with dedupwire.listen("127.0.0.1:0", insecure_plaintext=True) as listener:
        join = accept_outcome(listener)
        with dedupwire.connect(listener.address, insecure_plaintext=True) as s:
            assert not s.encrypted and "INSECURE PLAINTEXT" in repr(s)
            s.send(b"in the clear")
        message, _, encrypted = join()
    assert message == b"in the clear" and not encrypted


def test_the_connecting_end_s_settings_are_agreed_and_visible():
    with dedupwire.listen("127.0.0.1:0", key=PASSPHRASE) as listener:
        join = accept_outcome(listener)
        with dedupwire.connect(
            listener.address,
            key=PASSPHRASE,
            mode="dedup",
            levels=[64 << 10, 4 << 10],
            segment_size=1 << 20,
        ) as s:
            ours = s.config
            s.send(b"x" * 100_000)
        _, theirs, _ = join()
    assert ours == theirs
    assert ours["mode"] == "dedup"
    assert ours["levels"] == [64 << 10, 4 << 10]
    assert ours["segment_size"] == 1 << 20
    assert ours["identifier"] == "blake3" and ours["delta"] is True


def test_defaults_and_bad_settings():
    with dedupwire.listen("127.0.0.1:0", key=PASSPHRASE) as listener:
        join = accept_outcome(listener)
        with dedupwire.connect(listener.address, key=PASSPHRASE) as s:
            config = s.config
            s.send(b"")
        join()
    assert config["mode"] == "adaptive"
    assert config["levels"] == [256 << 10, 16 << 10]
    assert config["segment_size"] == 8 << 20
    with pytest.raises(ValueError, match="segment size"):
        dedupwire.connect("127.0.0.1:1", key=PASSPHRASE, segment_size=1000)
    with pytest.raises(ValueError, match="levels"):
        dedupwire.connect("127.0.0.1:1", key=PASSPHRASE, levels=[])
    with pytest.raises(ValueError):
        dedupwire.connect("127.0.0.1:1", key=PASSPHRASE, levels=[3])
