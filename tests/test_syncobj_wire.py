"""pysyncobj's messages at our zlib level, still readable by any pysyncobj."""

from __future__ import annotations

import os
import zlib

import pysyncobj.tcp_connection
import pytest

from raftkv.raft.syncobj_wire import set_compression_level


@pytest.fixture
def restore_level():
    yield
    set_compression_level(0)


def test_messages_go_out_at_our_level_and_decompress_as_plain_zlib(restore_level):
    message = os.urandom(2000) + b"x" * 8000
    wire = pysyncobj.tcp_connection.zlib  # what pysyncobj's send and receive call
    set_compression_level(0)
    stored = wire.compress(message, 3)  # pysyncobj asks for 3
    assert len(stored) > len(message)  # level 0: stored blocks, no compression work
    set_compression_level(6)
    squeezed = wire.compress(message, 3)
    assert len(squeezed) < 3000
    assert zlib.decompress(stored) == zlib.decompress(squeezed) == wire.decompress(stored) == message


def test_a_level_outside_zlibs_range_is_refused(restore_level):
    with pytest.raises(ValueError, match="0-9"):
        set_compression_level(10)
