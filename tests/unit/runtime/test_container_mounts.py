"""Where a container mount leads must be a path only root can change: a directory on the way that
another user may write lets that user swap it (a symbolic link to /etc) between gpufrac's check
and the engine's mount."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufrac.errors import InputError
from gpufrac.model.workload import VolumeMount
from gpufrac.runtime.container_runner import changeable_by, check_mount_sources

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="owners are set as root")


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A root-owned directory only root may write, under pytest's own (root's, 0700)."""
    d = tmp_path / "share"
    d.mkdir(mode=0o755)
    return d


def test_a_path_only_root_can_change_is_mountable(base: Path) -> None:
    (base / "models").mkdir(mode=0o755)
    assert changeable_by(str(base / "models")) is None
    tenant = base / "alice"  # a tenant's own directory, in a parent only root may write
    tenant.mkdir()
    os.chown(tenant, 200000, 200000)
    assert changeable_by(str(tenant)) is None


def test_a_directory_a_tenant_owns_on_the_way_is_refused(base: Path) -> None:
    tenant = base / "bob"
    (tenant / "d").mkdir(parents=True)
    os.chown(tenant, 200001, 200001)  # bob may rename d, or swap it for a link
    assert changeable_by(str(tenant / "d")) == f"uid 200001 owns {tenant}"
    with pytest.raises(InputError) as e:
        check_mount_sources((VolumeMount(str(tenant / "d"), "/d"),), (str(tenant / "d"),))
    assert e.value.field == "spec.mounts[0].source" and "swapped" in e.value.message


@pytest.mark.parametrize(
    ("mode", "gid", "writer"),
    [(0o775, 1000, "group 1000 may write"), (0o777, 0, "everyone may write")],
)
def test_a_directory_others_may_write_is_refused(
    base: Path, mode: int, gid: int, writer: str
) -> None:
    (base / "x").mkdir()
    os.chown(base, 0, gid)
    base.chmod(mode)
    who = changeable_by(str(base / "x"))
    assert who is not None and who.startswith(writer), who
    base.chmod(0o775)
    os.chown(base, 0, 0)
    assert changeable_by(str(base / "x")) is None  # root's group writing it is root's


def test_in_a_sticky_directory_only_an_entry_root_owns_is_safe(base: Path) -> None:
    base.chmod(0o1777)  # as /tmp: everyone may add, only an entry's owner may rename it
    (base / "roots").mkdir()
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, 200002, 200002)
    (theirs / "x").mkdir()
    assert changeable_by(str(base / "roots")) is None
    assert changeable_by(str(theirs)) == f"everyone may write {base}"


def test_a_source_that_does_not_exist_is_refused(base: Path) -> None:
    gone = str(base / "not-there")
    with pytest.raises(InputError) as e:
        check_mount_sources((VolumeMount(gone, "/x"),), (gone,))
    assert e.value.field == "spec.mounts[0].source" and "does not exist" in e.value.message
