"""Score any LLM as a trainer agent: episodes of ``AIT/JobWriting-v0`` played by a model behind any
OpenAI-compatible chat endpoint (a hosted API, vLLM, Ollama, the local tiny-model endpoint).

    python -m ait_env.agents.llm --base-url https://api.example.com/v1 --model my-model \\
        [--api-key-env OPENAI_API_KEY] [--families train|all|arithmetic,units] [--episodes 4] \\
        [--concurrency 4] [--backend stub|local] [--tool-mode auto|native|text] \\
        [--price-in 0.5 --price-out 1.5 --prices-as-of 2026-12-01] [--max-jobs 3] [--out runs/llm/<name>]

Contract:

- **Tool calls**: ``native`` sends the episode's tools (``info["tools"]``: the six, plus ``submit_jobs``
  and ``finish`` when ``--max-jobs`` > 1 makes it a research episode) as OpenAI ``tools`` (the system prompt without
  its text tool sections) and turns each returned ``tool_calls`` entry into the env's
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` text
  (:func:`ait_env.episode.messages.action_text`, as every outer loop does); the conversation sent back is the
  env's own (``info["messages"]``: its assistant turns carry the tool calls, its ``tool`` messages the
  results). ``text`` sends no ``tools``: the model writes ``<tool_call>`` blocks itself and reads the
  env's observations as user messages. ``auto`` starts native and switches an episode to text when the
  endpoint refuses tools (HTTP 400 on the first turn).
- **Retries**: rate limits (429), server errors (5xx), dropped connections and timeouts are retried
  with exponential backoff (the official ``openai`` client's own retries, ``--max-retries``). An
  endpoint that still fails ends the episode as ``endpoint_failed``: never the agent's failure, left
  out of every reward statistic (like ``infra_failed``) and counted in the table. So does any answer
  that is not a usable chat completion (an HTML page with status 200, no choices, a body that does not
  parse): the episode ends, the run goes on. A 400 saying the conversation is longer than the model's
  context after the first turn (the agent's own long turns or tool results) is the agent's outcome: the env
  ends the episode as at its turn limit (scored on the jobs that ran, else ``invalid`` or ``unparsable``).
- **Deadlines**: every attempt has an overall deadline of ``--timeout`` seconds from its start to the
  last byte of its answer (a server that drips a byte at a time is cut off; httpx's own timeouts apply
  per read), so a request lasts at most ``(max_retries + 1) × timeout`` plus the backoff.
- **The API key never leaves the runner**: it is removed from the endpoint's answers before they reach
  the env and from every text the runner writes or logs (an endpoint that echoes the ``Authorization``
  header in an error cannot put it in ``episodes.jsonl``).
- **One backend for the run**, shared by every episode (``gym.make(..., backend=<Backend>)``), closed at
  the end; episodes run ``--concurrency`` at a time in threads.
- **Costs**: each completion's prompt and completion tokens and their USD (``--price-in``/``--price-out``
  USD per million tokens, dated by ``--prices-as-of``) go to the env's cost ledger as ``kind="llm"``
  records of the episode, so the episode budget counts them; jobs add their ``gpu_job`` records.
- **Resume**: ``--resume`` keeps the episodes that an interrupted run with the same settings (``run.json`` in
  ``--out``: model, served weights hash, backend, tool mode, sampling, hidden seeds) wrote and plays only the
  rest; other settings there are refused, saying which.
- **Results** in ``--out``: ``episodes.jsonl`` (one record per episode), ``results.json`` and
  ``results.md`` (per family and overall: episodes, mean reward with a 95% CI over the scored,
  job_failed, invalid and unparsable episodes, validation rate, status mix, mean uplift of scored jobs,
  the share of validated jobs on each base model, mean turns, LLM and job USD; jobs per episode, the share
  of dispatches that were batches of several jobs, the best job's reward gain over the first job's, and
  the cost per episode), and ``results.png``; the
  three and the table printed on stdout carry one title (:func:`results_title`: the model, the backend,
  ``SURROGATE scores`` on the stub backend). The chart draws a CI only where one exists (n ≥ 2).
- **Hidden eval**: this installation's private seeds unless ``--hidden-seeds published`` (or
  ``AIT_HIDDEN_SEEDS``) chooses the public ones; ``results.json``'s ``meta.hidden_seeds`` and the last line
  on stderr say which (:mod:`ait_env.hidden.secrets`).
- **Exit status**: 0 when at least one episode was kept (has a reward, even 0); 1 when none was (every
  episode ``endpoint_failed`` or ``infra_failed``: nothing measured the agent), with a line saying so;
  3 when an extra is missing (:mod:`ait_env.extras`).
"""

from ait_env.agents.llm.batch import ResumeMismatch, family_list, run
from ait_env.agents.llm.client import AgentSettings, EndpointFailed, read_reply, redactor, served_model
from ait_env.agents.llm.episode import KEPT, EpisodeRecord, play_episode, transcript, transcript_markdown
from ait_env.agents.llm.results import chart, chart_figure, markdown, results_title, summarize

__all__ = ["KEPT", "AgentSettings", "EndpointFailed", "EpisodeRecord", "ResumeMismatch", "chart", "chart_figure",
           "family_list", "markdown", "play_episode", "read_reply", "redactor", "results_title", "run",
           "served_model", "summarize", "transcript", "transcript_markdown"]
