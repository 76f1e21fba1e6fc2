"""Compute Engine list prices of the machines the platform runs on (us-central1, USD, a dated
snapshot): components price what they declare with them (the load tests' dollars per million
tokens), the plan's cost report (infra/pricing.py) with the rest of its table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class MachinePrice:
    on_demand_hour: float
    spot_hour: float


MACHINE_PRICES: Mapping[str, MachinePrice] = {
    "a2-highgpu-1g": MachinePrice(3.6731, 1.2245),
    "a2-highgpu-2g": MachinePrice(7.3461, 2.4490),
    "a2-highgpu-4g": MachinePrice(14.6923, 4.8980),
    "a2-highgpu-8g": MachinePrice(29.3846, 9.7961),
    "a2-megagpu-16g": MachinePrice(55.7390, 18.5858),
    "a2-ultragpu-1g": MachinePrice(5.0688, 1.6948),
    "a2-ultragpu-2g": MachinePrice(10.1376, 3.3896),
    "a2-ultragpu-4g": MachinePrice(20.2752, 6.7792),
    "a2-ultragpu-8g": MachinePrice(40.5504, 13.5584),
    "a3-highgpu-8g": MachinePrice(88.2539, 29.4179),
    "a3-megagpu-8g": MachinePrice(97.2400, 32.4133),
    "g2-standard-4": MachinePrice(0.7068, 0.2827),
    "g2-standard-8": MachinePrice(0.8536, 0.3414),
    "g2-standard-12": MachinePrice(1.0004, 0.4002),
    "g2-standard-16": MachinePrice(1.1472, 0.4589),
    "g2-standard-24": MachinePrice(2.0008, 0.8003),
    "g2-standard-32": MachinePrice(1.7344, 0.6938),
    "g2-standard-48": MachinePrice(4.0017, 1.6007),
    "g2-standard-96": MachinePrice(8.0034, 3.2014),
    # TPU hosts: chips x the chip-hour list price (us-central1; v5e $1.20 / spot $0.245, v6e $2.70 /
    # $0.544, v5p $4.20 / $0.836 as in the GCP billing catalog SkyPilot publishes, v6e's on-demand
    # price as Google announced it at GA); a TPU VM's price includes its host.
    "ct5lp-hightpu-1t": MachinePrice(1.20, 0.245),
    "ct5lp-hightpu-4t": MachinePrice(4.80, 0.98),
    "ct5lp-hightpu-8t": MachinePrice(9.60, 1.96),
    "ct6e-standard-1t": MachinePrice(2.70, 0.544),
    "ct6e-standard-4t": MachinePrice(10.80, 2.176),
    "ct6e-standard-8t": MachinePrice(21.60, 4.352),
    "ct5p-hightpu-4t": MachinePrice(16.80, 3.344),
    "e2-standard-4": MachinePrice(0.1340, 0.0402),
    "e2-standard-8": MachinePrice(0.2681, 0.0804),
    "n2-standard-4": MachinePrice(0.1942, 0.0470),
    "n2-standard-8": MachinePrice(0.3885, 0.0940),
    "n2-standard-16": MachinePrice(0.7769, 0.1880),
}
