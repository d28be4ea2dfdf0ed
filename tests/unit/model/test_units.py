"""Sizes as Kubernetes quantities, case-sensitive: the table, the refusals with their fixes, the
warnings of the old spellings (and of ``G``, whose meaning changed), the JSON Schema's pattern
agreeing with the reader, and the warnings reaching a manifest's and a settings file's reader,
each naming its field."""

from __future__ import annotations

import re

import pytest

from gpufrac.errors import InputError
from gpufrac.model.manifest import read_objects
from gpufrac.model.settings import parse_settings
from gpufrac.model.units import MAX_SIZE_MIB, MAX_SIZE_TEXT, SIZE_PATTERN, read_size
from gpufrac.planning.demand import parse_need_demand

# text, MiB, a fragment of its warning (None: no warning)
TABLE = [
    ("12Gi", 12288, None),
    ("512Mi", 512, None),
    ("64Ki", 1, None),  # rounded up to whole MiB
    ("2Ti", 2 * 2**20, None),
    ("1.5Gi", 1536, None),
    ("12 Gi", 12288, None),
    ("12GiB", 12288, None),  # kept
    ("512MiB", 512, None),
    ("2TiB", 2 * 2**20, None),
    ("7", 7, None),  # a bare number is MiB
    ("1.5", 2, None),
    ("12k", 1, None),  # decimal kilo: 12,000 bytes
    (
        "12G",
        11445,
        "12G is decimal now, as in Kubernetes (11,445 MiB); before this release "
        "gpufrac read it as 12GiB (12,288 MiB): write 12Gi for that",
    ),
    ("512M", 489, "write 512Mi for that"),
    ("2T", 1907349, "write 2Ti for that"),
    (
        "12GB",
        11445,
        "12GB is decimal (11,445 MiB), as before; this spelling is deprecated: "
        "write 12G (Kubernetes quantities are case-sensitive: 12Gi is binary)",
    ),
    ("80GB", 76294, "write 80G"),
    ("512MB", 489, "write 512M"),
    ("12Gb", 11445, "write 12G"),
    ("12gb", 11445, "write 12G"),
    (
        "1.5g",
        1536,
        "1.5g is binary (1,536 MiB), as before; this spelling is deprecated: write 1.5Gi",
    ),
    ("2t", 2 * 2**20, "write 2Ti"),
    ("12gib", 12288, "write 12Gi"),
    ("12GIB", 12288, "write 12Gi"),
    ("12mib", 12, "write 12Mi"),
    ("12Pi", 12 * 2**30, None),  # under the bound (1Ei): read, as every Kubernetes suffix is
    ("1Ei", 2**40, None),  # the bound itself
    ("12P", 11444091797, None),  # decimal, new in this release: nothing to warn about
    ("1E", 953674316407, None),
    ("2PiB", 2 * 2**30, None),
    ("+12Gi", 12288, None),  # Kubernetes numbers: a sign, "1." and ".5"
    (".5Gi", 512, None),
    ("1.Gi", 1024, None),
]

REFUSED = [
    ("512m", "milli", "write 512Mi for MiB (or 512: a bare number is MiB)"),
    ("12K", "'K' is not a unit", "12Gi"),
    ("12kB", "'kB' is not a unit", "12Gi"),
    ("12XB", "not a memory size", "12Gi"),
    ("12 parsecs", "not a memory size", "12Gi"),
    ("1e9", "decimal exponent (e9): in Kubernetes that is a number of bytes", "123Mi"),
    ("129E6", "decimal exponent (E6)", "129M"),
    ("1e3Gi", "not a memory size", "12Gi"),
    ("12u", "12 micro-bytes", "write 12Mi"),
    ("12n", "12 nano-bytes", "write 12Mi"),
    ("-1Gi", "not a positive size", "12Gi"),
    ("12Ei", "too large: 13,194,139,533,312 MiB, above the bound", "at most 1Ei"),
    ("2E", "too large", "at most 1Ei"),
    ("1.5EiB", "too large", "at most 1Ei"),
    ("١٢Gi", "'١' (ARABIC-INDIC DIGIT ONE) is not an ASCII digit", "12Gi"),
    ("１２Gi", "'１' (FULLWIDTH DIGIT ONE) is not an ASCII digit", "12Gi"),
    ("12\u00a0Gi", "not a memory size", "12Gi"),  # ASCII whitespace only, as in the schema
    ("0Gi", "not a positive size", "12Gi"),
    ("", "not a memory size", "12Gi"),
    ("9" * 30 + "Ti", "too large", "at most"),
]


@pytest.mark.parametrize(("text", "mib", "warning"), TABLE, ids=[t[0] for t in TABLE])
def test_sizes_read_as_kubernetes_quantities(text: str, mib: int, warning: str | None) -> None:
    size = read_size(text, field="f")
    assert size.mib == mib
    if warning is None:
        assert size.warning is None
    else:
        assert size.warning is not None and warning in size.warning, size.warning
    assert re.match(SIZE_PATTERN, text)  # what the reader takes, the schema takes


