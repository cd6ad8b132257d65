"""What leaves the worker is scrubbed (:class:`Scrubber`): host paths, credential values, the secret seeds
(:func:`private_secrets`: the worker's private copy of them) and the family's hidden questions
(:func:`hidden_questions`)."""

from __future__ import annotations

import json
import os
from pathlib import Path


class Scrubber:
    """Removes from text that leaves the worker: host paths, credential values, secret seeds and hidden
    questions (each replaced by ``<redacted>``)."""

    def __init__(self, secrets: set[str] | None = None) -> None:
        self.secrets = sorted((s for s in (secrets or set()) if s), key=len, reverse=True)

    def add(self, values: set[str]) -> None:
        self.secrets = sorted(set(self.secrets) | {v for v in values if v}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        from ait_env.hidden.redact import for_agent

        if not text:
            return text
        for s in self.secrets:
            text = text.replace(s, "<redacted>")
        return for_agent(text)


def private_secrets(private: Path) -> tuple[Path | None, set[str]]:
    """A private copy (0600) of the seeds the worker was given (``$AIT_SECRETS_JSON``: the orchestrator's
    private seeds, :func:`ait_env.hidden.secrets.worker_secrets_json`, or a Runpod secret; else an existing
    file named by ``$AIT_SECRETS_FILE``) and the seed values to scrub (6 digits or more); ``(None, set())``
    when it was given none: the job is scored with the published seeds, and its result says so
    (``hidden_seeds``), so an orchestrator with private seeds refuses it. A worker never makes seeds."""
    raw = os.environ.get("AIT_SECRETS_JSON")
    named = Path(os.environ.get("AIT_SECRETS_FILE") or "/nonexistent")
    if not raw and named.is_file():
        raw = named.read_text()
    if not raw:
        return None, set()  # the published seeds (public by design: ait_env/hidden/secrets.py)
    seeds = json.loads(raw)
    if not isinstance(seeds, dict):
        raise ValueError("the secret seeds must be a JSON object {\"<family>\": <int>, ...}")
    copy = private / "secrets.json"
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(raw)
    return copy, {str(v) for v in seeds.values() if len(str(v)) >= 6}


def hidden_questions(family: str, secrets_file: Path | None) -> set[str]:
    """The hidden questions of ``family`` under the worker's seeds (scrubbed from text that leaves)."""
    from ait_env.hidden.secrets import PUBLISHED, SecretsError, hidden_questions, private_seeds

    try:
        seeds = private_seeds(secrets_file, create=False) if secrets_file else PUBLISHED
        return {q for q in hidden_questions(family, seeds) if len(q) >= 12}
    except (KeyError, OSError, SecretsError):
        return set()
