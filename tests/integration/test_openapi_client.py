"""A client generated from a running agent's /openapi.json by openapi-python-client (its Python
API, what its CLI runs) applies, reads and deletes workloads on that agent: a manifest as the typed
models the document describes (no hand-written dict), and one as YAML text through the client's
own HTTP connection (the generator writes no YAML bodies: it knows JSON, forms, multipart and
bytes). Generated once for the module, into its temporary directory."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import pytest
from openapi_python_client import generate
from openapi_python_client.config import Config, ConfigFile, MetaType

from tests.integration.conftest import RunningAgent, running_agent

PACKAGE = "gpufrac_client"
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    yield from running_agent(tmp_path_factory.mktemp("agent"), "h200:1")


@pytest.fixture(scope="module")
def client_package(
    served: RunningAgent, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ModuleType]:
    """The generated package, imported from the module's temporary directory (and forgotten
    after)."""
    out = tmp_path_factory.mktemp("client")
    document = out / "openapi.json"
    document.write_bytes(httpx.get(served.url + "/openapi.json", timeout=10).content)
    config = Config.from_sources(
        ConfigFile(package_name_override=PACKAGE),
        MetaType.NONE,  # the package alone, no pyproject.toml around it
        document,
        "utf-8",
        False,
        output_path=out / PACKAGE,
    )
    problems = [e for e in generate(config=config) if "ruff" not in (e.detail or "")]
    # the one thing it leaves out, and says so: the YAML body (not a content type it writes)
    assert {e.detail for e in problems} <= {"Unsupported content type application/yaml"}, problems
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def api(package: ModuleType, name: str) -> Any:
    return importlib.import_module(f"{package.__name__}.api.default.{name}")


def models(package: ModuleType) -> Any:
    return importlib.import_module(f"{package.__name__}.models")


def phase_of(package: ModuleType, client: Any, tenant: str, name: str) -> str:
    found = api(package, "get_workload_api_v1_workloads_tenant_name_get").sync(
        tenant, name, client=client
    )
    assert isinstance(found, models(package).WorkloadDetail), found
    return str(found.phase)


def wait_running(package: ModuleType, client: Any, name: str) -> None:
    deadline = time.monotonic() + 20
    while phase_of(package, client, "default", name) != "running":
        assert time.monotonic() < deadline, (name, phase_of(package, client, "default", name))
        time.sleep(0.1)


def test_a_generated_client_applies_reads_and_deletes_typed_manifests(
    served: RunningAgent, client_package: ModuleType
) -> None:
    m = models(client_package)
    client = client_package.Client(base_url=served.url, raise_on_unexpected_status=True)
    document = m.WorkloadDocument(
        api_version="gpufrac/v1",
        kind="Workload",
        metadata=m.Metadata(name="typed", labels=m.MetadataLabels.from_dict({"canary": "yes"})),
        spec=m.WorkloadSpecFields(
            command=SLEEP,
            resources=m.Resources(gpu=m.Gpu(memory="2Gi", compute="30%")),
            type_=m.WorkloadSpecFieldsTypeType0.SERVICE,
            health=m.Health(tcp=m.TcpProbe(port=1)),
        ),
    )
    apply = api(client_package, "apply_api_v1_workloads_post")
    applied = apply.sync_detailed(client=client, body=document)
    assert applied.status_code == 200, applied.content
    assert isinstance(applied.parsed, m.ApplyAnswer)
    (result,) = applied.parsed.results
    assert isinstance(result, m.WorkloadResult), result
    assert (result.workload, result.warnings) == ("default/typed", [])

    found = api(client_package, "get_workload_api_v1_workloads_tenant_name_get").sync(
        "default", "typed", client=client
    )
    assert isinstance(found, m.WorkloadDetail), found
    assert found.spec.to_dict()["labels"] == {"canary": "yes"}

    # a document the reader refuses is a typed 422 naming the field
    bad = m.WorkloadDocument.from_dict({**document.to_dict(), "metadata": {"name": "Bad_Name"}})
    refused = apply.sync_detailed(client=client, body=bad)
    assert refused.status_code == 422
    assert isinstance(refused.parsed, m.ProblemsAnswer)
    assert [p.loc for p in refused.parsed.detail] == [["metadata", "name"]]

    delete = api(client_package, "delete_workload_api_v1_workloads_tenant_name_delete")
    deleted = delete.sync_detailed("default", "typed", client=client)
    assert deleted.status_code == 200, deleted.content
    gone = api(client_package, "get_workload_api_v1_workloads_tenant_name_get").sync_detailed(
        "default", "typed", client=client
    )
    assert gone.status_code == 404 and isinstance(gone.parsed, m.ErrorAnswer)


def test_yaml_goes_through_the_generated_clients_connection(
    served: RunningAgent, client_package: ModuleType
) -> None:
    client = client_package.Client(base_url=served.url)
    text = (
        "apiVersion: gpufrac/v1\nkind: Workload\n"
        "metadata: {name: yaml-one, labels: {canary: yes}}\n"
        f"spec:\n  type: service\n  command: {SLEEP}\n  resources: {{gpu: {{fraction: 0.25}}}}\n"
    )
    r = client.get_httpx_client().post(
        "/api/v1/workloads", content=text, headers={"content-type": "application/yaml"}
    )
    assert r.status_code == 200, r.text
    # read as YAML 1.2, as the schema reads it: yes is a string, with a warning naming the field
    (warning,) = r.json()["results"][0]["warnings"]
    assert warning.startswith("metadata.labels.canary: 'yes' is a string"), warning
    wait_running(client_package, client, "yaml-one")
    delete = api(client_package, "delete_workload_api_v1_workloads_tenant_name_delete")
    assert delete.sync_detailed("default", "yaml-one", client=client).status_code == 200
