"""``python -m ait_env.agents.llm`` (:mod:`ait_env.agents.llm.cli`)."""

from ait_env.extras import missing_extras_exit

with missing_extras_exit("python -m ait_env.agents.llm"):  # a missing extra: one line, exit 3
    from ait_env.agents.llm.cli import main
    from ait_env.processes import sigterm_as_exit

    with sigterm_as_exit():  # a SIGTERM stops the running jobs too, not only this process
        raise SystemExit(main())
