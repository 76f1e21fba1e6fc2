"""The network between a GPU group's hosts: what Compute Engine gives pods on each machine type,
which the roofline (components/model/throughput.py) and the plan's warnings count on."""

from __future__ import annotations

from ...components.model.catalog import MACHINE_TYPES
from ...components.model.k8s_objects import NODE_POOL_LABEL as POOL_LABEL
from ..plan import Plan
from .base import Contract, _docs

GPU_NETWORK = "https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth"
GPUDIRECT_TCPX = "https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx"


def gpu_groups_talk_over_the_primary_nic(plan: Plan) -> list[str]:
    """Every GPU node pool a group spans has only its primary network (no additional node networks:
    the GPUDirect NICs unused), and its machine's TCP rate is in the catalog."""
    groups = {(d["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"].get("nodeSelector") or {}).get(POOL_LABEL)
              for d in _docs(plan, "LeaderWorkerSet")}
    out = []
    for r in plan.of_type("gcp:container/nodePool:NodePool"):
        config = r.props.get("nodeConfig") or {}
        machine = MACHINE_TYPES.get(config.get("machineType", ""))
        # A spot pool's on-demand twin carries the same label: a group lands on either.
        if (config.get("labels") or {}).get(POOL_LABEL) not in groups or machine is None or machine.is_tpu:
            continue
        extra = (r.props.get("networkConfig") or {}).get("additionalNodeNetworkConfigs")
        if extra:
            out.append(f"node pool {r.props['name']}: has additional node networks ({len(extra)}): its group may run "
                       "over GPUDirect, but the roofline and the plan's warnings count TCP on the primary NIC")
        if not machine.nic_gbps:
            out.append(f"node pool {r.props['name']}: {machine.name} has no network rate in the catalog (nic_gbps): "
                       "the roofline cannot cost its group's traffic")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("Compute Engine GPU machines", "gpu-network-bandwidth",
             "A2 and G2 machines have no GPU-to-GPU networking (up to 100 Gbps by machine type, g2-standard-4 "
             "10); a3-highgpu-8g carries GPUDirect-TCPX on four GPU NICs and a3-megagpu-8g GPUDirect-TCPXO on "
             "eight, beside a gVNIC for everything else; the GPU NICs take extra VPC networks on the node pool "
             "(GKE multi-networking) and the NCCL plugin, without which NCCL runs over TCP on the primary NIC",
             f"{GPU_NETWORK} (overview table; A3 and A2/G2 sections), {GPUDIRECT_TCPX}",
             "GPU node pools get no additional networks; the roofline costs a group's traffic at the machine's "
             "TCP rate (MachineType.nic_gbps); a group is models[].multiHost: true, warned where TCP costs",
             gpu_groups_talk_over_the_primary_nic),
)
