"""A tokens file others may read is refused (``gpufrac agent`` and ``gpufrac control`` read it
through ``load_tokens``), with the chmod that fixes it; the control plane's data directory is its
own (0700)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrac.api.tokens import load_tokens
from gpufrac.cluster.control import ControlPlane
from gpufrac.errors import InputError

TOKENS = "tokens:\n  s3cret-admin-token: {admin: true}\n"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_tokens_file_open_to_others_is_refused_with_the_chmod_that_fixes_it(
    tmp_path: Path, mode: int
) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(TOKENS)
    path.chmod(mode)
    with pytest.raises(InputError) as e:
        load_tokens(path)
    assert e.value.fix == f"chmod 600 {path}"
    assert "s3cret" not in str(e.value)
    path.chmod(0o600)
    tokens = load_tokens(path)
    assert tokens is not None and tokens["s3cret-admin-token"].admin


def test_the_control_planes_data_directory_is_its_own(tmp_path: Path) -> None:
    data = tmp_path / "control"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    ControlPlane(data).close()
    assert data.stat().st_mode & 0o777 == 0o700
