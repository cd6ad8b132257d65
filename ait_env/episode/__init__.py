"""The episode as the agent plays it: the tools and their schemas (``tools``, ``spec``), the observation and
action spaces (``spaces``), the submission state machine (``submission``: validate, dispatch, report,
research episodes) and the reward (``reward``). :mod:`ait_env.env` wraps them in the Gymnasium contract."""
