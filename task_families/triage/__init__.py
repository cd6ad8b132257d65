"""On-call incident triage (held out): alerts, logs, deploys and dependencies to root cause and action."""
