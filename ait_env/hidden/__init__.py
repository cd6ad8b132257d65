"""The hidden eval and what protects it: the secret seed and the hidden sets it derives (``secrets``),
the harness that scores a served model on them (``evaluation``), untrained baselines (``baselines``: the
store and the one policy for which baseline a job is compared with), and scrubbing of hidden text and
credentials from what leaves a job (``redact``)."""
