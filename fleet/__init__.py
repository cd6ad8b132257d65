"""The GPU fleet, below the backends that use it and apart from the worker it runs (``docs/fleet.md``):
the Runpod Serverless client (``runpod_api``), the endpoint tool (``endpoint``: ``python -m fleet.endpoint
up|status|down``), the journal every dispatched job is recorded in (``journal``), attempt billing and
budgets (``billing``), the dated price sheet (``prices``), ``reconcile`` (journal vs Runpod's bill), the
pod-pool vs Serverless simulator (``simulate``, ``fleet_defaults.yaml``) and the $/job matrix
(``bench_matrix``). Nothing here imports the worker (``gpu/``)."""
