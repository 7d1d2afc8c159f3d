"""The admin API's metadata routes over real HTTP against a running broker: clusters,
tenants, namespaces with their policies, topics and partitioned topics.

Status codes and reasons follow Pulsar's ``ClustersBase``, ``TenantsBase``,
``NamespacesBase`` and ``PersistentTopicsBase``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from brokerlet import Broker

_names = itertools.count()


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with Broker(port=0, max_num_partitions_per_partitioned_topic=64) as running:
        yield running


class Admin:
    """requests against the broker's web service, bodies as JSON."""

    def __init__(self, base: str) -> None:
        self.base = base

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> requests.Response:
        if body is not None:
            kwargs["json"] = body
        return requests.request(method, self.base + path, timeout=10, **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        reply = self.call("GET", path, **kwargs)
        assert reply.status_code == 200, (path, reply.status_code, reply.text)
        return reply.json()

    def ok(self, method: str, path: str, body: Any = None) -> None:
        reply = self.call(method, path, body)
        assert reply.status_code == 204, (method, path, reply.status_code, reply.text)

    def refused(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, str]:
        reply = self.call(method, path, body, **kwargs)
        assert reply.status_code >= 400, (method, path, reply.status_code)
        return reply.status_code, reply.json()["reason"]


@pytest.fixture
def admin(broker: Broker) -> Admin:
    assert broker.web_service_url is not None
    return Admin(broker.web_service_url)


@pytest.fixture
def tenant(admin: Admin) -> str:
    name = f"tenant-{next(_names)}"
    admin.ok("PUT", f"/admin/v2/tenants/{name}", {"allowedClusters": ["standalone"]})
    return name


@pytest.fixture
def namespace(admin: Admin, tenant: str) -> str:
    name = f"{tenant}/ns"
    admin.ok("PUT", f"/admin/v2/namespaces/{name}")
    return name


# Clusters.


def test_clusters_list_is_exactly_standalone(admin: Admin) -> None:
    # Container-style readiness checks wait for this exact body.
    assert admin.call("GET", "/admin/v2/clusters").text == '["standalone"]'


def test_the_cluster_is_described_and_others_are_404(admin: Admin, broker: Broker) -> None:
    data = admin.get("/admin/v2/clusters/standalone")

    assert data["brokerServiceUrl"] == broker.service_url
    assert data["serviceUrl"] == broker.web_service_url
    assert admin.refused("GET", "/admin/v2/clusters/other") == (404, "Cluster does not exist")


def test_cluster_name_is_a_setting() -> None:
    with Broker(port=0, clusterName="east") as other:
        assert requests.get(f"{other.web_service_url}/admin/v2/clusters", timeout=10).json() == [
            "east"
        ]


def test_liveness_routes(admin: Admin) -> None:
    assert admin.call("GET", "/admin/v2/brokers/health").text == "ok"
    assert admin.call("GET", "/admin/v2/brokers/ready").text == "ok"
    assert admin.call("GET", "/status.html").text == "OK"


# Tenants.


def test_public_exists_at_start(admin: Admin) -> None:
    assert "public" in admin.get("/admin/v2/tenants")
    assert admin.get("/admin/v2/namespaces/public") == ["public/default"]


def test_tenant_create_get_update_delete(admin: Admin) -> None:
    name = f"acme-{next(_names)}"
    info = {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}

    admin.ok("PUT", f"/admin/v2/tenants/{name}", info)
    assert admin.get(f"/admin/v2/tenants/{name}") == info
    assert name in admin.get("/admin/v2/tenants")
    assert admin.refused("PUT", f"/admin/v2/tenants/{name}", info) == (409, "Tenant already exist")

    admin.ok("POST", f"/admin/v2/tenants/{name}", {**info, "adminRoles": ["ops", "dev"]})
    assert admin.get(f"/admin/v2/tenants/{name}")["adminRoles"] == ["dev", "ops"]

    admin.ok("DELETE", f"/admin/v2/tenants/{name}")
    assert admin.refused("GET", f"/admin/v2/tenants/{name}") == (404, "Tenant does not exist")
    assert admin.refused("DELETE", f"/admin/v2/tenants/{name}")[0] == 404


def test_a_tenant_with_namespaces_is_not_deleted(admin: Admin, namespace: str) -> None:
    tenant = namespace.split("/", maxsplit=1)[0]

    status, _ = admin.refused("DELETE", f"/admin/v2/tenants/{tenant}")
    assert status == 409
    assert admin.refused("DELETE", f"/admin/v2/tenants/{tenant}?force=true")[0] == 405


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"allowedClusters": []}, 412, "Clusters can not be empty"),
        ({"allowedClusters": ["mars"]}, 412, "Clusters do not exist: mars"),
        ({"adminRoles": "ops"}, 400, "adminRoles: must be a list of strings"),
        ([1, 2], 400, "Request body must be a JSON object, got [1, 2]"),
    ],
)
def test_bad_tenant_bodies_are_refused_and_change_nothing(
    admin: Admin, body: Any, status: int, reason: str
) -> None:
    name = f"bad-{next(_names)}"

    assert admin.refused("PUT", f"/admin/v2/tenants/{name}", body) == (status, reason)
    assert name not in admin.get("/admin/v2/tenants")


