"""List prices the cost report uses: Compute Engine, GKE and Filestore, us-central1, USD.

A dated snapshot, not a quote: GPU machine prices include the attached GPUs; spot prices
float. Refresh from the Cloud Billing catalog (or the GCP pricing pages) and bump the date.
"""

from __future__ import annotations

PRICES_AS_OF = "2026-11-01"
PRICE_REGION = "us-central1"
# The machines' prices live with the components, which price what they declare with them.
from ..components.model.machine_prices import MACHINE_PRICES as MACHINE_PRICES  # noqa: E402
from ..components.model.machine_prices import MachinePrice as MachinePrice  # noqa: E402

GKE_CLUSTER_FEE_HOUR = 0.10
FILESTORE_GIB_MONTH = {"BASIC_HDD": 0.16, "BASIC_SSD": 0.30, "ZONAL": 0.25, "REGIONAL": 0.45}
# Cloud Storage, Standard class, regional bucket.
GCS_STANDARD_GB_MONTH = 0.020
