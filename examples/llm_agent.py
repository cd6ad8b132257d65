"""An LLM plays AIT/JobWriting-v0 through any OpenAI-compatible chat endpoint, top to bottom.

    python examples/llm_agent.py --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B [--family units]

The env's six tools go to the endpoint as OpenAI function tools; each returned tool call becomes the
env's text action (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), and the conversation
sent back is the env's own ``info["messages"]``. The full benchmark (many episodes, concurrency,
retries, a text-only fallback, costs, a results table) is ``python -m ait_env.agents.llm``.
"""

from __future__ import annotations

import argparse
import json
import os

import gymnasium as gym
from ait_env.extras import missing_extras_exit

with missing_extras_exit("examples/llm_agent.py", active=__name__ == "__main__"):  # one line, exit 3
    from openai import OpenAI

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.episode.spec import strip_tool_sections

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--base-url", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--family", default="arithmetic")
ap.add_argument("--backend", default="stub", help="stub: instant surrogate scores; local: real training")
ap.add_argument("--episodes", type=int, default=1)
ap.add_argument("--runs-dir", default="runs/examples")
args = ap.parse_args()

client = OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=6)
env = gym.make("AIT/JobWriting-v0", family=args.family, backend=args.backend,
               overrides={"env": {"runs_dir": args.runs_dir}})

for episode in range(args.episodes):
    obs, info = env.reset(seed=episode)
    done, reward = False, 0.0
    while not done:
        # 1. the conversation so far, as the env keeps it; the tools are declared natively
        messages = [dict(m) for m in info["messages"]]
        messages[0]["content"] = strip_tool_sections(messages[0]["content"])
        reply = client.chat.completions.create(model=args.model, messages=messages, tools=info["tools"],
                                               temperature=0.7, max_tokens=4096).choices[0].message
        # 2. the reply as the env's action: prose plus one <tool_call> block per call
        action = reply.content or ""
        for call in reply.tool_calls or []:
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except ValueError:
                arguments = call.function.arguments  # the env explains what is wrong with it
            action += "<tool_call>" + json.dumps({"name": call.function.name, "arguments": arguments}) + "</tool_call>"
        # 3. one env step: tools run, submit_job validates, trains and scores the job
        obs, reward, terminated, truncated, info = env.step(action)
        print(f"turn {info['turn']}: {[c.function.name for c in reply.tool_calls or []]} -> {obs[:100]!r}")
        done = terminated or truncated
    r = info["reward"]
    print(f"episode {episode}: status={r['status']} reward={r['total']} post={r['post']} uplift={r['uplift']}")
env.close()
