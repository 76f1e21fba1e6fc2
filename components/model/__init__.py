"""The model layer: what a stack is and what follows from it, with no Pulumi and no cloud SDK.

The stack's typed config and its checks across fields (specs/, stack_config.py, config_rules/),
the hardware and price catalogs, vLLM's releases and command lines, capacity, throughput and
cold start, the serving API and tenant URLs, the weights' layout, the SLOs, and the pod of each
role. components/ declares resources from these facts; infra/ plans and reports with them;
policies/ judges with them. tests/test_layers.py fails if anything here imports Pulumi.
"""
