"""The contracts a job crosses, below everything that sends, runs or checks one: the job file's schema
(``schema``), the bundle (``bundle``) and its wire format (``wire``), the settings a job runs with
(``settings``), its result and status (``result``), the failure classes that cross ``python -m``
boundaries (``failures``), the tool-call text format (``toolcalls``), prime-rl's config rendering
(``primerl``), the job result cache's key (``cache``) and the bounds every parse of agent-controlled data
goes through (``guard``). Nothing here imports a backend, the runner, the worker or the fleet."""
