"""Cookie decisions (BP-46): first boot, verified boot, and every kind of mismatch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stream.bookie.config import BookieConfig
from stream.bookie.cookie import (
    COOKIE_FILE,
    Cookie,
    CookieAction,
    DirectoryState,
    check_cookies,
    cookie_differences,
    decide_cookies,
    expected_cookie,
    read_directory_state,
)
from stream.errors import CookieMismatchError

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


def test_auto_fix_cookie_still_refuses_for_now() -> None:
    message = mismatch(EXPECTED, ZK, None, dirs(ZK, index=(None, False)), auto_fix_cookie=True)
    assert "auto_fix_cookie = true is not available yet" in message


class FakeStore:
    def __init__(self) -> None:
        self.cookies: dict[str, tuple[bytes, int]] = {}

    def read_cookie(self, bookie_id: str) -> tuple[bytes, int] | None:
        return self.cookies.get(bookie_id)

    def write_cookie(self, bookie_id: str, data: bytes, version: int | None) -> int:
        if version is None and bookie_id in self.cookies:
            raise RuntimeError("exists")
        self.cookies[bookie_id] = (data, (version or 0) + 1)
        return (version or 0) + 1


def bookie_config(tmp_path: Path, bookie_id: str = "b1", port: int = 3181) -> BookieConfig:
    return BookieConfig.from_dict(
        {
            "bookie_id": bookie_id,
            "listen": f"127.0.0.1:{port}",
            "metadata": "127.0.0.1:2181/sk",
            "data_dir": str(tmp_path / bookie_id),
        }
    )


def test_check_cookies_writes_then_verifies(tmp_path: Path) -> None:
    store = FakeStore()
    config = bookie_config(tmp_path)
    first = check_cookies(config, "inst", store)
    assert first.action is CookieAction.FIRST_BOOT
    for path in config.directories.values():
        assert Cookie.from_json((path / COOKIE_FILE).read_bytes()) == first.cookie
    assert Cookie.from_json(store.cookies["b1"][0]) == first.cookie
    assert first.cookie == expected_cookie(config, "inst", first.cookie.cookie_id)
    (config.ledger_path / "0.log").write_bytes(b"data")
    again = check_cookies(config, "inst", store)
    assert again.action is CookieAction.VERIFIED
    assert again.cookie == first.cookie


def test_check_cookies_detects_swapped_ledger_dirs(tmp_path: Path) -> None:
    store = FakeStore()
    c1, c2 = bookie_config(tmp_path, "b1", 3181), bookie_config(tmp_path, "b2", 3182)
    check_cookies(c1, "inst", store)
    check_cookies(c2, "inst", store)
    tmp = tmp_path / "swap"
    c1.ledger_path.rename(tmp)
    c2.ledger_path.rename(c1.ledger_path)
    tmp.rename(c2.ledger_path)
    with pytest.raises(CookieMismatchError, match="directory ledgers .* holds a cookie"):
        check_cookies(c1, "inst", store)


def test_check_cookies_detects_wiped_directory(tmp_path: Path) -> None:
    store = FakeStore()
    config = bookie_config(tmp_path)
    check_cookies(config, "inst", store)
    (config.index_path / COOKIE_FILE).unlink()
    with pytest.raises(CookieMismatchError, match="directory index .* has no cookie"):
        check_cookies(config, "inst", store)


def test_read_directory_state_ignores_mount_point_files(tmp_path: Path) -> None:
    (tmp_path / "lost+found").mkdir()
    state = read_directory_state("ledgers", tmp_path)
    assert state.cookie is None and not state.has_data
    absent = read_directory_state("ledgers", tmp_path / "absent")
    assert absent.cookie is None and not absent.has_data
    (tmp_path / COOKIE_FILE).write_bytes(b"garbage")
    broken = read_directory_state("ledgers", tmp_path)
    assert broken.cookie is None and broken.cookie_error