def test_malformed_json_is_400_and_changes_nothing(admin: Admin) -> None:
    name = f"bad-{next(_names)}"

    status, reason = admin.refused("PUT", f"/admin/v2/tenants/{name}", data=b"{nope")

    assert status == 400
    assert reason.startswith("Malformed JSON body")
    assert name not in admin.get("/admin/v2/tenants")


@pytest.mark.parametrize("name", ["a%20b", "%2E%2E", "caf%C3%A9%21"])
def test_bad_tenant_names_are_412(admin: Admin, name: str) -> None:
    assert admin.refused("PUT", f"/admin/v2/tenants/{name}", {})[0] == 412


# Namespaces and policies.


def test_namespace_create_list_get_delete(admin: Admin, tenant: str) -> None:
    admin.ok("PUT", f"/admin/v2/namespaces/{tenant}/orders", {"message_ttl_in_seconds": 30})

    assert admin.get(f"/admin/v2/namespaces/{tenant}") == [f"{tenant}/orders"]
    policies = admin.get(f"/admin/v2/namespaces/{tenant}/orders")
    assert policies["message_ttl_in_seconds"] == 30
    assert policies["replication_clusters"] == ["standalone"]
    assert policies["schema_compatibility_strategy"] == "UNDEFINED"
    assert admin.refused("PUT", f"/admin/v2/namespaces/{tenant}/orders") == (
        409,
        "Namespace already exists",
    )

    admin.ok("DELETE", f"/admin/v2/namespaces/{tenant}/orders")
    assert admin.get(f"/admin/v2/namespaces/{tenant}") == []
    assert admin.refused("GET", f"/admin/v2/namespaces/{tenant}/orders")[0] == 404


def test_a_namespace_in_a_missing_tenant_is_404(admin: Admin) -> None:
    assert admin.refused("PUT", "/admin/v2/namespaces/ghost/ns") == (404, "Tenant does not exist")
    assert admin.refused("GET", "/admin/v2/namespaces/ghost")[0] == 404


def test_a_namespace_with_topics_is_not_deleted(admin: Admin, namespace: str) -> None:
    admin.ok("PUT", f"/admin/v2/persistent/{namespace}/t")

    assert admin.refused("DELETE", f"/admin/v2/namespaces/{namespace}") == (
        409,
        "Cannot delete non empty namespace",
    )


@pytest.mark.parametrize(
    ("sub", "method", "value", "stored_key", "unset"),
    [
        ("messageTTL", "POST", 120, "message_ttl_in_seconds", None),
        ("deduplication", "POST", True, "deduplicationEnabled", None),
        (
            "retention",
            "POST",
            {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100},
            "retention_policies",
            None,
        ),
        (
            "autoTopicCreation",
            "POST",
            {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3},
            "autoTopicCreationOverride",
            None,
        ),
        (
            "schemaCompatibilityStrategy",
            "PUT",
            "BACKWARD",
            "schema_compatibility_strategy",
            "UNDEFINED",
        ),
    ],
)
def test_each_policy_has_get_set_and_remove(
    admin: Admin,
    namespace: str,
    sub: str,
    method: str,
    value: Any,
    stored_key: str,
    unset: Any,
) -> None:
    path = f"/admin/v2/namespaces/{namespace}/{sub}"
    assert admin.get(path) == unset

    admin.ok(method, path, value)
    assert admin.get(path) == value
    assert admin.get(f"/admin/v2/namespaces/{namespace}")[stored_key] == value

    admin.ok("DELETE", path)
    assert admin.get(path) == unset


