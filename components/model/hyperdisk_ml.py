"""Facts of GKE's Hyperdisk ML path ("Automate data transfer from Cloud Storage to a Hyperdisk ML
volume using GKE Volume Populator") the config, the cluster and the policies share."""

# The compute class name is fixed by GKE: the transfer Jobs select it.
TRANSFER_COMPUTE_CLASS = "gcs-to-hdml-compute-class"
# The guide's requirement for GKE Volume Populator.
MIN_GKE = "1.33.2-gke.4780000"
