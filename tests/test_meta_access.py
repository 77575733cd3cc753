"""raftkv.meta.access: users and roles as metadata commands, and their encoding. Pure."""

from __future__ import annotations

import pytest

from raftkv.core.errors import ChangeRefused
from raftkv.meta.access import (ROOT_ROLE, GrantPermission, Permission, PutUser, RemoveUser, RevokePermission,
                                RoleRecord, UserRecord, role_grants)
from raftkv.meta.records import (ClusterMeta, apply, decode_access, decode_command, decode_meta, encode_access,
                                 encode_command, encode_meta)
from raftkv.meta.wire import topology_of, topology_reply
from raftkv.security.permissions import Access, Grant

SHA = "ab" * 32
META = ClusterMeta(epoch=1, replication=1)


def test_users_and_roles_change_one_command_at_a_time():
    meta = apply(META, GrantPermission("app", Permission("write", b"app/".hex())))
    meta = apply(meta, GrantPermission("app", Permission("read", "")))
    meta = apply(meta, PutUser(UserRecord("walt", ("app",), SHA)))
    assert meta.epoch == 4
    assert meta.roles == (RoleRecord("app", (Permission("write", b"app/".hex()), Permission("read", ""))),)
    assert role_grants(meta.roles)["app"] == (Grant(Access.WRITE, b"app/"), Grant(Access.READ, b""))
    assert role_grants(meta.roles)[ROOT_ROLE] == (Grant(Access.ADMIN, b""),)
    regranted = apply(meta, GrantPermission("app", Permission("admin", b"app/".hex())))
    assert regranted.roles[0].permissions == (Permission("read", ""), Permission("admin", b"app/".hex()))
    roles_only = apply(meta, PutUser(UserRecord("walt", ("app", "ops")), keep_token=True))
    assert roles_only.users == (UserRecord("walt", ("app", "ops"), SHA),)
    assert apply(meta, PutUser(UserRecord("walt", ("app",)))).users[0].token_sha256 == ""
    assert apply(meta, RemoveUser("walt")).users == ()
    revoked = apply(apply(meta, RevokePermission("app", b"app/".hex())), RevokePermission("app", ""))
    assert revoked.roles == ()


@pytest.mark.parametrize("command, why", [
    (PutUser(UserRecord("../x")), "cannot be a user name"),
    (PutUser(UserRecord("ok", ("bad role",))), "cannot be a role name"),
    (PutUser(UserRecord("ok", (), "not-hex")), "SHA-256 in hex"),
    (RemoveUser("nobody"), "no user 'nobody'"),
    (GrantPermission(ROOT_ROLE, Permission("read", "")), "cannot be changed"),
    (GrantPermission("r", Permission("delete", "")), "not an access level"),
    (GrantPermission("r", Permission("read", "zz")), "not a key prefix in hex"),
    (RevokePermission("r", ""), "has no permission on that prefix"),
])
def test_a_wrong_command_is_refused_and_changes_nothing(command, why):
    with pytest.raises(ChangeRefused, match=why):
        apply(META, command)


def test_commands_the_metadata_and_the_wire_keep_users_and_roles():
    for command in (PutUser(UserRecord("walt", ("app",), SHA), keep_token=True), RemoveUser("walt"),
                    GrantPermission("app", Permission("write", "6170")), RevokePermission("app", "6170")):
        assert decode_command(encode_command(command)) == command
    meta = apply(apply(META, GrantPermission("app", Permission("write", "6170"))),
                 PutUser(UserRecord("walt", ("app",), SHA)))
    assert decode_meta(encode_meta(meta)) == meta
    assert decode_access(encode_access(meta.users, meta.roles)) == {"users": meta.users, "roles": meta.roles}
    assert topology_of(topology_reply(meta, None, with_access=True)).meta == meta
    stripped = topology_of(topology_reply(meta, None)).meta  # to a user: no token hashes
    assert stripped.users == () and stripped.roles == ()
