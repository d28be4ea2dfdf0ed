"""The test image for real containers: built once from the host's own files (an empty rootfs of
mount points; /usr and the venv are bind-mounted read-only when it runs), and whether podman can
run here at all."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

IMAGE = "localhost/gpufrac-test:1"
PODMAN = ["podman", "--runtime", "/usr/sbin/runc", "--cgroup-manager", "cgroupfs"]


def _build() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        for d in ("usr", "tmp", "etc", "dev", "proc", "sys", "run", "var", "work"):
            (root / d).mkdir(parents=True)
        (root / "tmp").chmod(0o1777)
        for link, to in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            (root / link).symlink_to(to)
        (root / "sbin").symlink_to("usr/sbin")
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (root / "etc" / "group").write_text("root:x:0:\n")
        tar = Path(tmp) / "root.tar"
        with tarfile.open(tar, "w") as t:
            t.add(root, arcname=".")
        subprocess.run([*PODMAN, "import", str(tar), IMAGE], check=True, capture_output=True)


def build_if_missing() -> bool:
    """Build the image where podman does not have it; True if it was built."""
    if subprocess.run([*PODMAN, "image", "exists", IMAGE], check=False).returncode == 0:
        return False
    _build()
    return True


def ensure_image() -> str:
    """The image's name (`make test` builds it once, behind its podman stamp; built here again if
    it was removed since); skips where podman cannot run containers here."""
    if shutil.which("podman") is None or not Path("/usr/sbin/runc").exists():
        pytest.skip("podman and runc are not installed (make test installs them: apt-get)")
    build_if_missing()
    return IMAGE


if __name__ == "__main__":  # the Makefile's podman stamp
    print(f"{IMAGE}: {'built' if build_if_missing() else 'already there'}")


def host_mounts(venv_root: Path) -> list[str]:
    """What the image's workloads need of the host, read-only: /usr and the repository (venv)."""
    return ["/usr", str(venv_root)]