def test_backlog_quota_is_stored_and_reported(admin: Admin, namespace: str) -> None:
    quota = {"limitSize": 1024, "limitTime": -1, "policy": "producer_exception"}

    admin.ok("POST", f"/admin/v2/namespaces/{namespace}/backlogQuota", quota)

    assert admin.get(f"/admin/v2/namespaces/{namespace}/backlogQuotaMap") == {
        "destination_storage": quota
    }
    admin.ok("DELETE", f"/admin/v2/namespaces/{namespace}/backlogQuota")
    assert admin.get(f"/admin/v2/namespaces/{namespace}/backlogQuotaMap") == {}


def test_retention_smaller_than_the_backlog_quota_is_412(admin: Admin, namespace: str) -> None:
    quota = {"limitSize": 10 * 1024 * 1024, "policy": "producer_request_hold"}
    admin.ok("POST", f"/admin/v2/namespaces/{namespace}/backlogQuota", quota)

    status, _ = admin.refused(
        "POST",
        f"/admin/v2/namespaces/{namespace}/retention",
        {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1},
    )

    assert status == 412
    assert admin.get(f"/admin/v2/namespaces/{namespace}/retention") is None


def test_permissions_are_stored_in_auth_policies(admin: Admin, namespace: str) -> None:
    admin.ok("POST", f"/admin/v2/namespaces/{namespace}/permissions/app", ["produce", "consume"])

    assert admin.get(f"/admin/v2/namespaces/{namespace}/permissions") == {
        "app": ["consume", "produce"]
    }
    policies = admin.get(f"/admin/v2/namespaces/{namespace}")
    assert policies["auth_policies"]["namespace_auth"] == {"app": ["consume", "produce"]}
    admin.ok("DELETE", f"/admin/v2/namespaces/{namespace}/permissions/app")
    assert admin.get(f"/admin/v2/namespaces/{namespace}/permissions") == {}


@pytest.mark.parametrize(
    ("sub", "method", "value", "status"),
    [
        ("messageTTL", "POST", -1, 412),
        ("messageTTL", "POST", "10", 400),
        ("deduplication", "POST", "yes", 400),
        ("retention", "POST", {"retentionTimeInMinutes": "x"}, 400),
        ("autoTopicCreation", "POST", {"allowAutoTopicCreation": True, "topicType": "x"}, 400),
        (
            "autoTopicCreation",
            "POST",
            {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 0},
            400,
        ),
        (
            "autoTopicCreation",
            "POST",
            {
                "allowAutoTopicCreation": True,
                "topicType": "partitioned",
                "defaultNumPartitions": 65,
            },
            406,
        ),
        ("schemaCompatibilityStrategy", "PUT", "SOMETIMES", 400),
        ("backlogQuota", "POST", {"policy": "drop_everything"}, 400),
    ],
)
def test_bad_policy_values_are_refused_and_change_nothing(
    admin: Admin, namespace: str, sub: str, method: str, value: Any, status: int
) -> None:
    before = admin.get(f"/admin/v2/namespaces/{namespace}")

    assert admin.refused(method, f"/admin/v2/namespaces/{namespace}/{sub}", value)[0] == status
    assert admin.get(f"/admin/v2/namespaces/{namespace}") == before


# Topics.


def test_non_partitioned_topic_create_list_delete(admin: Admin, namespace: str) -> None:
    base = f"/admin/v2/persistent/{namespace}"

    admin.ok("PUT", f"{base}/orders")

    assert admin.get(base) == [f"persistent://{namespace}/orders"]
    assert admin.get(f"{base}/orders/partitions")["partitions"] == 0
    assert admin.refused("PUT", f"{base}/orders") == (409, "This topic already exists")
    admin.ok("DELETE", f"{base}/orders")
    assert admin.get(base) == []
    assert admin.refused("DELETE", f"{base}/orders") == (404, "Topic not found")


