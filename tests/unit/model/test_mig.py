from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel, catalog, lookup_model
from gpufrac.model.mig import (
    MigPlacement,
    MigProfileName,
    check_layout,
    format_layout,
    layout_from_json,
    parse_layout,
    parse_profile_name,
)
from tests.conftest import load_data

MODELS = sorted(catalog())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1g.18gb", MigProfileName(1, 18)),
        ("1g.18gb+me", MigProfileName(1, 18, ("me",))),
        ("1c.3g.71gb", MigProfileName(3, 71, (), 1)),
        ("MIG 7g.141gb", MigProfileName(7, 141)),
        (" 3G.71GB ", MigProfileName(3, 71)),
        ("1g.24gb+gfx", MigProfileName(1, 24, ("gfx",))),
        ("1g.24gb+me.all", MigProfileName(1, 24, ("me.all",))),
        ("1g.24gb-me", MigProfileName(1, 24, ("me",), sign="-")),
        ("2g.48gb+me,gfx", MigProfileName(2, 48, ("gfx", "me"))),  # kept sorted
    ],
)
def test_parse_profile_names(text: str, expected: MigProfileName) -> None:
    assert parse_profile_name(text) == expected


def test_profile_name_round_trips_and_gpu_instance_part() -> None:
    for text in ("1g.18gb", "1g.18gb+me", "1c.3g.71gb", "2c.4g.71gb", "1g.24gb-me", "1g.24gb+gfx"):
        assert str(parse_profile_name(text)) == text
    assert parse_profile_name("1c.3g.71gb").gpu_instance_name == "3g.71gb"
    assert str(parse_profile_name("1g.24gb+me,gfx")) == "1g.24gb+gfx,me"
    name = parse_profile_name("1g.24gb-me")
    assert (name.base_name, name.attribute_suffix, name.media_extensions) == (
        "1g.24gb",
        "-me",
        False,
    )
    assert parse_profile_name("1g.18gb+me").media_extensions


@pytest.mark.parametrize(
    ("text", "words"),
    [  # go-nvlib's parseMigProfile and parseMigProfileAttributes, which mig-parted uses
        ("1g.24gb+me-gfx", "more than one attribute sign"),
        ("1g.24gb-me+gfx", "more than one attribute sign"),
        ("1g.24gb+", "not an attribute name"),
        ("1g.24gb+me,", "not an attribute name"),
        ("1g.24gb+1me", "not an attribute name"),
        ("1g.24gb+.me", "not an attribute name"),
        ("1g.24gb+me.", "not an attribute name"),
        ("1g.24gb+m_e", "not an attribute name"),
        ("1g.24gb+me,me", "lists an attribute twice"),
    ],
)
def test_attributes_are_refused_as_parse_mig_profile_attributes_refuses_them(
    text: str, words: str
) -> None:
    with pytest.raises(InputError, match=words) as exc:
        parse_profile_name(text, field="mig-devices")
    assert exc.value.field == "mig-devices" and exc.value.fix and "1g.24gb-me" in exc.value.fix


def test_the_name_hint_suggests_only_forms_gpufrac_takes() -> None:
    with pytest.raises(InputError) as exc:
        parse_profile_name("1g")
    assert exc.value.fix is not None and "1c." not in exc.value.fix
    for example in exc.value.fix.rstrip(".").split("like ")[1].replace(" or", ",").split(", "):
        assert parse_profile_name(example).compute_instance_slices is None


@pytest.mark.parametrize(
    "text", ["", "1g", "18gb", "g.18gb", "1g.18", "1g.18gb+x+y", "4c.3g.71gb", "0g.5gb"]
)
def test_bad_profile_names_are_errors_naming_the_field(text: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_profile_name(text, field="--demand")
    assert exc.value.field == "--demand"


def test_parse_and_format_layout() -> None:
    layout = parse_layout("1g.18gb@6, 3g.71gb@0,2g.35gb@4")
    assert layout == (
        MigPlacement(0, "3g.71gb"),
        MigPlacement(4, "2g.35gb"),
        MigPlacement(6, "1g.18gb"),
    )
    assert format_layout(layout) == "3g.71gb@0,2g.35gb@4,1g.18gb@6"
    assert parse_layout("") == ()
    assert layout_from_json([{"profile": "3g.71gb", "start": 4}]) == (MigPlacement(4, "3g.71gb"),)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("3g.71gb", "no start slot"),
        ("3g.71gb@x", "no start slot"),
        ("3g.71gb@0,,1g.18gb@6", "empty entry"),
        ("1c.3g.71gb@0", "compute-instance profile"),
        ("banana@0", "not a MIG profile name"),
    ],
)
def test_bad_layouts_name_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment) as exc:
        parse_layout(text)
    assert exc.value.field == "--layout"


