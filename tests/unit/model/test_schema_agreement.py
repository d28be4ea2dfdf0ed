"""The JSON Schema and gpufrac's reader give the same verdict on edge inputs: each row is one or
more manifest files as a user writes them (YAML), validated by the ``jsonschema`` library against
the committed schema (each document as a YAML 1.2 reader loads it) and read by the reader
(``load_manifest_files``, every file together). A row where the two differ fails, unless it is in
``BEYOND_THE_SCHEMA``: rules JSON Schema cannot state, each named in the schema's description and
in docs/manifest.md (and each row there must still differ, so the list stays true)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from gpufrac.errors import InputError
from gpufrac.model.manifest import load_manifest_files
from gpufrac.model.manifest_fields import CoreYamlLoader
from gpufrac.model.schema import MANIFEST_SCHEMA_FILE

SCHEMA = json.loads((Path(__file__).parents[3] / "schemas" / MANIFEST_SCHEMA_FILE).read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def workload(
    gpu: str = "{memory: 1GiB}",
    *,
    name: str = "w",
    meta: str = "",
    command: str = "[python, app.py]",
    spec: str = "",
) -> str:
    return (
        "apiVersion: gpufrac/v1\nkind: Workload\n"
        f"metadata: {{name: {name}{', ' + meta if meta else ''}}}\n"
        f"spec:\n  command: {command}\n  resources: {{gpu: {gpu}}}\n"
        + (f"  {spec}\n" if spec else "")
    )


def deployment(name: str = "d", autoscale: str = "", template: str = "model: 'm.mod:make'") -> str:
    return (
        "apiVersion: gpufrac/v1\nkind: Deployment\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  template: {{{template}, resources: {{gpu: {{fraction: 0.25}}}}}}\n"
        + (f"  autoscale: {autoscale}\n" if autoscale else "")
    )


def labels(value: str) -> str:
    return workload(meta=f"labels: {{canary: {value}}}")


# id -> the files of one case (several: given together, as gpufrac apply a.yaml b.yaml does)
CASES: dict[str, list[str]] = {
    # booleans as words: YAML 1.2 strings, except true/false
    "label yes": [labels("yes")],
    "label no": [labels("no")],
    "label on": [labels("on")],
    "label off": [labels("off")],
    "label y": [labels("y")],
    "label Yes": [labels("Yes")],
    "label true": [labels("true")],
    "label True": [labels("True")],
    "label quoted true": [labels("'true'")],
    "label null": [labels("null")],
    "label ~": [labels("~")],
    "label date": [labels("2024-01-01")],
    "label 1_000": [labels("1_000")],
    "label 1:30": [labels("1:30")],
    "label 017": [labels("017")],
    "label 0o17": [labels("0o17")],
    "label 1e3": [labels("1e3")],
    "env off": [workload(spec="env: {DEBUG: off}")],
    "env true": [workload(spec="env: {DEBUG: true}")],
    "env 8000": [workload(spec="env: {PORT: 8000}")],
    "tenant no": [workload(meta="tenant: no")],
    "tenant false": [workload(meta="tenant: false")],
    "name yes": [workload(name="yes")],
    "restart no": [workload(spec="restart: no")],
    "sharing on": [workload(spec="sharing: on")],
    # empty strings
    "command ['']": [workload(command="['']")],
    "command [' ']": [workload(command="[' ']")],
    "command [python, '']": [workload(command="[python, '']")],
    "command []": [workload(command="[]")],
    "name ''": [workload(name="''")],
    "tenant ''": [workload(meta="tenant: ''")],
    "workdir ''": [workload(spec="workdir: ''")],
    "image ''": [workload(spec="image: ''")],
    "label ''": [labels("''")],
    "env ''": [workload(spec="env: {A: ''}")],
    "mig ''": [workload("{mig: ''}")],
    "memory ''": [workload("{memory: ''}")],
    # NaN and infinity
    "fraction .nan": [workload("{fraction: .nan}")],
    "fraction .inf": [workload("{fraction: .inf}")],
    "fraction -.inf": [workload("{fraction: -.inf}")],
    "count .inf": [workload("{count: .inf}")],
    "count .nan": [workload("{count: .nan}")],
    "min_share .nan": [workload(spec="min_share: .nan")],
    "priority .inf": [workload(spec="priority: .inf")],
    "cpus .nan": [workload("{memory: 1GiB}").replace("{gpu:", "{cpus: .NaN, gpu:")],
    # duplicates
    "duplicate key": [workload(spec="sharing: mps\n  sharing: mps")],
    "same name twice in one file": [workload() + "---\n" + workload()],
    "same name in two files": [workload(), workload()],
    "same name, other tenant": [workload(), workload(meta="tenant: t2")],
    "workload and deployment of one name": [workload(name="x"), deployment("x")],
    "same deployment in two files": [deployment(), deployment()],
    # MIG profiles and their attributes
    "mig 1g.10gb": [workload("{mig: 1g.10gb}")],
    "mig 1g.10gb+me": [workload("{mig: 1g.10gb+me}")],
    "mig 1g.10gb+ME": [workload("{mig: 1g.10gb+ME}")],
    "mig MIG 1g.10gb": [workload("{mig: MIG 1g.10gb}")],
    "mig 1g.10gb+gfx": [workload("{mig: 1g.10gb+gfx}")],
    "mig 1g.10gb+me+me": [workload("{mig: 1g.10gb+me+me}")],
    "mig 5g.99gb": [workload("{mig: 5g.99gb}")],
    "mig 1c.3g.71gb": [workload("{mig: 1c.3g.71gb}")],
    "mig on its model": [workload("{mig: {profile: 1g.10gb, model: A100-80GB}}")],
    "mig not on its model": [workload("{mig: {profile: 1g.18gb, model: A100-80GB}}")],
    "mig unknown model": [workload("{mig: {profile: 1g.10gb, model: Z9}}")],
    # numbers as strings, strings as numbers
    "count '2'": [workload("{count: '2'}")],
    "fraction '0.5'": [workload("{fraction: '0.5'}")],
    "memory '12'": [workload("{memory: '12'}")],
    "memory 12GiB": [workload("{memory: 12GiB}")],
    "memory 512": [workload("{memory: 512}")],
    "compute '30'": [workload("{memory: 1GiB, compute: '30'}")],
    "compute 30%": [workload("{memory: 1GiB, compute: 30%}")],
    "priority '10'": [workload(spec="priority: '10'")],
    "weight '3'": [workload(spec="weight: '3'")],
    "min_share '0.1'": [workload(spec="min_share: '0.1'")],
    "min_share 10%": [workload(spec="min_share: 10%")],
    "autoscale max '3'": [deployment(autoscale="{min_replicas: 1, max_replicas: '3'}")],
    "template with model and batching": [
        deployment(template="model: 'm.mod:make', max_wait_ms: 2")
    ],
    "command template with batching": [deployment(template="command: [srv], max_wait_ms: 2")],
    "command template": [deployment(template="command: [srv]")],
    "template with model and command": [deployment(template="model: 'm.mod:make', command: [srv]")],
    "template sets PORT": [deployment(template="command: [srv], env: {PORT: '1'}")],
    # ranges and amounts that round to nothing
    "fraction 0.0001": [workload("{fraction: 0.0001}")],
    "fraction 0.9999": [workload("{fraction: 0.9999}")],
    "memory 0GiB": [workload("{memory: 0GiB}")],
    "count 1.0": [workload("{count: 1.0}")],  # the integer 1 to JSON Schema, and to the reader
    "count 1.5": [workload("{count: 1.5}")],
    # requests and the rules between fields
    "two requests": [workload("{memory: 1GiB, fraction: 0.5}")],
    "a field and its alias, agreeing": [workload("{memory: 1GiB, gpumem: 1024}")],
    "a field and its alias, disagreeing": [workload("{memory: 1GiB, gpumem: 2048}")],
    "sharing mig with count": [workload("{count: 1}", spec="sharing: mig")],
    "backoff_limit on a service": [workload(spec="type: service\n  backoff_limit: 3")],
    "health on a job": [workload(spec="health: {tcp: {port: 80}}")],
    "privileged true": [workload(spec="privileged: true")],
    "privileged false": [workload(spec="privileged: false")],
    "mounts without an image": [workload(spec="mounts: [{source: /data, target: /data}]")],
    "mig with sharing mps": [workload("{mig: 1g.18gb}", spec="sharing: mps")],
    "compute with sharing timeslice": [
        workload("{memory: 1GiB, compute: 30}", spec="sharing: timeslice")
    ],
    # a share of each of several GPUs: time-sliced, or under MPS (a compute cap, or sharing: mps:
    # one daemon serves its GPUs together), never MIG
    "count 2 beside memory": [workload("{count: 2, memory: 1GiB}")],
    "nvidia.com/gpu 2 beside gpumem": [workload("{nvidia.com/gpu: 2, nvidia.com/gpumem: 3000}")],
    "num-devices 2 beside gpu-fraction": [
        workload("{gpu-fraction-num-devices: '2', gpu-fraction: '0.5'}")
    ],
    "count 2 beside memory, timeslice": [
        workload("{count: 2, memory: 1GiB}", spec="sharing: timeslice")
    ],
    "count 2 beside compute": [workload("{count: 2, memory: 1GiB, compute: 30}")],
    "nvidia.com/gpu 2 beside gpucores": [workload("{nvidia.com/gpu: '2', gpucores: 30}")],
    "count 2 beside memory, mps": [workload("{count: 2, memory: 1GiB}", spec="sharing: mps")],
    "count 2 beside fraction, mig": [workload("{count: 2, fraction: 0.5}", spec="sharing: mig")],
    "nvidia.com/gpu 2 beside gpumem and gpucores": [
        workload("{nvidia.com/gpu: 2, nvidia.com/gpumem: '3000', nvidia.com/gpucores: '30'}")
    ],
    "count 2 beside compute alone": [workload("{count: 2, compute: 30%}")],
    "count 2 beside memory_percent and compute, mps": [
        workload("{count: 2, memory_percent: 50, compute: 30}", spec="sharing: mps")
    ],
    "num-devices 2 beside gpu-fraction, mps": [
        workload("{gpu-fraction-num-devices: '2', gpu-fraction: '0.5'}", spec="sharing: mps")
    ],
    "count 2 beside compute, timeslice": [
        workload("{count: 2, memory: 1GiB, compute: 30}", spec="sharing: timeslice")
    ],
    "count 2 beside compute, mig": [
        workload("{count: 2, memory: 1GiB, compute: 30}", spec="sharing: mig")
    ],
    "count 2 beside compute, exclusive": [
        workload("{count: 2, compute: 30}", spec="sharing: exclusive")
    ],
    "count 1 beside memory, mig": [workload("{count: 1, memory: 1GiB}", spec="sharing: mig")],
    "memory_percent, exclusive": [workload("{memory_percent: 50}", spec="sharing: exclusive")],
    "compute alone, exclusive": [workload("{compute: 50}", spec="sharing: exclusive")],
    # numbers in strings at the ends of their ranges, and label keys
    "gpumem '0'": [workload("{gpumem: '0'}")],
    "gpumem '007'": [workload("{gpumem: '007'}")],
    "gpumem '999999999999'": [workload("{gpumem: '999999999999'}")],
    "gpumem '1000000000000'": [workload("{gpumem: '1000000000000'}")],
    "gpumem 1000000000000": [workload("{gpumem: 1000000000000}")],
    "gpucores '0'": [workload("{gpucores: '0'}")],
    "gpucores '100'": [workload("{gpucores: '100'}")],
    "gpucores '101'": [workload("{gpucores: '101'}")],
    "gpucores '0100'": [workload("{gpucores: '0100'}")],
    "nvidia.com/gpu '0'": [workload("{nvidia.com/gpu: '0'}")],
    "nvidia.com/gpu '02'": [workload("{nvidia.com/gpu: '02'}")],
    "gpu-fraction '0'": [workload("{gpu-fraction: '0'}")],
    "gpu-fraction '0.0'": [workload("{gpu-fraction: '0.0'}")],
    "gpu-fraction '0.0001'": [workload("{gpu-fraction: '0.0001'}")],
    "gpu-fraction '0.9999'": [workload("{gpu-fraction: '0.9999'}")],
    "gpu-fraction '.5'": [workload("{gpu-fraction: '.5'}")],
    "gpu-fraction '1'": [workload("{gpu-fraction: '1'}")],
    "label key ''": [workload(meta="labels: {'': x}")],
    "a NUL in a label": [workload(meta='labels: {k: "a\\0b"}')],
    # a final newline: Python's $ matches before it, the reader refuses it
    "name 'w\\n'": [workload(name='"w\\n"')],
    "tenant 't\\n'": [workload(meta='tenant: "t\\n"')],
    "gpucores '30\\n'": [workload('{gpucores: "30\\n"}')],
    "env name 'A\\n'": [workload(spec='env: {"A\\n": x}')],
    "count 10**18": [workload("{count: 1000000000000000000}")],
    "count 10**18-1": [workload("{count: 999999999999999999}")],
    "nvidia.com/gpu '1000000000000000000'": [workload("{nvidia.com/gpu: '1000000000000000000'}")],
    "nvidia.com/gpu 5000 digits": [workload("{nvidia.com/gpu: '" + "9" * 5000 + "'}")],
    "nvidia.com/gpu zeros then 1": [workload("{nvidia.com/gpu: '" + "0" * 5000 + "1'}")],
    "gpu-fraction '0.00049999999999999999999'": [
        workload("{gpu-fraction: '0.00049999999999999999999'}")
    ],
    "gpu-fraction '0.99949999999999999999'": [workload("{gpu-fraction: '0.99949999999999999999'}")],
    "compute '030%'": [workload("{memory: 1GiB, compute: '030%'}")],
    "min_share '90.04%'": [workload(spec="min_share: '90.04%'")],
    "min_share 0.9004": [workload(spec="min_share: 0.9004")],
    "min_share '090%'": [workload(spec="min_share: '090%'")],
    "min_share '0.04%'": [workload(spec="min_share: '0.04%'")],
    "min_share 0.0004": [workload(spec="min_share: 0.0004")],
    "min_share 0.9": [workload(spec="min_share: 0.9")],
    "nvidia.com/mig-1g.18gb '01'": [workload("{nvidia.com/mig-1g.18gb: '01'}")],
    # HAMi's MIG resource keys
    "nvidia.com/mig-1g.18gb 1": [workload("{nvidia.com/mig-1g.18gb: 1}")],
    "nvidia.com/mig-1g.18gb '1'": [workload("{nvidia.com/mig-1g.18gb: '1'}")],
    "nvidia.com/mig-1G.18GB 1": [workload("{nvidia.com/mig-1G.18GB: 1}")],
    "nvidia.com/mig-1g.18gb 2": [workload("{nvidia.com/mig-1g.18gb: 2}")],
    "nvidia.com/mig-9g.999gb 1": [workload("{nvidia.com/mig-9g.999gb: 1}")],
    "nvidia.com/mig-1g.18gb+gfx 1": [workload("{nvidia.com/mig-1g.18gb+gfx: 1}")],
    "nvidia.com/mig-1g.18gb+me 1": [workload("{nvidia.com/mig-1g.18gb+me: 1}")],
    "nvidia.com/mig-1c.3g.71gb 1": [workload("{nvidia.com/mig-1c.3g.71gb: 1}")],
    "two nvidia.com/mig keys": [workload("{nvidia.com/mig-1g.18gb: 1, nvidia.com/mig-2g.35gb: 1}")],
    # choices as words
    "type Service": [workload(spec="type: Service")],
    "sharing ' mps '": [workload(spec="sharing: ' mps '")],
}

# Rules JSON Schema cannot state (they need another document, or arithmetic on two fields): the
# schema's description names them, and so does docs/manifest.md ("JSON Schema and editors").
BEYOND_THE_SCHEMA = {
    "same name twice in one file": "one name per tenant, across every document",
    "same name in two files": "one name per tenant, across every document and file",
    "same deployment in two files": "one name per tenant, across every document and file",
    "a field and its alias, disagreeing": "a field and its alias that ask for different amounts",
    "two nvidia.com/mig keys": "one HAMi MIG resource key at most",
    "a NUL in a label": "a NUL character or a lone UTF-16 surrogate in any text",
}


def reader_accepts(files: list[str], tmp_path: Path) -> bool:
    paths = []
    for i, text in enumerate(files):
        paths.append(tmp_path / f"m{i}.yaml")
        paths[-1].write_text(text)
    try:
        load_manifest_files(paths)
    except InputError:
        return False
    return True


def schema_accepts(files: list[str]) -> bool:
    for text in files:
        try:  # a YAML 1.2 reader, as an editor's (a key given twice is not YAML)
            documents = [d for d in yaml.load_all(text, Loader=CoreYamlLoader) if d is not None]
        except yaml.YAMLError:
            return False
        if not all(VALIDATOR.is_valid(d) for d in documents):
            return False
    return True


@pytest.mark.parametrize("case", list(CASES))
def test_the_schema_and_the_reader_agree(case: str, tmp_path: Path) -> None:
    files = CASES[case]
    schema, reader = schema_accepts(files), reader_accepts(files, tmp_path)
    if case in BEYOND_THE_SCHEMA:
        assert (schema, reader) == (True, False), f"{case}: agree now; drop it from the list"
    else:
        assert schema == reader, f"{case}: schema {'accepts' if schema else 'refuses'} it"


def test_every_exception_is_a_case_and_named_in_the_schema_and_the_docs() -> None:
    assert set(BEYOND_THE_SCHEMA) <= set(CASES)
    docs = " ".join((Path(__file__).parents[3] / "docs" / "manifest.md").read_text().split())
    for rule in BEYOND_THE_SCHEMA.values():
        assert rule in SCHEMA["description"]
        assert rule in docs
