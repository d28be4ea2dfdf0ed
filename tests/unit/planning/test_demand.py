from __future__ import annotations

import pytest

from gpufrac.errors import InputError
from gpufrac.model.catalog import lookup_model
from gpufrac.planning.demand import (
    parse_need_demand,
    parse_profile_demand,
    read_size,
    resolve_demand,
    smallest_fitting,
)

H200, A100_40, A100_80, H100 = (lookup_model(n) for n in ("h200", "a100-40gb", "a100-80gb", "h100"))


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("20GiB", 20480),
        ("512MiB", 512),
        ("1.5g", 1536),
        ("80GB", 76294),
        ("1TiB", 1048576),
        ("7", 7),
    ],
)
def test_sizes(text: str, mib: int) -> None:
    assert read_size(text, field="--need").mib == mib


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1g.18gb=-1", "negative count"),
        ("1g.18gb", "has no count"),
        ("1g.18gb=x", "not a whole number"),
        ("", "nothing asked"),
        ("v100:1g.10gb=1", "unknown GPU model"),
        ("banana=1", "not a MIG profile"),
        ("1c.3g.71gb=1", "compute-instance"),
    ],
)
def test_bad_profile_demand(text: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment) as exc:
        parse_profile_demand(text)
    assert exc.value.field == "--demand"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("20XB=1", "not a memory size"),
        ("0GiB=1", "not a positive"),
        ("20GiB/xc=1", "not a compute need"),
        ("20GiB=-2", "negative"),
    ],
)
def test_bad_need_demand(text: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment) as exc:
        parse_need_demand(text)
    assert exc.value.field == "--need"


def test_profile_demand_resolves_on_models_that_have_it() -> None:
    classes = resolve_demand(parse_profile_demand("1g.10gb=3"), [H200, A100_40, A100_80])
    assert classes[0].options == {"A100-40GB": "1g.10gb", "A100-80GB": "1g.10gb"}
    pinned = resolve_demand(parse_profile_demand("a100-80gb:1g.10gb=3"), [A100_40, A100_80])
    assert pinned[0].options == {"A100-80GB": "1g.10gb"}


def test_a_profile_no_gpu_has_is_an_error_naming_the_field() -> None:
    with pytest.raises(InputError, match=r"no GPU in the fleet has profile 1g\.10gb") as exc:
        resolve_demand(parse_profile_demand("1g.10gb=1"), [H200])
    assert exc.value.field == "--demand" and "1g.18gb" in str(exc.value)


def test_needs_map_to_the_smallest_fitting_profile_per_model() -> None:
    (c,) = resolve_demand(parse_need_demand("20GiB=2"), [H200, H100, A100_40])
    assert c.options == {"H200-141GB": "1g.35gb", "H100-80GB": "3g.40gb", "A100-40GB": "7g.40gb"}
    assert c.value == 20480
    (big,) = resolve_demand(parse_need_demand("60GiB/4c=1"), [H200])
    assert big.options == {"H200-141GB": "4g.71gb"}
    assert smallest_fitting(H200, 10 * 1024, None).name == "1g.18gb"  # type: ignore[union-attr]


def test_a_need_nothing_fits_is_an_error() -> None:
    with pytest.raises(InputError, match="fits no MIG profile") as exc:
        resolve_demand(parse_need_demand("200GiB=1"), [H200])
    assert "7g.141gb" in str(exc.value)


def test_zero_counts_drop_out() -> None:
    assert resolve_demand(parse_profile_demand("1g.18gb=0,3g.71gb=1"), [H200])[0].label == "3g.71gb"
