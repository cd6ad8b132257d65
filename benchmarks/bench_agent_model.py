"""What a real agent model costs on this machine: sampling through its endpoint and a behaviour-cloning step.

    python benchmarks/bench_agent_model.py [--model smollm2-135m] [--threads 2] [--prompt 1600] [--tokens 96]

Prints, for the agent model (:mod:`ait_env.agent_models`), measured in one run so that the figures compare:

- load: seconds to load the cached model into the project's engine;
- sampling: generated tokens per second through :class:`ait_env.agent_models.serve.AgentEndpoint` with 1, 4 and
  8 concurrent conversations (a ``--prompt``-token opening, ``--tokens`` tokens each, temperature 0.7), and the
  speed-up of batching as a ratio to one conversation;
- a second turn: seconds for the next turn of the same conversations (the endpoint reuses the first turn's
  keys/values: only the new tokens are prefilled);
- attention when decoding: one layer's attention for 6 rows over a ``--width``-token context, the grouped-query
  heads computed without copies (``enable_gqa``, what the engine does) against keys/values repeated per query
  head (``repeat_interleave``, what it did before 2026-12-05), as a ratio;
- training: seconds per behaviour-cloning step on one conversation of ``--prompt`` + ``--tokens`` trained
  tokens, with every layer trained and with the top 16 of 30, as a ratio.

The machine's load is printed with the figures (``os.getloadavg``): other work on the cores slows every figure.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=1600)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--width", type=int, default=4500, help="context tokens for the attention figure")
    args = ap.parse_args()
    import torch
    from openai import OpenAI

    from ait_env.agent_models.load import load_agent
    from ait_env.agent_models.serve import AgentEndpoint
    from ait_env.agent_models.sft import Encoded, SFTSettings, behaviour_clone

    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.1f}, torch threads {args.threads}")
    t = time.perf_counter()
    agent = load_agent(args.model)
    print(f"load: {time.perf_counter() - t:.1f} s ({agent.name}, weights {agent.weights_hash})")
    filler = " ".join(f"word{i % 50}" for i in range(args.prompt))
    opening = agent.tok.decode(agent.tok.encode(filler)[:args.prompt - 20])

    def conversation(k: int) -> list[dict[str, str]]:
        return [{"role": "system", "content": f"Conversation {k}. " + opening},
                {"role": "user", "content": "Write a long answer."}]

    with AgentEndpoint(agent) as ep:
        client = OpenAI(base_url=ep.base_url, api_key="none", timeout=3600)

        def turn(msgs: list[dict[str, str]]) -> str:
            r = client.chat.completions.create(model=ep.model_name, messages=msgs, temperature=0.7,
                                               max_tokens=args.tokens)
            return r.choices[0].message.content or ""

        base = None
        for n in (1, 4, 8):
            convs = [conversation(100 * n + k) for k in range(n)]
            t = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                replies = list(pool.map(turn, convs))
            dt = time.perf_counter() - t
            made = sum(len(agent.tok.encode(x)) for x in replies)
            rate = made / dt
            base = base or rate
            print(f"sampling, {n} conversation(s): {made} tokens in {dt:.1f} s = {rate:.1f} tokens/s "
                  f"({rate / base:.2f}x one conversation; prompts of ~{args.prompt} tokens prefilled)")
            if n == 4:
                nxt = [c + [{"role": "assistant", "content": r}, {"role": "user", "content": "Go on."}]
                       for c, r in zip(convs, replies)]
                t = time.perf_counter()
                with ThreadPoolExecutor(n) as pool:
                    list(pool.map(turn, nxt))
                print(f"second turn, 4 conversations: {time.perf_counter() - t:.1f} s (first turn {dt:.1f} s: the "
                      f"first turn's keys/values are reused, hits {ep.prefix_store.hits})")
    attention(agent.model.cfg, args.width)
    ids = agent.tok.encode(opening)[:args.prompt] + agent.tok.encode(filler)[:args.tokens]
    enc = Encoded(ids, [0] * (len(ids) - args.tokens) + [1] * args.tokens)
    times = {}
    for layers in (0, 16):
        logs, _ = behaviour_clone(agent, [enc] * 2, SFTSettings(lr=1e-9, epochs=1.0, batch=1, warmup_steps=0,
                                                                train_layers=layers))
        times[layers] = logs[-1].seconds
        print(f"training step, {len(ids)} tokens ({args.tokens} trained), "
              f"{'every layer' if not layers else f'top {layers} layers'}: {logs[-1].seconds:.1f} s")
    print(f"top 16 layers / every layer: {times[16] / times[0]:.2f}x the time")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


def attention(cfg: object, width: int, rows: int = 6, reps: int = 20) -> None:
    """One layer's decoding attention, grouped-query heads without copies vs repeated keys/values."""
    import torch
    import torch.nn.functional as F

    h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim  # type: ignore[attr-defined]
    q = torch.randn(rows, h, 1, d)
    k, v = torch.randn(rows, kv, width + 512, d)[:, :, :width], torch.randn(rows, kv, width + 512, d)[:, :, :width]
    mask = torch.ones(rows, 1, 1, width, dtype=torch.bool)

    def copies() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k.repeat_interleave(h // kv, 1), v.repeat_interleave(h // kv, 1),
                                              attn_mask=mask)

    def grouped() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    assert torch.allclose(copies(), grouped(), atol=1e-5)
    ms = {}
    for f in (copies, grouped):
        t = time.perf_counter()
        for _ in range(reps):
            f()
        ms[f.__name__] = (time.perf_counter() - t) / reps * 1000
    print(f"attention, {rows} rows x {width} tokens, one layer ({h} query / {kv} key-value heads): grouped "
          f"{ms['grouped']:.1f} ms, repeated keys/values {ms['copies']:.1f} ms ({ms['copies'] / ms['grouped']:.1f}x)")


if __name__ == "__main__":
    main()
