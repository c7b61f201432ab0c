"""The sandbox for model-written env code: the static gate, the schema policy, bubblewrap and
seccomp confinement, and the confined tool worker with its protocol and its parent side.

It imports only the core. The worker processes it starts (`confined_worker.py`, `schema_host.py`)
run these files by path and see only the core and this folder. Empty on purpose: the worker loads
single modules of it.
"""