def test_partitioned_topic_create_get_grow_delete(admin: Admin, namespace: str) -> None:
    base = f"/admin/v2/persistent/{namespace}"

    admin.ok("PUT", f"{base}/events/partitions", 3)

    assert admin.get(f"{base}/events/partitions")["partitions"] == 3
    assert admin.get(base) == [f"persistent://{namespace}/events-partition-{i}" for i in range(3)]
    assert admin.get(f"{base}/partitioned") == [f"persistent://{namespace}/events"]
    assert admin.get(f"/admin/v2/namespaces/{namespace}/topics") == admin.get(base)
    assert admin.refused("PUT", f"{base}/events/partitions", 3)[0] == 409

    admin.ok("POST", f"{base}/events/partitions", 5)
    assert admin.get(f"{base}/events/partitions")["partitions"] == 5
    status, reason = admin.refused("POST", f"{base}/events/partitions", 2)
    assert (status, reason) == (422, "Expect partitions 2 can't less than current partitions 5.")
    assert admin.get(f"{base}/events/partitions")["partitions"] == 5

    assert admin.refused("DELETE", f"{base}/events")[0] == 409  # is partitioned
    admin.ok("DELETE", f"{base}/events/partitions")
    assert admin.get(base) == []
    assert admin.refused("DELETE", f"{base}/events/partitions")[0] == 404


def test_partitioned_metadata_media_type_with_properties(admin: Admin, namespace: str) -> None:
    path = f"/admin/v2/persistent/{namespace}/props/partitions"

    admin.ok("PUT", path, {"partitions": 2, "properties": {"owner": "billing"}})

    assert admin.get(path) == {
        "partitions": 2,
        "properties": {"owner": "billing"},
        "deleted": False,
    }


def test_growing_a_non_partitioned_topic_is_409(admin: Admin, namespace: str) -> None:
    admin.ok("PUT", f"/admin/v2/persistent/{namespace}/plain")

    status, _ = admin.refused("POST", f"/admin/v2/persistent/{namespace}/plain/partitions", 4)

    assert status == 409


@pytest.mark.parametrize(
    ("body", "status"),
    [(0, 406), (-3, 406), (65, 406), ("4", 400), (True, 400), ({"partitions": "x"}, 400)],
)
def test_bad_partition_counts_are_refused_and_change_nothing(
    admin: Admin, namespace: str, body: Any, status: int
) -> None:
    base = f"/admin/v2/persistent/{namespace}"

    assert admin.refused("PUT", f"{base}/bad/partitions", body)[0] == status
    assert admin.get(base) == []


@pytest.mark.parametrize(
    "topic",
    ["a%2F..", "a%2F%2Fb", "%2E%2E", "x" * 1001, "a%00b"],
    ids=["dot-dot", "empty-segment", "dots", "too-long", "control"],
)
def test_bad_topic_names_are_4xx_and_change_nothing(
    admin: Admin, namespace: str, topic: str
) -> None:
    base = f"/admin/v2/persistent/{namespace}"

    status, reason = admin.refused("PUT", f"{base}/{topic}")

    assert 400 <= status < 500
    assert "Invalid topic name" in reason
    assert admin.refused("PUT", f"{base}/{topic}/partitions", 2)[0] == status
    assert admin.get(base) == []


def test_a_topic_name_of_1000_characters_is_fine(admin: Admin, namespace: str) -> None:
    admin.ok("PUT", f"/admin/v2/persistent/{namespace}/{'x' * 1000}")


def test_topics_in_a_missing_namespace_are_404(admin: Admin, tenant: str) -> None:
    assert admin.refused("PUT", f"/admin/v2/persistent/{tenant}/nope/t") == (
        404,
        "Namespace does not exist",
    )
    assert admin.refused("GET", f"/admin/v2/persistent/{tenant}/nope")[0] == 404


def test_domains_list_their_own_topics(admin: Admin, namespace: str) -> None:
    admin.ok("PUT", f"/admin/v2/persistent/{namespace}/kept")
    admin.ok("PUT", f"/admin/v2/non-persistent/{namespace}/fleeting")

    assert admin.get(f"/admin/v2/persistent/{namespace}") == [f"persistent://{namespace}/kept"]
    assert admin.get(f"/admin/v2/non-persistent/{namespace}") == [
        f"non-persistent://{namespace}/fleeting"
    ]
    everything = admin.get(f"/admin/v2/namespaces/{namespace}/topics?mode=ALL")
    assert sorted(everything) == [
        f"non-persistent://{namespace}/fleeting",
        f"persistent://{namespace}/kept",
    ]
    assert admin.refused("GET", f"/admin/v2/namespaces/{namespace}/topics?mode=SOME")[0] == 400
