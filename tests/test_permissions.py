"""The permission check: roles granting read, write or admin per key prefix."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from raftkv.security.permissions import Access, Grant, Identity, Request, check

ROLES = {
    "reader": [Grant(Access.READ)],
    "app-writer": [Grant(Access.WRITE, b"app/")],
    "root": [Grant(Access.ADMIN)],
    "app-admin": [Grant(Access.ADMIN, b"app/")],
}
USERS = {"rita": ["reader"], "walt": ["app-writer"], "ada": ["root"], "pat": ["app-admin", "reader"], "nobody": []}


def allowed(user: str, *requests: Request) -> str | None:
    return check(Identity(user), requests, USERS, ROLES)


def test_a_read_only_user_reads_everything_and_writes_nothing():
    assert allowed("rita", Request.key(Access.READ, b"app/x"), Request(Access.READ, b"", None)) is None
    assert allowed("rita", Request.key(Access.WRITE, b"app/x")) == (
        "permission denied: user rita may not write key b'app/x'")


def test_write_on_a_prefix_reads_and_writes_under_it_and_nothing_else():
    assert allowed("walt", Request.key(Access.WRITE, b"app/x"), Request.key(Access.READ, b"app/y")) is None
    assert allowed("walt", Request(Access.WRITE, b"app/", b"app0")) is None  # a delete of the whole prefix
    assert allowed("walt", Request.key(Access.WRITE, b"other/x")) == (
        "permission denied: user walt may not write key b'other/x'")
    assert allowed("walt", Request(Access.READ, b"app/", None)) == (
        "permission denied: user walt may not read keys [b'app/', the end)")
    assert allowed("walt", Request(Access.WRITE, b"ap", b"app0")) is not None  # begins outside the prefix


def test_a_batch_is_allowed_only_whole_and_the_first_denial_is_named():
    batch = [Request.key(Access.WRITE, b"app/a"), Request.key(Access.WRITE, b"other/b"), Request.key(Access.WRITE, b"x")]
    assert allowed("walt", *batch) == "permission denied: user walt may not write key b'other/b'"


def test_admin_verbs_need_admin_on_the_whole_keyspace():
    assert allowed("ada", Request.admin("add_learner"), Request.key(Access.WRITE, b"any")) is None
    assert allowed("pat", Request.admin("add_learner")) == "permission denied: user pat may not run add_learner"
    assert allowed("pat", Request.key(Access.WRITE, b"app/k"), Request.key(Access.READ, b"zzz")) is None


def test_anyone_authenticated_may_ask_where_partitions_are_and_an_unknown_user_nothing_else():
    assert allowed("nobody", Request.admin("topology"), Request.admin("status")) is None
    assert allowed("stranger", Request.key(Access.READ, b"k")) == (
        "permission denied: user stranger may not read key b'k'")


def test_nodes_may_do_anything_and_learners_read_and_report_progress():
    node, learner = Identity("n1", "node"), Identity("chaos-feed", "learner")
    assert check(node, [Request.admin("change_membership"), Request.key(Access.WRITE, b"k")], {}, {}) is None
    assert check(learner, [Request(Access.READ, b"", None), Request.admin("report_progress")], {}, {}) is None
    assert check(learner, [Request.key(Access.WRITE, b"k")], {}, {}) == (
        "permission denied: learner chaos-feed may not write key b'k'")


ALPHABET = b"a\x00\xff"
KEYS = [bytes(k) for n in range(4) for k in itertools.product(ALPHABET, repeat=n)]
keys = st.binary(max_size=3).map(lambda b: bytes(ALPHABET[x % 3] for x in b))
grants = st.lists(st.builds(Grant, st.sampled_from(Access), keys), max_size=4)


@settings(max_examples=500, deadline=None)
@given(grants, st.sampled_from([Access.READ, Access.WRITE]), keys, st.one_of(st.none(), keys))
def test_a_range_is_allowed_only_if_every_key_in_it_is_granted(granted, access, start, end):
    """Against a naive twin: every key of a small alphabet in the range must start with a prefix
    granted at the access or above. The check may refuse a range no single grant covers, never allow
    one with a key outside every grant."""
    decision = check(Identity("u"), [Request(access, start, end)], {"u": ["r"]}, {"r": granted})
    inside = [k for k in KEYS if k >= start and (end is None or k < end)]
    if decision is None:
        assert all(any(g.access >= access and k.startswith(g.prefix) for g in granted) for k in inside)
    single = Request.key(access, start)
    assert (check(Identity("u"), [single], {"u": ["r"]}, {"r": granted}) is None) == any(
        g.access >= access and start.startswith(g.prefix) for g in granted)
