"""The pod of each role of the platform, as a function of typed facts: a serving pool's server
(a replica on one node), a multi-host group's leader and worker (server.py), and the standby that
answers for a pool at zero (standby.py). Plain dicts in the Kubernetes API's own field names; a
value that is a Pulumi output (a namespace-derived path, a host name) is placed, never read.
"""
