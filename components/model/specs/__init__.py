"""Typed, validated specs for what the components declare, one module per concern.

These pydantic models are both the stack config schema (camelCase keys in stacks/*.yaml)
and the typed inputs of the components, so a program that imports the components gets
the same validation as `pulumi up`. Field validators reject a bad value with a message
that names the fix; rules across fields live in components/model/config_rules/.
"""

from __future__ import annotations

from .base import (
    Cidr,
    Email,
    Hostname,
    ImageRef,
    K8sName,
    MasterCidr,
    Name,
    PodsCidr,
    ProxyOnlyCidr,
    Revision,
    ServicesCidr,
    Spec,
    SubnetCidr,
    UtcTime,
    cidr_range,
    gke_version,
    item_key,
)
from .cloud_run import (
    CLOUD_RUN_POOL,
    CloudRunModelSpec,
    CloudRunSpec,
)
from .cluster import (
    AuthorizedNetwork,
    ClusterSpec,
    MaintenanceExclusion,
    MaintenanceSpec,
    MaintenanceWindow,
    NodePoolSpec,
    UpgradeSpec,
)
from .disaggregation import (
    DisaggregationLoad,
    DisaggregationSpec,
    PrefillPoolSpec,
)
from .gateway import (
    GatewaySpec,
)
from .kv_offload import (
    KvOffloadSpec,
)
from .models import (
    LORA_RANKS,
    MANAGED_VLLM_OPTIONS,
    AdapterSpec,
    CanarySpec,
    CustomShape,
    ModelSpec,
    ServingPoolSpec,
    WeightsSource,
    extra_arg_problem,
    normalise_flag,
)
from .operations import (
    BudgetSpec,
    CostSpec,
    LoadStage,
    LoadTestSpec,
    MonitoringSpec,
    RolloutGates,
    RolloutSpec,
    SharedPrefixLoad,
    SloSpec,
    TokenLengths,
    TraceSpec,
)
from .picker import (
    PickerFlowControl,
    PickerSaturation,
    PickerScorers,
    PickerSpec,
)
from .sleep_mode import (
    GpuSharingSpec,
    SleepModeSpec,
)
from .speculative import (
    DraftShape,
    DraftSpec,
    SpeculativeSpec,
)
from .tenants import (
    DedicatedSpec,
    GlobalLimitsSpec,
    JwtSpec,
    RateLimitSpec,
    TenantSpec,
    shared_public_issuer,
)
from .weights import (
    SecretKeyRef,
    WeightsSpec,
)

__all__ = [
    'DraftShape', 'DraftSpec', 'SpeculativeSpec',
    'CLOUD_RUN_POOL', 'CloudRunModelSpec', 'CloudRunSpec',
    'AdapterSpec', 'AuthorizedNetwork', 'BudgetSpec', 'CanarySpec', 'Cidr', 'ClusterSpec', 'CostSpec', 'CustomShape',
    'DedicatedSpec', 'DisaggregationLoad', 'DisaggregationSpec', 'PrefillPoolSpec',
    'GpuSharingSpec', 'SleepModeSpec',
    'Email', 'GatewaySpec', 'GlobalLimitsSpec', 'Hostname', 'ImageRef', 'JwtSpec', 'K8sName',
    'KvOffloadSpec',
    'LORA_RANKS', 'LoadStage', 'LoadTestSpec', 'SharedPrefixLoad', 'TokenLengths', 'TraceSpec',
    'MANAGED_VLLM_OPTIONS', 'MaintenanceExclusion', 'MaintenanceSpec', 'MaintenanceWindow',
    'MasterCidr', 'ModelSpec', 'MonitoringSpec', 'SloSpec', 'Name', 'NodePoolSpec',
    'PickerFlowControl', 'PickerSaturation', 'PickerScorers', 'PickerSpec', 'PodsCidr', 'ProxyOnlyCidr',
    'RateLimitSpec', 'Revision', 'RolloutGates', 'RolloutSpec', 'SecretKeyRef', 'ServicesCidr', 'ServingPoolSpec', 'Spec',
    'SubnetCidr',    'TenantSpec', 'UpgradeSpec', 'UtcTime', 'WeightsSource', 'WeightsSpec', 'cidr_range', 'extra_arg_problem',
    'shared_public_issuer',
    'gke_version', 'item_key', 'normalise_flag',
]
