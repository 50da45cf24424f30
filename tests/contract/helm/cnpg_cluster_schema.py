"""The field names of CloudNativePG's `postgresql.cnpg.io/v1` `Cluster`, as its API reference
publishes them (ClusterSpec, BootstrapConfiguration, BootstrapInitDB, ManagedConfiguration,
RoleConfiguration, PostgresConfiguration, StorageConfiguration), for the parts the chart
renders. No CRD schema can be downloaded here, so this small schema stands in for it: a
misspelt or invented field, which the operator would silently drop, fails the test instead.
"""

from __future__ import annotations

from typing import Any


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "required": list(required),
    }


def _names(*names: str) -> dict[str, Any]:
    """Fields the chart does not render: allowed, any value (the name is what is checked)."""
    return {name: {} for name in names}


_STRINGS = {"type": "array", "items": {"type": "string"}}
_NAME_REF = _object({"name": {"type": "string", "minLength": 1}}, ("name",))

ROLE = _object(
    {
        "name": {"type": "string", "minLength": 1},
        "ensure": {"enum": ["present", "absent"]},
        "comment": {"type": "string"},
        "login": {"type": "boolean"},
        "superuser": {"type": "boolean"},
        "createdb": {"type": "boolean"},
        "createrole": {"type": "boolean"},
        "inherit": {"type": "boolean"},
        "replication": {"type": "boolean"},
        "bypassrls": {"type": "boolean"},
        "connectionLimit": {"type": "integer"},
        "validUntil": {"type": "string"},
        "inRoles": _STRINGS,
        "passwordSecret": _NAME_REF,
        "disablePassword": {"type": "boolean"},
    },
    ("name",),
)

INITDB = _object(
    {
        **_names(
            "import",
            "encoding",
            "localeCollate",
            "localeCType",
            "locale",
            "localeProvider",
            "icuLocale",
            "icuRules",
            "builtinLocale",
            "walSegmentSize",
            "postInitApplicationSQLRefs",
            "postInitSQLRefs",
            "postInitTemplateSQLRefs",
            "options",
        ),
        "database": {"type": "string"},
        "owner": {"type": "string"},
        "secret": _NAME_REF,
        "dataChecksums": {"type": "boolean"},
        "postInitSQL": _STRINGS,
        "postInitApplicationSQL": _STRINGS,
        "postInitTemplateSQL": _STRINGS,
    }
)

CLUSTER_SPEC = _object(
    {
        **_names(
            "affinity",
            "backup",
            "certificates",
            "description",
            "enablePDB",
            "env",
            "envFrom",
            "ephemeralVolumeSource",
            "ephemeralVolumesSizeLimit",
            "externalClusters",
            "failoverDelay",
            "imageCatalogRef",
            "imagePullPolicy",
            "imagePullSecrets",
            "inheritedMetadata",
            "logLevel",
            "maxSyncReplicas",
            "minSyncReplicas",
            "monitoring",
            "nodeMaintenanceWindow",
            "plugins",
            "postgresGID",
            "postgresUID",
            "primaryUpdateMethod",
            "priorityClassName",
            "probes",
            "projectedVolumeTemplate",
            "replica",
            "replicationSlots",
            "schedulerName",
            "seccompProfile",
            "serviceAccountTemplate",
            "smartShutdownTimeout",
            "startDelay",
            "stopDelay",
            "superuserSecret",
            "switchoverDelay",
            "tablespaces",
            "topologySpreadConstraints",
            "walStorage",
        ),
        "instances": {"type": "integer", "minimum": 1},
        "imageName": {"type": "string", "minLength": 1},
        "primaryUpdateStrategy": {"enum": ["unsupervised", "supervised"]},
        "enableSuperuserAccess": {"type": "boolean"},
        "postgresql": _object(
            {
                **_names(
                    "pg_hba",
                    "pg_ident",
                    "ldap",
                    "syncReplicaElectionConstraint",
                    "shared_preload_libraries",
                    "promotionTimeout",
                    "enableAlterSystem",
                    "synchronous",
                    "extensions",
                ),
                "parameters": {"type": "object", "additionalProperties": {"type": "string"}},
            }
        ),
        "bootstrap": _object({**_names("recovery", "pg_basebackup"), "initdb": INITDB}),
        "managed": _object({"roles": {"type": "array", "items": ROLE}, **_names("services")}),
        "storage": _object(
            {
                "size": {"type": "string", "minLength": 1},
                "storageClass": {"type": "string"},
                **_names("resizeInUseVolumes", "pvcTemplate"),
            }
        ),
        "resources": _object(
            {"requests": {"type": "object"}, "limits": {"type": "object"}, **_names("claims")}
        ),
    },
    ("instances",),
)

CLUSTER = _object(
    {
        "apiVersion": {"const": "postgresql.cnpg.io/v1"},
        "kind": {"const": "Cluster"},
        "metadata": {"type": "object"},
        "spec": CLUSTER_SPEC,
    },
    ("apiVersion", "kind", "metadata", "spec"),
)