@pytest.mark.parametrize(("text", "message", "fix"), REFUSED, ids=[t[0] for t in REFUSED])
def test_refused_sizes_say_what_to_write(text: str, message: str, fix: str) -> None:
    with pytest.raises(InputError) as exc:
        read_size(text, field="spec.resources.gpu.memory")
    assert message in exc.value.message and fix in (exc.value.fix or "")
    assert exc.value.field == "spec.resources.gpu.memory"
    if not message.startswith(("not a positive size", "too large")):
        assert not re.match(SIZE_PATTERN, text)  # the schema refuses it too


# every suffix a Kubernetes quantity may have (k8s.io/apimachinery resource.Quantity): binary SI,
# decimal SI (with the sub-byte n, u, m), and the decimal exponents
KUBERNETES_SUFFIXES = [
    *("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"),
    *("n", "u", "m", "", "k", "M", "G", "T", "P", "E"),
    *("e3", "E3", "e+3", "E-3"),
]


@pytest.mark.parametrize("suffix", KUBERNETES_SUFFIXES)
def test_every_kubernetes_suffix_is_read_or_refused_for_its_own_reason(suffix: str) -> None:
    """From the hostile review: ``12Pi`` was "not a unit". Each suffix Kubernetes knows is read
    (then bounded: ``12Ei`` is too large, as a size is whatever its unit), or refused for what it
    means here (a fraction of a byte; bytes by exponent, while a bare number is MiB), never as an
    unknown unit; and the schema takes exactly the ones read."""
    for number in ("12", "2048"):
        text = number + suffix
        try:
            size = read_size(text, field="spec.resources.gpu.memory")
        except InputError as e:
            assert "not a unit" not in e.message and "not a memory size" not in e.message, e
            assert e.field == "spec.resources.gpu.memory" and e.fix
            assert any(w in e.message for w in ("-bytes", "exponent", "too large")), e
            assert re.match(SIZE_PATTERN, text) is None or "too large" in e.message
        else:
            assert 1 <= size.mib <= MAX_SIZE_MIB
            assert re.match(SIZE_PATTERN, text)


def test_a_manifests_warnings_name_the_document_and_field() -> None:
    doc = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}}}\n"
        "spec: {{command: [run], resources: {{gpu: {{memory: {memory}}}}}}}\n"
    )
    text = doc.format(name="a", memory="12Gi") + "---\n" + doc.format(name="b", memory="12G")
    a, b = read_objects(text)
    assert a.warnings == ()
    assert b.warnings == (
        "doc[2].spec.resources.gpu.memory: 12G is decimal now, as in Kubernetes (11,445 MiB); "
        "before this release gpufrac read it as 12GiB (12,288 MiB): write 12Gi for that",
    )
    assert b.obj.gpu.memory_mib == 11445  # type: ignore[union-attr]


def test_a_settings_files_and_a_need_demands_warnings_name_their_field() -> None:
    cfg = parse_settings("tenants:\n  research: {gpu_memory: 50G}\n", source="gpufrac.yaml")
    assert cfg.tenants["research"].gpu_memory_mib == 47684
    assert cfg.warnings == (
        "gpufrac.yaml: tenants.research.gpu_memory: 50G is decimal now, as in Kubernetes "
        "(47,684 MiB); before this release gpufrac read it as 50GiB (51,200 MiB): write 50Gi for "
        "that",
    )
    assert parse_settings("tenants:\n  research: {gpu_memory: 50Gi}\n").warnings == ()
    (need,) = parse_need_demand("20gb=2")
    assert need.warning is not None and need.warning.startswith("--need: 20gb is decimal")


def test_a_size_of_a_million_digits_is_refused_before_it_is_read() -> None:
    """From the hostile review: a 900,000-digit size held the agent's CPU for ~24 s (and a
    1,000,000-digit one was a 500); the text's length is checked first, and the error does not
    repeat it."""
    for text in ("9" * 1_000_000, "1" * 900_000 + "Gi", "0." + "0" * 50 + "1Gi"):
        with pytest.raises(InputError) as exc:
            read_size(text, field="spec.resources.gpu.memory")
        assert "characters" in exc.value.message and len(exc.value.message) < 120
    for text in ("1048576Ti", "0.000001Gi", "12Gi"):
        assert read_size(text, field="f").mib >= 1
    assert len("1048576Ti") <= MAX_SIZE_TEXT


def test_a_bare_number_of_mib_has_the_same_bound_as_a_written_size() -> None:
    from pydantic import TypeAdapter, ValidationError

    from gpufrac.model.manifest_types import MemoryMiB

    memory: TypeAdapter[int] = TypeAdapter(MemoryMiB)
    assert memory.validate_python(MAX_SIZE_MIB) == MAX_SIZE_MIB
    with pytest.raises(ValidationError, match="too large"):
        memory.validate_python(10**400)
