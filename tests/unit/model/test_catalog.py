from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufrac.errors import InputError
from gpufrac.model.catalog import ALIASES, catalog, lookup_model, model_for_product_name

REFERENCE = Path(__file__).parents[3] / "src" / "gpufrac" / "model" / "data" / "mig-geometry.json"
RAW = json.loads(REFERENCE.read_text())["gpus"]


@pytest.mark.parametrize("key", sorted(RAW))
def test_every_reference_gpu_is_in_the_catalog_with_its_values(key: str) -> None:
    model = catalog()[key]
    raw = RAW[key]
    assert model.memory_total_mib == raw["memory_total_mib"]
    assert model.memory_slots == raw["memory_slots"]
    assert model.compute_slices == raw["compute_slices"]
    assert [p.name for p in model.profiles] == [p["name"] for p in raw["profiles"]]
    for prof, rp in zip(model.profiles, raw["profiles"], strict=True):
        assert prof.profile_id == rp["profile_id"]
        assert prof.placement_starts == tuple(rp["placement_starts"])
        assert prof.memory_mib == rp["memory_mib"]  # None stays None: never invented
        assert prof.sm_count == rp["sm_count"]


@pytest.mark.parametrize("key", sorted(RAW))
def test_profiles_fit_their_gpu(key: str) -> None:
    model = catalog()[key]
    for prof in model.profiles:
        assert 1 <= prof.compute_slices <= model.compute_slices
        for start in prof.placement_starts:
            assert start >= 0 and start + prof.memory_slots <= model.memory_slots
        assert prof.max_instances >= 1
        assert prof.media_extensions == prof.name.endswith("+me")


def test_only_the_h200_entry_is_a_driver_reading_and_b200_is_unverified() -> None:
    assert [k for k, m in catalog().items() if m.from_driver] == ["H200-141GB"]
    b200 = catalog()["B200-180GB"]
    assert not b200.verified
    assert all(p.memory_mib is None and p.sm_count is None for p in b200.profiles)
    assert catalog()["H100-80GB"].verified


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("h200", "H200-141GB"),
        ("H200", "H200-141GB"),
        ("h100", "H100-80GB"),
        ("h100-nvl", "H100-NVL-94GB"),
        ("h100-96gb", "H100-96GB"),
        ("gh200", "H100-96GB"),
        ("a100-80gb", "A100-80GB"),
        ("A100-40GB", "A100-40GB"),
        ("a30", "A30-24GB"),
        ("b200", "B200-180GB"),
        ("h200-141gb", "H200-141GB"),
    ],
)
def test_aliases_and_keys_case_insensitive(name: str, key: str) -> None:
    assert lookup_model(name).key == key


def test_every_alias_points_at_a_catalog_key() -> None:
    assert set(ALIASES.values()) <= set(catalog())


@pytest.mark.parametrize("name", ["a100", "A100", "h1"])
def test_ambiguous_name_lists_choices(name: str) -> None:
    with pytest.raises(InputError) as exc:
        lookup_model(name)
    assert "ambiguous" in str(exc.value)
    assert "A100-80GB" in str(exc.value) or "H100-80GB" in str(exc.value)


def test_unknown_name_lists_choices() -> None:
    with pytest.raises(InputError, match=r"unknown GPU model 'v100'.*h200"):
        lookup_model("v100")


@pytest.mark.parametrize(
    ("product", "key"),
    [
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA GH200 480GB", "H100-96GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
    ],
)
def test_real_gpus_match_by_exact_product_name(product: str, key: str) -> None:
    model = model_for_product_name(product)
    assert model is not None and model.key == key


@pytest.mark.parametrize("product", ["NVIDIA H200 NVL", "nvidia h200", "NVIDIA H100", "Tesla V100"])
def test_no_prefix_or_fuzzy_product_matching(product: str) -> None:
    assert model_for_product_name(product) is None


def test_profile_meaning_depends_on_the_model() -> None:
    assert lookup_model("a100-80gb").profile("1g.10gb").memory_slots == 1
    assert lookup_model("a100-40gb").profile("1g.10gb").memory_slots == 2
    with pytest.raises(InputError, match="does not exist on H200-141GB"):
        lookup_model("h200").profile("1g.10gb")