@pytest.mark.parametrize(
    "raw",
    [
        {"profile": "3g.71gb"},
        [{"profile": "3g.71gb", "start": -1}],
        [{"start": 0}],
        [{"profile": 3, "start": 0}],
    ],
)
def test_bad_json_layouts(raw: object) -> None:
    with pytest.raises(InputError):
        layout_from_json(raw)


# -- table tests, every catalog GPU ---------------------------------------------------------------


@pytest.mark.parametrize("key", MODELS)
def test_each_profile_alone_at_each_start_is_valid(key: str) -> None:
    model = catalog()[key]
    for prof in model.profiles:
        for start in prof.placement_starts:
            assert check_layout(model, (MigPlacement(start, prof.name),)) == []


@pytest.mark.parametrize("key", MODELS)
def test_a_start_the_profile_does_not_allow_is_rejected(key: str) -> None:
    model = catalog()[key]
    for prof in model.profiles:
        for start in set(range(model.memory_slots)) - set(prof.placement_starts):
            rules = [p.rule for p in check_layout(model, (MigPlacement(start, prof.name),))]
            assert rules == ["placement"]


@pytest.mark.parametrize("key", MODELS)
def test_max_instances_is_enforced(key: str) -> None:
    model = catalog()[key]
    smallest = min(model.profiles, key=lambda p: (p.memory_slots, p.media_extensions))
    layout = tuple(MigPlacement(s, smallest.name) for s in smallest.placement_starts)
    rules = {p.rule for p in check_layout(model, layout)}
    if len(layout) > smallest.max_instances:
        assert "max_instances" in rules
    else:
        assert "max_instances" not in rules


@pytest.mark.parametrize(
    ("key", "layout", "rules"),
    [
        ("H200-141GB", "3g.71gb@0,2g.35gb@4,1g.18gb@6", []),
        ("H200-141GB", "3g.71gb@0,3g.71gb@4", []),
        ("H200-141GB", "4g.71gb@0,3g.71gb@4", []),
        ("H200-141GB", "7g.141gb@0", []),
        ("H200-141GB", "1g.35gb@0,1g.35gb@2,1g.35gb@4,1g.35gb@6", []),
        ("H200-141GB", "7g.141gb@0,1g.18gb@0", ["overlap", "compute"]),
        ("H200-141GB", "3g.71gb@0,2g.35gb@2", ["overlap"]),
        ("H200-141GB", "1g.18gb+me@0,1g.18gb+me@1", ["max_instances", "media_extensions"]),
        (
            "H200-141GB",
            "2g.35gb@0,2g.35gb@2,2g.35gb@4,1g.18gb@6,1g.18gb@7",
            ["placement", "compute"],
        ),
        ("H200-141GB", "1g.10gb@0", ["unknown_profile"]),
        ("A30-24GB", "1g.6gb+me@0,2g.12gb+me@2", ["media_extensions"]),
        ("A30-24GB", "2g.12gb@0,2g.12gb@2", []),
        ("A30-24GB", "4g.24gb@0,1g.6gb@3", ["overlap", "compute"]),
        ("A100-40GB", "1g.10gb@0,1g.10gb@2,1g.10gb@4,1g.10gb@6", []),
        ("A100-40GB", "1g.10gb@1", ["placement"]),
        ("A100-80GB", "1g.10gb@1", []),
        ("H100-80GB", "4g.40gb@0,2g.20gb@4,1g.10gb@6", []),
    ],
)
def test_layout_table(key: str, layout: str, rules: list[str]) -> None:
    problems = check_layout(catalog()[key], parse_layout(layout))
    assert sorted(p.rule for p in problems) == sorted(rules)


# -- H200: the catalog's placements are the driver's answers ---------------------------------------


