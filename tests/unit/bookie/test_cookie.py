"""Cookie decisions (BP-46): first boot, verified boot, every kind of mismatch, which ones phase
one can fix (auto_fix_cookie, `streamctl bookie fix-cookie`), and the cookie I/O against the real
bookie registry in ZooKeeper."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream.bookie.config import BookieConfig
from stream.bookie.cookie import (
    COOKIE_FILE,
    Cookie,
    CookieAction,
    CookieDecision,
    DirectoryState,
    apply_cookie_fix,
    check_cookies,
    cookie_differences,
    decide_cookies,
    discard_index_for_fix,
    expected_cookie,
    inspect_cookies,
    read_directory_state,
)
from stream.errors import CookieMismatchError
from stream.metadata import BookieRegistry, MetadataSession

DIRS = {"journal": "/d/journal", "ledgers": "/d/ledgers", "index": "/d/index"}


def make_cookie(**overrides: object) -> Cookie:
    fields: dict[str, object] = {
        "bookie_id": "b1",
        "address": "127.0.0.1:3181",
        "directories": dict(DIRS),
        "instance_id": "inst-1",
        "cookie_id": "c-1",
    }
    fields.update(overrides)
    return Cookie(**fields)  # type: ignore[arg-type]


def dirs(cookie: Cookie | None, *, data: bool = True, **per_dir: object) -> list[DirectoryState]:
    """Returns the three directory states, each with `cookie` and `data` unless `per_dir`
    overrides one by name with a (cookie, has_data) pair."""
    states = []
    for name, path in DIRS.items():
        c, d = per_dir.get(name, (cookie, data))  # type: ignore[misc]
        states.append(DirectoryState(name, path, c, None, has_data=d))  # type: ignore[arg-type]
    return states


EXPECTED = make_cookie(cookie_id="fresh")
ZK = make_cookie()


def test_json_round_trip_and_canonical_bytes() -> None:
    c = make_cookie()
    assert Cookie.from_json(c.to_json()) == c
    reordered = make_cookie(directories=dict(reversed(list(DIRS.items()))))
    assert reordered.to_json() == c.to_json()


@pytest.mark.parametrize(
    "data",
    [b"", b"\xff", b"[]", b'{"version": 2}', b'{"version": 1, "bookie_id": "b1"}'],
)
def test_from_json_rejects_non_cookies(data: bytes) -> None:
    with pytest.raises(ValueError):
        Cookie.from_json(data)


def test_differences_name_fields_and_directories() -> None:
    a = make_cookie()
    b = make_cookie(address="h:1", directories={**DIRS, "ledgers": "/x"}, cookie_id="c-2")
    assert cookie_differences(a, b) == ["address", "directories.ledgers", "cookie_id"]
    assert cookie_differences(a, b, ignore_cookie_id=True) == ["address", "directories.ledgers"]
    assert cookie_differences(a, a) == []


def test_first_boot_when_nothing_anywhere() -> None:
    d = decide_cookies(EXPECTED, None, None, dirs(None, data=False))
    assert d.action is CookieAction.FIRST_BOOT
    assert d.cookie == EXPECTED
    assert d.write_directories == ("journal", "ledgers", "index")
    assert d.write_zookeeper


def test_verified_when_all_equal() -> None:
    d = decide_cookies(EXPECTED, ZK, None, dirs(ZK))
    assert d.action is CookieAction.VERIFIED
    assert d.cookie == ZK
    assert d.write_directories == () and not d.write_zookeeper


def test_verified_with_empty_directories_holding_cookies() -> None:
    d = decide_cookies(EXPECTED, ZK, None, dirs(ZK, data=False))
    assert d.action is CookieAction.VERIFIED


def test_resume_interrupted_first_boot() -> None:
    partial = make_cookie(cookie_id="half-written")
    states = dirs(None, data=False, journal=(partial, False))
    d = decide_cookies(EXPECTED, None, None, states)
    assert d.action is CookieAction.RESUME_FIRST_BOOT
    assert d.cookie == partial
    assert d.write_directories == ("ledgers", "index")
    assert d.write_zookeeper


def mismatch(*args: object, **kwargs: object) -> str:
    with pytest.raises(CookieMismatchError) as e:
        decide_cookies(*args, **kwargs)  # type: ignore[arg-type]
    message = str(e.value)
    assert "streamctl bookie fix-cookie" in message
    assert "b1" in message
    return message


def test_missing_directory_cookie_is_data_loss() -> None:
    message = mismatch(EXPECTED, ZK, None, dirs(ZK, ledgers=(None, False)))
    assert "directory ledgers (/d/ledgers) has no cookie" in message
    assert "may be lost" in message
    assert "journal" not in message.split("fix-cookie")[0].split("ledgers")[0]


def test_swapped_directory_names_fields() -> None:
    other = make_cookie(
        bookie_id="b2", address="127.0.0.1:3182", cookie_id="c-9", directories={**DIRS}
    )
    message = mismatch(EXPECTED, ZK, None, dirs(ZK, ledgers=(other, True)))
    assert "directory ledgers (/d/ledgers) holds a cookie that differs" in message
    assert "bookie_id: directory has 'b2', ZooKeeper has 'b1'" in message
    assert "cookie_id" in message
    assert "swapped" in message


def test_missing_zookeeper_cookie_with_data() -> None:
    message = mismatch(EXPECTED, None, None, dirs(ZK))
    assert "ZooKeeper has no cookie" in message
    assert "metadata may have been reset" in message


def test_data_without_any_cookie_is_refused() -> None:
    # A directory with data but no cookie anywhere is not a first boot.
    message = mismatch(EXPECTED, None, None, dirs(None, data=False, index=(None, True)))
    assert "index (/d/index)" in message


def test_config_changed_since_cookie() -> None:
    moved = dataclasses.replace(EXPECTED, directories={**DIRS, "journal": "/new/journal"})
    message = mismatch(moved, ZK, None, dirs(ZK))
    assert "directories.journal: ZooKeeper has '/d/journal', config has '/new/journal'" in message


def test_other_cluster_instance() -> None:
    message = mismatch(dataclasses.replace(EXPECTED, instance_id="inst-2"), ZK, None, dirs(ZK))
    assert "instance_id" in message


def test_unreadable_cookies() -> None:
    states = dirs(ZK)
    states[0] = dataclasses.replace(states[0], cookie=None, cookie_error="not JSON")
    assert "unreadable cookie (not JSON)" in mismatch(EXPECTED, ZK, None, states)
    assert "ZooKeeper is unreadable" in mismatch(EXPECTED, None, "not JSON", dirs(ZK))


def test_interrupted_first_boot_of_another_bookie_is_refused() -> None:
    foreign = make_cookie(bookie_id="b2", cookie_id="x")
    message = mismatch(EXPECTED, None, None, dirs(None, data=False, index=(foreign, False)))
    assert "holds a cookie of another bookie" in message


def fix(*args: object, **kwargs: object) -> CookieDecision:
    decision = decide_cookies(*args, **kwargs)  # type: ignore[arg-type]
    assert decision.action is CookieAction.FIX
    return decision


def test_without_auto_fix_a_repairable_mismatch_names_the_fix_command() -> None:
    message = mismatch(EXPECTED, ZK, None, dirs(ZK, index=(None, False)))
    assert "`streamctl bookie fix-cookie --config <bookie.toml>`" in message
    assert "auto_fix_cookie = true" in message


@pytest.mark.parametrize("how", [{"auto_fix_cookie": True}, {"fixing": True}])
def test_wiped_directory_is_fixed_by_phase_one(how: dict[str, bool]) -> None:
    d = fix(EXPECTED, ZK, None, dirs(ZK, index=(None, False)), zk_version=4, **how)
    # The same identity (ZooKeeper's cookie id), written where it is missing.
    assert d.cookie == ZK
    assert d.write_directories == ("index",)
    assert not d.write_zookeeper
    assert d.lost_directories == ("index",)
    assert any("directory index (/d/index) has no cookie" in p for p in d.problems)


def test_everything_wiped_is_fixed() -> None:
    d = fix(EXPECTED, ZK, None, dirs(None, data=False), auto_fix_cookie=True)
    assert d.write_directories == ("journal", "ledgers", "index")
    assert d.lost_directories == ("journal", "ledgers", "index")


def test_moved_address_is_fixed_with_a_versioned_zookeeper_write() -> None:
    moved = dataclasses.replace(EXPECTED, address="127.0.0.1:4000")
    d = fix(moved, ZK, None, dirs(ZK), fixing=True, zk_version=7)
    assert d.cookie == dataclasses.replace(ZK, address="127.0.0.1:4000")
    assert d.write_zookeeper and d.zk_version == 7
    assert d.write_directories == ("journal", "ledgers", "index")
    assert d.lost_directories == ()


def test_interrupted_fix_is_finished() -> None:
    # ZooKeeper got the new address, the directories still hold the old one.
    new_zk = make_cookie(address="127.0.0.1:4000")
    moved = dataclasses.replace(EXPECTED, address="127.0.0.1:4000")
    d = fix(moved, new_zk, None, dirs(ZK), auto_fix_cookie=True)
    assert d.cookie == new_zk and not d.write_zookeeper
    assert d.write_directories == ("journal", "ledgers", "index")


@pytest.mark.parametrize(
    "states",
    [
        dirs(ZK, ledgers=(make_cookie(bookie_id="b2", cookie_id="c-9"), True)),  # swapped
        dirs(ZK, ledgers=(make_cookie(cookie_id="older-incarnation"), True)),  # restored copy
        dirs(ZK, ledgers=(None, True)),  # data without a cookie
    ],
    ids=["swapped", "other-incarnation", "data-without-cookie"],
)
def test_foreign_data_is_never_fixed_automatically(states: list[DirectoryState]) -> None:
    for how in ({"auto_fix_cookie": True}, {"fixing": True}):
        message = mismatch(EXPECTED, ZK, None, states, **how)
        assert "Not repairable automatically" in message
        assert "neither auto_fix_cookie nor" in message


def test_other_cluster_is_never_fixed_automatically() -> None:
    other = dataclasses.replace(EXPECTED, instance_id="inst-2")
    assert "Not repairable" in mismatch(other, ZK, None, dirs(ZK), auto_fix_cookie=True)
    assert "Not repairable" in mismatch(EXPECTED, None, None, dirs(ZK), auto_fix_cookie=True)


@pytest.fixture
def registry(metadata_root: str) -> Iterator[BookieRegistry]:
    """The real cookie store: the bookie registry on a fresh ZooKeeper root."""
    session = MetadataSession.connect(metadata_root)
    try:
        yield BookieRegistry(session)
    finally:
        session.close()


def bookie_config(
    tmp_path: Path, bookie_id: str = "b1", port: int = 3181, **overrides: object
) -> BookieConfig:
    return BookieConfig.from_dict(
        {
            "bookie_id": bookie_id,
            "listen": f"127.0.0.1:{port}",
            "metadata": "127.0.0.1:2181/sk",
            "data_dir": str(tmp_path / bookie_id),
            **overrides,
        }
    )


def zk_cookie(registry: BookieRegistry, bookie_id: str = "b1") -> Cookie:
    found = registry.read_cookie(bookie_id)
    assert found is not None
    return Cookie.from_json(found[0])


def test_check_cookies_writes_then_verifies(tmp_path: Path, registry: BookieRegistry) -> None:
    config = bookie_config(tmp_path)
    first = check_cookies(config, "inst", registry)
    assert first.action is CookieAction.FIRST_BOOT
    for path in config.directories.values():
        assert Cookie.from_json((path / COOKIE_FILE).read_bytes()) == first.cookie
    assert zk_cookie(registry) == first.cookie
    assert first.cookie == expected_cookie(config, "inst", first.cookie.cookie_id)
    (config.ledger_path / "0.log").write_bytes(b"data")
    again = check_cookies(config, "inst", registry)
    assert again.action is CookieAction.VERIFIED
    assert again.cookie == first.cookie


def test_check_cookies_detects_swapped_ledger_dirs(
    tmp_path: Path, registry: BookieRegistry
) -> None:
    c1, c2 = bookie_config(tmp_path, "b1", 3181), bookie_config(tmp_path, "b2", 3182)
    check_cookies(c1, "inst", registry)
    check_cookies(c2, "inst", registry)
    tmp = tmp_path / "swap"
    c1.ledger_path.rename(tmp)
    c2.ledger_path.rename(c1.ledger_path)
    tmp.rename(c2.ledger_path)
    with pytest.raises(CookieMismatchError, match="directory ledgers .* holds a cookie"):
        check_cookies(c1, "inst", registry)


def test_check_cookies_detects_wiped_directory(tmp_path: Path, registry: BookieRegistry) -> None:
    config = bookie_config(tmp_path)
    check_cookies(config, "inst", registry)
    (config.index_path / COOKIE_FILE).unlink()
    with pytest.raises(CookieMismatchError, match="directory index .* has no cookie"):
        check_cookies(config, "inst", registry)


def test_auto_fix_writes_nothing_until_applied(tmp_path: Path, registry: BookieRegistry) -> None:
    config = bookie_config(tmp_path, auto_fix_cookie=True)
    first = check_cookies(config, "inst", registry)
    (config.ledger_path / "0.log").write_bytes(b"entries")
    (config.index_path / "data.mdb").write_bytes(b"index")
    (config.journal_path / COOKIE_FILE).unlink()  # the journal disk was replaced
    decision = check_cookies(config, "inst", registry)
    assert decision.action is CookieAction.FIX
    assert not (config.journal_path / COOKIE_FILE).exists()  # phase one has not run yet
    # A lost directory: the index may point into lost files or miss lost truncations.
    assert discard_index_for_fix(config, decision) == ["data.mdb"]
    assert sorted(p.name for p in config.index_path.iterdir()) == [COOKIE_FILE]
    assert (config.ledger_path / "0.log").exists()
    apply_cookie_fix(config, decision, registry)
    assert check_cookies(config, "inst", registry).action is CookieAction.VERIFIED
    assert zk_cookie(registry) == first.cookie


def test_apply_cookie_fix_moves_the_address_by_cas(
    tmp_path: Path, registry: BookieRegistry
) -> None:
    check_cookies(bookie_config(tmp_path), "inst", registry)
    moved = bookie_config(tmp_path, port=4000)
    decision = inspect_cookies(moved, "inst", registry, fixing=True)
    assert decision.action is CookieAction.FIX and decision.lost_directories == ()
    assert discard_index_for_fix(moved, decision) == []
    # Someone else changes the cookie meanwhile: the versioned write refuses.
    found = registry.read_cookie("b1")
    assert found is not None
    registry.write_cookie("b1", found[0].replace(b"3181", b"3999"), found[1])
    with pytest.raises(CookieMismatchError, match="changed while it was being fixed"):
        apply_cookie_fix(moved, decision, registry)
    decision = inspect_cookies(moved, "inst", registry, fixing=True)
    apply_cookie_fix(moved, decision, registry)
    assert zk_cookie(registry).address == "127.0.0.1:4000"
    assert check_cookies(moved, "inst", registry).action is CookieAction.VERIFIED


def test_read_directory_state_ignores_mount_point_files(tmp_path: Path) -> None:
    (tmp_path / "lost+found").mkdir()
    state = read_directory_state("ledgers", tmp_path)
    assert state.cookie is None and not state.has_data
    absent = read_directory_state("ledgers", tmp_path / "absent")
    assert absent.cookie is None and not absent.has_data
    (tmp_path / COOKIE_FILE).write_bytes(b"garbage")
    broken = read_directory_state("ledgers", tmp_path)
    assert broken.cookie is None and broken.cookie_error