def test_the_partial_catalog_holds_names_and_fractions_only_and_they_agree() -> None:
    """The RTX PRO 6000 from NVIDIA's MIG user guide: each name's slices and GB agree with the
    fractions the guide gives, and nothing the guide lacks (ids, placements) is there."""
    from fractions import Fraction

    from gpufrac.model.catalog import partial_catalog, partial_model_for_pci_id
    from gpufrac.model.mig import parse_profile_name

    rtx = partial_model_for_pci_id("0x2bb510de")
    assert rtx is not None and rtx is partial_catalog()["RTX-PRO-6000-96GB"]
    assert rtx.key not in catalog() and partial_model_for_pci_id("0x233510DE") is None
    assert rtx.profiles is not None and rtx.memory_gb == 96 and rtx.profile_table_missing is None
    assert {"1g.24gb+gfx", "1g.24gb+me.all", "1g.24gb-me", "4g.96gb+gfx"} <= {
        p.name for p in rtx.profiles
    }
    for prof in rtx.profiles:
        name = parse_profile_name(prof.name)
        assert str(name) == prof.name
        assert Fraction(name.gpu_slices, rtx.max_gpu_instances) == Fraction(prof.sm_fraction)
        assert Fraction(name.memory_gb, rtx.memory_gb) == Fraction(prof.memory_fraction)
        assert 1 <= prof.max_instances <= rtx.max_gpu_instances
    raw = json.loads(REFERENCE.read_text())["partial_gpus"]["RTX-PRO-6000-96GB"]
    assert not {"profile_id", "placement_starts", "memory_mib"} & {
        k for p in raw["profiles"] for k in p
    }


def test_a_gpu_the_guide_lists_without_its_profile_table_is_partial_with_no_profiles() -> None:
    """The GB200 (0x294110DE, as NVIDIA's mig-parted config filters it): NVIDIA's MIG user guide's
    'Supported GPUs' table gives 186GB and 7 instances; its profile table was not in the copy
    available, so no profile is listed (none guessed), none can be checked, and why is recorded."""
    from gpufrac.model.catalog import partial_catalog, partial_model_for_pci_id

    gb200 = partial_model_for_pci_id("0x294110de")
    assert gb200 is not None and gb200 is partial_catalog()["GB200-186GB"]
    assert gb200.key not in catalog() and gb200.product == "NVIDIA GB200"
    assert (gb200.memory_gb, gb200.max_gpu_instances) == (186, 7)
    assert gb200.profiles is None and not gb200.has_profile("1g.23gb")
    assert gb200.profile_table_missing is not None
    assert "supported-mig-profiles.html" in gb200.profile_table_missing
    raw = json.loads(REFERENCE.read_text())["partial_gpus"]["GB200-186GB"]
    assert raw["profiles"] is None


def test_the_partial_catalog_and_the_catalog_share_no_device_id_or_key() -> None:
    """A PCI device id names one model: a partial entry never shadows a plannable one."""
    from gpufrac.model.catalog import partial_catalog

    full = {i.upper() for m in catalog().values() for i in m.pci_device_ids}
    partial = [i.upper() for m in partial_catalog().values() for i in m.pci_device_ids]
    assert len(partial) == len(set(partial)) and not full & set(partial)
    assert not set(catalog()) & set(partial_catalog())


def test_gpus_the_guide_names_without_their_numbers_are_partial_with_the_numbers_left_out() -> None:
    """The B300 and GB300 (named by the MIG user guide's 620 edition among the GPUs with MIG, in
    no copy of its tables) and the GH200 144G HBM3e (configured by NVIDIA mig-parted's default
    config, absent from the guide): partial, with no size, instance count or profile given."""
    from gpufrac.model.catalog import partial_model_for_pci_id

    raw = json.loads(REFERENCE.read_text())["partial_gpus"]
    for pci, key, product in (
        ("0x318210de", "B300", "NVIDIA B300"),
        ("0x31C210DE", "GB300", "NVIDIA GB300"),
        ("0x234810DE", "GH200-144GB", "NVIDIA GH200 144G HBM3e"),
    ):
        model = partial_model_for_pci_id(pci)
        assert model is not None and (model.key, model.product) == (key, product)
        assert model.memory_gb is None and model.max_gpu_instances is None
        assert model.profiles is None and not model.has_profile("1g.34gb")
        assert model.profile_table_missing and "none guessed" in model.profile_table_missing
        assert raw[key]["memory_gb"] is None and raw[key]["profiles"] is None
    assert "620" in raw["B300"]["source"] and "R580" in raw["B300"]["source"]
    assert "mig-parted" in raw["GH200-144GB"]["source"]