def test_h200_catalog_placements_equal_the_driver_answers() -> None:
    driver = load_data("nvml-placements.json")
    model = lookup_model("h200")
    seen = set()
    for name, answer in driver.items():
        if not name.startswith("MIG "):
            continue
        prof = model.profile(name.removeprefix("MIG "))
        seen.add(prof.name)
        assert prof.profile_id == answer["profile_id"]
        assert [(s, prof.memory_slots) for s in prof.placement_starts] == [
            tuple(p) for p in answer["placements"]
        ]
    assert seen == {p.name for p in model.profiles}


# -- Hypothesis: the checker against an independent brute-force slot count ------------------------


def brute_force_valid(model: GpuModel, layout: tuple[MigPlacement, ...]) -> bool:
    """Count, slot by slot, how many instances cover it; then the count and media rules."""
    table = {p.name: p for p in model.profiles}
    if any(pl.profile not in table for pl in layout):
        return False
    if any(pl.start not in table[pl.profile].placement_starts for pl in layout):
        return False
    for slot in range(model.memory_slots):
        covering = [
            pl for pl in layout if pl.start <= slot < pl.start + table[pl.profile].memory_slots
        ]
        if len(covering) > 1:
            return False
    if sum(table[pl.profile].compute_slices for pl in layout) > model.compute_slices:
        return False
    for name, prof in table.items():
        if sum(1 for pl in layout if pl.profile == name) > prof.max_instances:
            return False
    return sum(1 for pl in layout if table[pl.profile].media_extensions) <= 1


SIMULATABLE = [k for k in MODELS if all(p.memory_mib is not None for p in catalog()[k].profiles)]


@st.composite
def model_and_layout(draw: st.DrawFn) -> tuple[GpuModel, tuple[MigPlacement, ...]]:
    model = catalog()[draw(st.sampled_from(MODELS))]
    pool = [MigPlacement(s, p.name) for p in model.profiles for s in range(model.memory_slots)]
    layout = draw(st.lists(st.sampled_from(pool), max_size=8))
    return model, tuple(sorted(layout))


@given(model_and_layout())
def test_checker_agrees_with_brute_force(case: tuple[GpuModel, tuple[MigPlacement, ...]]) -> None:
    model, layout = case
    assert (check_layout(model, layout) == []) == brute_force_valid(model, layout)


def _valid_placements(model: GpuModel) -> list[MigPlacement]:
    return [MigPlacement(s, p.name) for p in model.profiles for s in p.placement_starts]


def maximal_layouts(model: GpuModel) -> list[tuple[MigPlacement, ...]]:
    """Every valid layout no placement can be added to, by exhaustive search with the brute
    force."""
    options = _valid_placements(model)
    found: set[tuple[MigPlacement, ...]] = set()

    def grow(layout: tuple[MigPlacement, ...], first: int) -> None:
        extended = False
        for i in range(len(options)):
            cand = tuple(sorted((*layout, options[i])))
            if brute_force_valid(model, cand):
                extended = True
                if i >= first:
                    grow(cand, i + 1)
        if not extended:
            found.add(layout)

    grow((), 0)
    return sorted(found)


@pytest.mark.parametrize("key", ["H200-141GB", "A30-24GB", "A100-40GB"])
def test_every_maximal_valid_layout_is_accepted_and_cannot_grow(key: str) -> None:
    model = catalog()[key]
    layouts = maximal_layouts(model)
    assert len(layouts) > 5
    for layout in layouts:
        assert check_layout(model, layout) == [], format_layout(layout)
        for extra in _valid_placements(model):
            assert check_layout(model, tuple(sorted((*layout, extra)))) != []


def test_the_maximal_h200_layouts_include_the_known_ones() -> None:
    layouts = {format_layout(x) for x in maximal_layouts(lookup_model("h200"))}
    assert "7g.141gb@0" in layouts
    assert "3g.71gb@0,3g.71gb@4" in layouts
    assert ",".join(f"1g.18gb@{i}" for i in range(7)) in layouts


@given(st.sampled_from(SIMULATABLE), st.data())
def test_random_valid_layouts_stay_valid_in_any_order(key: str, data: st.DataObject) -> None:
    model = catalog()[key]
    layout: list[MigPlacement] = []
    for pl in data.draw(st.permutations(_valid_placements(model))):
        if brute_force_valid(model, tuple(sorted((*layout, pl)))):
            layout.append(pl)
    for perm in itertools.islice(itertools.permutations(layout), 5):
        assert check_layout(model, tuple(perm)) == []
