"""A workload's cgroup: where each function lives (a table); real processes frozen and killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufrac.runtime.cgroups import (
    FUNCTIONS,
    HostLimits,
    Layout,
    Mount,
    Place,
    WorkloadCgroup,
    choose_layout,
    detect,
    enable_controllers,
    read_mounts,
    read_own,
)
from tests.counter import COUNTER, count

V1 = ("freezer", "memory", "pids", "cpu")
V1_MEMORY = frozenset({"memory", "rw"})
ROOT = Path("/sys/fs/cgroup")


def v1(c: str) -> Mount:
    return Mount(1, ROOT / c, frozenset({c, "rw"}))


@pytest.mark.parametrize(
    ("mounts", "writable", "expected"),
    [
        # this kind of machine: a v2 mount offering only hugetlb beside writable v1 controllers
        (
            [Mount(2, ROOT / "unified", frozenset({"hugetlb"})), *map(v1, V1)],
            {ROOT / "unified", *(ROOT / c for c in V1)},
            {"freeze": 2, "kill": 2, "memory": 1, "pids": 1, "cpu": 1},
        ),
        # pure v2 with the controllers
        (
            [Mount(2, ROOT, frozenset({"memory", "pids", "cpu"}))],
            {ROOT},
            {"freeze": 2, "kill": 2, "memory": 2, "pids": 2, "cpu": 2},
        ),
        # v2 not writable (a container): v1 where it is
        (
            [Mount(2, ROOT / "unified", frozenset()), v1("freezer"), v1("memory")],
            {ROOT / "freezer", ROOT / "memory"},
            {"freeze": 1, "kill": 1, "memory": 1},
        ),
        # nothing writable: no cgroups
        ([Mount(2, ROOT, frozenset({"memory"})), *map(v1, V1)], set(), {}),
    ],
)
def test_each_function_lives_where_it_is_offered_and_writable(
    mounts: list[Mount], writable: set[Path], expected: dict[str, int]
) -> None:
    layout = choose_layout(mounts, {}, {p: True for p in writable})
    assert {f: p.version for f, p in layout.places.items()} == expected
    assert layout.usable == bool(expected)
    assert Layout.from_json(layout.to_json()) == layout


def test_the_agents_own_cgroup_is_the_parent() -> None:
    own = read_own("4:memory:/svc/agent\n1:freezer:/\n0::/system.slice/a.service\n")
    assert own == {"memory": "/svc/agent", "freezer": "/", "": "/system.slice/a.service"}
    layout = choose_layout(
        [Mount(2, ROOT, frozenset()), v1("memory")],
        own,
        {ROOT / "system.slice/a.service": True, ROOT / "memory/svc/agent": True},
    )
    cg = WorkloadCgroup.for_run(layout, "gpufrac-x")
    assert cg.dirs["freeze"] == ROOT / "system.slice/a.service/gpufrac-x"
    assert cg.dirs["memory"] == ROOT / "memory/svc/agent/gpufrac-x"


def test_mountinfo_is_read() -> None:
    text = (
        "30 25 0:26 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw\n"
        "31 25 0:27 / /sys/fs/cgroup/memory rw,nosuid shared:10 - cgroup cgroup rw,memory\n"
        "32 25 0:28 / /proc rw - proc proc rw\n"
    )
    assert read_mounts(text) == [
        Mount(2, Path("/sys/fs/cgroup/unified"), frozenset()),
        Mount(1, Path("/sys/fs/cgroup/memory"), frozenset({"rw", "nosuid", "memory"})),
    ]


LAYOUT = detect()
needs_cgroups = pytest.mark.skipif(not LAYOUT.usable, reason="no writable cgroup hierarchy here")
_FREEZER = Path("/sys/fs/cgroup/freezer")
V1_FREEZER = Layout(
    {
        f: Place(1, _FREEZER, read_own(Path("/proc/self/cgroup").read_text()).get("freezer", "/"))
        for f in ("freeze", "kill")
    }
    if os.access(_FREEZER, os.W_OK)
    else {}
)


# a workload that counts in a file, and a child that leaves its group (setsid) and counts too
def _until(check: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not callable(check) or not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("layout", [LAYOUT, V1_FREEZER], ids=["detected", "v1-freezer"])
def test_freeze_stops_every_process_even_one_that_left_its_group(
    tmp_path: Path, layout: Layout
) -> None:
    if not layout.usable:
        pytest.skip("no writable hierarchy of this kind here")
    cg = WorkloadCgroup.for_run(layout, f"gpufrac-test-{os.getpid()}-freeze")
    assert cg.create(HostLimits()) == []
    out = tmp_path / "n"
    proc = subprocess.Popen(
        [sys.executable, "-c", COUNTER, str(out)],
        preexec_fn=lambda: cg.enter(os.getpid()),
        start_new_session=True,
    )
    try:
        escaped = Path(f"{out}.escaped")
        count(out), count(escaped)
        _until(lambda: len(cg.pids()) == 2)
        assert cg.freeze()
        _until(lambda: cg.frozen() is True)
        events = "cgroup.events" if cg.versions["freeze"] == 2 else "freezer.state"
        kernel_says = (cg.dirs["freeze"] / events).read_text()
        assert "frozen 1" in kernel_says or "FROZEN" in kernel_says
        before = (count(out), count(escaped))
        time.sleep(0.2)
        assert (count(out), count(escaped)) == before  # neither advanced
        assert cg.thaw()
        _until(lambda: count(out) > before[0] and count(escaped) > before[1])
    finally:
        cg.kill()
        proc.wait(timeout=5)
        assert cg.remove()
    assert not cg.exists()
    assert not any(d.exists() for d in cg.dirs.values())


@needs_cgroups
def test_kill_reaches_an_escaped_child_and_remove_leaves_nothing(tmp_path: Path) -> None:
    cg = WorkloadCgroup.for_run(LAYOUT, f"gpufrac-test-{os.getpid()}-kill")
    cg.create(HostLimits())
    out = tmp_path / "n"
    proc = subprocess.Popen(
        [sys.executable, "-c", COUNTER, str(out)],
        preexec_fn=lambda: cg.enter(os.getpid()),
        start_new_session=True,
    )
    count(Path(f"{out}.escaped"))
    cg.kill()
    proc.wait(timeout=5)
    _until(lambda: not cg.pids())
    assert cg.remove()
    assert not cg.exists()


@needs_cgroups
@pytest.mark.skipif("memory" not in LAYOUT.places, reason="no writable memory controller here")
def test_a_process_over_its_host_memory_is_killed_and_counted() -> None:
    cg = WorkloadCgroup.for_run(LAYOUT, f"gpufrac-test-{os.getpid()}-mem")
    cg.create(HostLimits(memory_bytes=64 * 2**20))
    hog = "b = []\nwhile True:\n    b.append(bytearray(8 * 2**20))\n"
    proc = subprocess.Popen([sys.executable, "-c", hog], preexec_fn=lambda: cg.enter(os.getpid()))
    try:
        assert proc.wait(timeout=20) == -9
        assert cg.oom_kills() >= 1
    finally:
        cg.remove()


@needs_cgroups
@pytest.mark.skipif("memory" not in LAYOUT.places, reason="no writable memory controller here")
def test_a_kill_below_the_cgroup_counts_after_that_cgroup_is_removed() -> None:
    # as a container engine does: its container's cgroup below the workload's, removed as soon
    # as the container has ended (on v1 its own count goes with it)
    cg = WorkloadCgroup.for_run(LAYOUT, f"gpufrac-test-{os.getpid()}-below")
    cg.create(HostLimits(memory_bytes=64 * 2**20))
    oom = cg.watch_oom()
    below = cg.dirs["memory"] / "container"
    below.mkdir()
    hog = "b = []\nwhile True:\n    b.append(bytearray(8 * 2**20))\n"
    enter = lambda: (below / "cgroup.procs").write_text(str(os.getpid()))  # noqa: E731
    try:
        assert oom.hits() == 0
        proc = subprocess.Popen([sys.executable, "-c", hog], preexec_fn=enter)
        assert proc.wait(timeout=20) == -9
        below.rmdir()
        assert oom.hits() >= 1
        assert oom.registered == (cg.versions["memory"] == 1)
    finally:
        oom.close()
        cg.remove()


def test_a_limit_whose_file_is_missing_is_reported_not_dropped(tmp_path: Path) -> None:
    """A v2 controller listed at the root but not enabled for the agent's cgroup has no files in
    the workload's: the limit is said to be not applied."""
    layout = choose_layout(
        [Mount(2, tmp_path, frozenset({"memory", "pids", "cpu"}))], {}, {tmp_path: True}
    )
    cg = WorkloadCgroup.for_run(layout, "gpufrac-x")
    missing = cg.create(HostLimits(memory_bytes=2**30, milli_cpus=500, pids=10))
    assert [m.split(" ")[0] for m in missing] == ["host_memory", "pids", "cpus"]


