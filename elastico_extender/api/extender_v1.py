"""Wire types of the kube-scheduler extender protocol, ``k8s.io/kube-scheduler/extender/v1``.

Names mirror upstream ``types.go`` exactly.  The Go structs carry no JSON tags,
so the keys on the wire are the Go field names (``Pod``, ``NodeNames``,
``FailedNodes``, ...); each field here is snake_case with its Go name as the
alias, and replies are serialised by alias.  Embedded ``Pod`` and ``Node``
objects are normal Kubernetes JSON (camelCase) and are kept as plain dicts:
the cluster layer reads the few fields it needs, and a reply with
nodeCacheCapable off must echo the scheduler's own node objects unchanged.

No logic lives here (STYLE habit 5).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from elastico_extender.core.resources import MAX_NODES

__all__ = [
    "MAX_NODES",
    "ExtenderArgs",
    "ExtenderBindingArgs",
    "ExtenderBindingResult",
    "ExtenderFilterResult",
    "ExtenderPreemptionArgs",
    "ExtenderPreemptionResult",
    "FailedNodesMap",
    "HostPriority",
    "HostPriorityList",
    "MetaPod",
    "MetaVictims",
    "NodeList",
    "Victims",
]

KubeObject = dict[str, Any]
"""A Pod or Node in normal Kubernetes JSON (no ``kind``/``apiVersion`` on this wire)."""

FailedNodesMap = dict[str, str]
"""Node name -> reason the pod cannot run there."""


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=False)


class NodeList(BaseModel):
    """``v1.NodeList`` as embedded in ExtenderArgs (``metadata`` + ``items``)."""

    model_config = ConfigDict(extra="allow")

    metadata: dict[str, Any] = Field(default_factory=dict)
    items: list[KubeObject] = Field(default_factory=list, max_length=MAX_NODES)


class ExtenderArgs(_Wire):
    """Body of filter and prioritize.

    ``Nodes`` is set when nodeCacheCapable is false (``NodeNames`` then arrives as
    ``null``); with nodeCacheCapable true ``Nodes`` is ``null`` and ``NodeNames``
    lists the candidates.
    """

    pod: KubeObject = Field(alias="Pod")
    nodes: NodeList | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames", max_length=MAX_NODES)


class ExtenderFilterResult(_Wire):
    """Reply to filter.  With nodeCacheCapable false the scheduler reads only ``Nodes``;
    with it true, ``NodeNames`` (``[]`` or ``null`` without ``Nodes``: zero nodes pass)."""

    nodes: NodeList | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames")
    failed_nodes: FailedNodesMap = Field(default_factory=dict, alias="FailedNodes")
    failed_and_unresolvable_nodes: FailedNodesMap = Field(
        default_factory=dict, alias="FailedAndUnresolvableNodes"
    )
    error: str = Field(default="", alias="Error")


class HostPriority(_Wire):
    """One node's score from prioritize: 0..10 (the scheduler multiplies by weight and 10)."""

    host: str = Field(alias="Host")
    score: int = Field(alias="Score")


HostPriorityList = list[HostPriority]


class ExtenderBindingArgs(_Wire):
    """Body of bind: which pod goes to which node."""

    pod_name: str = Field(alias="PodName")
    pod_namespace: str = Field(alias="PodNamespace")
    pod_uid: str = Field(alias="PodUID")
    node: str = Field(alias="Node")


class ExtenderBindingResult(_Wire):
    error: str = Field(default="", alias="Error")


class MetaPod(_Wire):
    uid: str = Field(alias="UID")


class MetaVictims(_Wire):
    pods: list[MetaPod] = Field(default_factory=list, alias="Pods")
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations")


class Victims(_Wire):
    pods: list[KubeObject] = Field(default_factory=list, alias="Pods")
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations")


class ExtenderPreemptionArgs(_Wire):
    """Body of preempt: full victims (nodeCacheCapable false) or meta victims (true)."""

    pod: KubeObject = Field(alias="Pod")
    node_name_to_victims: dict[str, Victims] | None = Field(default=None, alias="NodeNameToVictims")
    node_name_to_meta_victims: dict[str, MetaVictims] | None = Field(
        default=None, alias="NodeNameToMetaVictims"
    )


class ExtenderPreemptionResult(_Wire):
    node_name_to_meta_victims: dict[str, MetaVictims] = Field(
        default_factory=dict, alias="NodeNameToMetaVictims"
    )