def _v2_tree(tmp_path: Path, enabled: str = "") -> tuple[Layout, Path]:
    """A fake cgroup v2 tree: the root offers memory, pids and cpu; the agent's cgroup is
    ``/agent``, with ``enabled`` in its ``cgroup.subtree_control``."""
    parent = tmp_path / "agent"
    parent.mkdir(parents=True)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (parent / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (parent / "cgroup.subtree_control").write_text(enabled)
    mount = Mount(2, tmp_path, frozenset({"cpuset", "cpu", "io", "memory", "pids"}))
    layout = choose_layout([mount], {"": "/agent"}, {parent: True})
    assert {f: p.version for f, p in layout.places.items()} == dict.fromkeys(FUNCTIONS, 2)
    return layout, parent / "cgroup.subtree_control"


@pytest.mark.parametrize(
    ("enabled", "written"),
    [
        ("", "+memory +pids +cpu"),  # a pure v2 host where nobody enabled them for the agent's
        ("memory\n", "+pids +cpu"),
        ("cpu io memory pids\n", "cpu io memory pids\n"),  # all there: nothing written
    ],
)
def test_the_controllers_workloads_need_are_enabled_in_the_parents_subtree_control(
    tmp_path: Path, enabled: str, written: str
) -> None:
    layout, control = _v2_tree(tmp_path, enabled)
    assert enable_controllers(layout) == []
    assert control.read_text() == written


def test_a_controller_that_cannot_be_enabled_is_reported_not_raised(tmp_path: Path) -> None:
    layout, control = _v2_tree(tmp_path)
    control.unlink()
    control.mkdir()  # neither read nor written: each write fails
    problems = enable_controllers(layout)
    assert [p.split(" ")[5] for p in problems] == ["memory", "pids", "cpu"]
    assert all(str(control) in p for p in problems)
    assert "host_memory limits are not applied" in problems[0]
    assert "cpus limits are not applied" in problems[2]


def test_a_v1_controller_needs_no_subtree_control(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    layout = choose_layout(
        [Mount(2, tmp_path / "unified", frozenset()), Mount(1, tmp_path / "memory", V1_MEMORY)],
        {},
        {tmp_path / "unified": True, tmp_path / "memory": True},
    )
    assert layout.places["memory"].version == 1
    assert enable_controllers(layout) == []
    assert not list(tmp_path.rglob("cgroup.subtree_control"))


def test_the_process_runner_enables_them_before_any_workload_and_says_what_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpufrac.runtime.process_runner import ProcessRunner

    layout, control = _v2_tree(tmp_path / "ok")
    assert ProcessRunner(layout).problems == []
    assert control.read_text() == "+memory +pids +cpu"
    layout, control = _v2_tree(tmp_path / "refused")
    control.unlink()
    control.mkdir()
    assert len(ProcessRunner(layout).problems) == 3
    assert capsys.readouterr().err.count("gpufrac: warning: cannot enable the cgroup v2") == 3
