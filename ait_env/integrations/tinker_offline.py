"""Offline stand-ins for the Tinker outer loop: no key, no network, no HF hub (tests and ``dry_run=true``).

- :func:`build_local_tokenizer` trains a small byte-level BPE on the project's own text and wraps it
  as an HF ``PreTrainedTokenizerFast`` with the Qwen chat tokens (``<|im_start|>``, ``<|im_end|>``,
  ``<tool_call>``, ``<think>``, ...) as single added tokens; :func:`register_local_tokenizer` makes
  the cookbook's ``get_tokenizer(model_name)`` return it, so every Qwen renderer works offline.
  Its token counts are *not* Qwen's.
- :class:`ScriptedPolicy` is a cookbook ``TokenCompleter`` that plays scripted agent turns: it reads
  the conversation from the prompt tokens, picks the next assistant message of one of several plans
  (:data:`PLANS`; the plan is chosen round-robin on an episode's first turn and written into that
  turn as ``[plan NAME]`` so later turns find it in the history), and returns the tokens the
  renderer would produce for that message. Renderer-independent for the Qwen family (it counts
  ``<|im_start|>assistant`` headers to know the turn).
- :func:`offline_service_client` returns a class with the methods of ``tinker.ServiceClient`` that
  ``tinker_cookbook.rl.train.main`` calls: sampling is the scripted policy, ``forward_backward``
  returns the sampler's logprobs (so the KL diagnostics are 0) and ``optim_step`` changes nothing.
  **Nothing learns**: it exercises the whole loop (async off-policy scheduling, checkpoints and
  resume, evaluations, metrics) without the service.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import tinker
from tinker_cookbook import renderers
from tinker_cookbook.completers import StopCondition, TokenCompleter, TokensWithLogprobs
from tinker_cookbook.renderers.base import RenderContext, ToolCall
from tinker_cookbook.tokenizer_utils import register_tokenizer

from ait_env.agents.reference import lr_sweep, with_steps
from task_families import reference_files

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]


def _corpus() -> list[str]:
    from ait_env.episode.spec import system_prompt
    from task_families import FAMILY_NAMES

    texts = [system_prompt(30, 3)]
    for fam in FAMILY_NAMES:
        texts.extend(reference_files(fam, "Qwen/Qwen3-1.7B").values())
    return texts


def build_local_tokenizer(out_dir: str | Path, vocab_size: int = 2000) -> Path:
    """Train and save (``save_pretrained``) a byte-level BPE with the Qwen chat tokens; returns the dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    if (out / "tokenizer.json").is_file():
        return out
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=QWEN_SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    tok.add_tokens(QWEN_ADDED)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    return out


def register_local_tokenizer(model_name: str, tokenizer_dir: str | Path) -> None:
    """Make ``get_tokenizer(model_name)`` return the local tokenizer (loaded once)."""
    from transformers import PreTrainedTokenizerFast

    @lru_cache(maxsize=1)
    def factory() -> Any:
        return PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))

    register_tokenizer(model_name, factory)


# --------------------------------------------------------------------------- scripted agent plans
def _call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(function=ToolCall.FunctionBody(name=name, arguments=json.dumps(arguments)))


@dataclass
class PlanContext:
    """What a plan can read from the conversation so far."""

    turn: int
    text: str                       # the decoded prompt

    @property
    def family(self) -> str:
        m = re.search(r'family = \\?"(\w+)\\?"', self.text)
        return m.group(1) if m else "arithmetic"

    @property
    def backend(self) -> str | None:
        m = re.search(r"available on the `([\w-]+)` backend", self.text)
        return m.group(1) if m else None

    def model(self, role: str) -> str:
        m = re.search(r"- `([^`]+)` \(" + role, self.text)
        if m:
            return m.group(1)
        found = re.findall(r"- `([^`]+)` \(", self.text)
        return found[-1] if found else "CHOOSE-A-BASE-MODEL"


def _job_files(ctx: PlanContext, variant: str) -> dict[str, str]:
    fam = ctx.family
    if variant == "template":
        from task_families import get_family

        files = reference_files(fam, ctx.model("small"), ctx.backend)
        tmpl = (get_family(fam).template_dir / "job.toml").read_text(encoding="utf-8")
        files["job.toml"] = tmpl.replace("CHOOSE-A-BASE-MODEL", ctx.model("small"))
        return files
    files = reference_files(fam, ctx.model("larger"), ctx.backend)
    if variant == "collapse":
        files["job.toml"] = re.sub(r"(?m)^lr = .*$", "lr = 5e-4", files["job.toml"], count=1)
    elif variant == "invalid":
        files["job.toml"] = re.sub(r"(?m)^batch_size = .*$", "batch_size = 100", files["job.toml"], count=1)
    elif variant == "infra":
        files["job.toml"] = files["job.toml"].replace("[env]", "[env]\nsimulate_infra_failure = true", 1)
    elif variant.startswith("research"):  # the first, short job of a research plan
        files["job.toml"] = with_steps(files["job.toml"], 5)
    return files


def _research_turn(variant: str, ctx: PlanContext) -> renderers.Message:
    """Turns 4 and later of a research plan (its first job was submitted at turn 3): the reference's
    job.toml (``research``) or one a test backend fails on (``research_infra``), submit, then finish."""
    if ctx.turn == 4:
        files = reference_files(ctx.family, ctx.model("larger"), ctx.backend)
        if variant == "research_infra":
            files = _job_files(ctx, "infra")
        return renderers.Message(role="assistant", content="The curve still rose: the longer job.",
                                 tool_calls=[_call("write_file", path="job.toml", content=files["job.toml"])])
    if ctx.turn == 5:
        return renderers.Message(role="assistant", content="", tool_calls=[_call("submit_job")])
    return renderers.Message(role="assistant", content="", tool_calls=[_call("finish")])


def _batch_turn(variant: str, ctx: PlanContext) -> renderers.Message:
    """Turns 2 and later of a batch plan: write an lr sweep of the reference job (three folders,
    :func:`ait_env.agents.reference.lr_sweep`), run it at once (``submit_jobs``), then ``finish``
    (``research_batch``) or a turn that never ends its message (``research_parse``: the renderer cannot
    parse it, see :class:`ScriptedPolicy`)."""
    sweep = lr_sweep(reference_files(ctx.family, ctx.model("larger"), ctx.backend))
    if ctx.turn == 2:
        return renderers.Message(role="assistant", content="An lr sweep, three jobs at once.",
                                 tool_calls=[_call("write_file", path=k, content=v) for k, v in sweep.items()])
    if ctx.turn == 3:
        folders = sorted({p.split("/")[0] for p in sweep})
        return renderers.Message(role="assistant", content="", tool_calls=[_call("submit_jobs", folders=folders)])
    if variant == "research_parse":
        return renderers.Message(role="assistant", content="The best of the sweep is")
    return renderers.Message(role="assistant", content="", tool_calls=[_call("finish")])


def plan_turn(variant: str, ctx: PlanContext) -> renderers.Message:
    """The assistant message of plan ``variant`` at ``ctx.turn``. Plans: ``reference`` (the reference
    job, larger model), ``template`` (the template's [prime_rl] untouched, small model), ``collapse``
    (reference with a diverging learning rate), ``invalid`` (batch not divisible by the group size,
    resubmitted until the attempts run out), ``infra`` (a marker a test backend fails on); for research
    episodes (``env.max_jobs_per_episode >= 2``) ``research`` (a 5-step reference job, then the reference
    job, then ``finish``), ``research_infra`` (its second job carries the ``infra`` marker), ``research_batch``
    (an lr sweep of three jobs in one ``submit_jobs``, then ``finish``) and ``research_parse`` (the same sweep,
    then a turn that never ends: a parse failure after jobs ran)."""
    if ctx.turn == 0:
        return renderers.Message(role="assistant", content=f"[plan {variant}] Reading the job skeleton first.",
                                 tool_calls=[_call("read_file", path="job.toml")])
    if ctx.turn == 1:
        return renderers.Message(role="assistant", content="", tool_calls=[_call("get_baseline_scores")])
    if variant in ("research_batch", "research_parse"):
        return _batch_turn(variant, ctx)
    if ctx.turn == 2:
        files = _job_files(ctx, variant)
        return renderers.Message(role="assistant", content="Writing the job.",
                                 tool_calls=[_call("write_file", path=k, content=v) for k, v in files.items()])
    if variant.startswith("research") and ctx.turn >= 4:
        return _research_turn(variant, ctx)
    return renderers.Message(role="assistant", content="", tool_calls=[_call("submit_job")])


PLANS = ("reference", "template", "collapse", "invalid")


class ScriptedPolicy(TokenCompleter):
    """A ``TokenCompleter`` that plays :func:`plan_turn` (see the module docstring)."""

    def __init__(self, renderer: renderers.Renderer, plans: Sequence[str] = PLANS, logprob: float = -0.5) -> None:
        self.renderer = renderer
        self.tokenizer = renderer.tokenizer
        self.plans = list(plans)
        self.logprob = logprob
        self.calls = 0
        self._next = 0

    def message_tokens(self, message: renderers.Message) -> list[int]:
        """The tokens the renderer writes for ``message`` as the turn being generated."""
        rendered = self.renderer.render_message(message, RenderContext(idx=2, is_last=True))
        return [t for chunk in rendered.output for t in chunk.tokens]  # type: ignore[union-attr]

    async def __call__(self, model_input: tinker.ModelInput, stop: StopCondition, *,
                       max_tokens: int | None = None) -> TokensWithLogprobs:
        self.calls += 1
        text = self.tokenizer.decode(model_input.to_ints())
        turn = max(0, text.count("<|im_start|>assistant") - 1)
        if turn == 0:
            variant = self.plans[self._next % len(self.plans)]
            self._next += 1
        else:
            m = re.search(r"\[plan (\w+)\]", text)
            variant = m.group(1) if m else self.plans[0]
        tokens = self.message_tokens(plan_turn(variant, PlanContext(turn=turn, text=text)))
        if variant == "research_parse" and turn >= 4:  # a turn without its end-of-message token
            tokens = tokens[:-1]
        reason: tinker.StopReason = "stop"
        if max_tokens is not None and len(tokens) > max_tokens:
            tokens, reason = tokens[:max_tokens], "length"
        return TokensWithLogprobs(tokens=tokens, maybe_logprobs=[self.logprob] * len(tokens), stop_reason=reason)


# --------------------------------------------------------------------------- offline service
class _Done:
    def __init__(self, value: Any) -> None:
        self._value = value

    async def result_async(self) -> Any:
        return self._value

    def result(self) -> Any:
        return self._value


@dataclass
class OfflineRecord:
    """What an offline run did (for tests): client creations and optimizer steps."""

    created: list[tuple[str, str]] = field(default_factory=list)   # (method, model or checkpoint path)
    optim_steps: int = 0
    forward_backward_data: list[int] = field(default_factory=list)
    fail_after_steps: int | None = None


class OfflineSamplingClient:
    def __init__(self, policy: TokenCompleter) -> None:
        self.policy = policy

    async def sample_async(self, prompt: tinker.ModelInput, num_samples: int,
                           sampling_params: tinker.SamplingParams, **_: Any) -> tinker.SampleResponse:
        seqs = []
        for _i in range(num_samples):
            out = await self.policy(prompt, sampling_params.stop or [], max_tokens=sampling_params.max_tokens)
            seqs.append(tinker.SampledSequence(stop_reason=out.stop_reason, sequence_id=uuid.uuid4().hex,
                                               _tokens_list=list(out.tokens), _logprobs_list=list(out.logprobs)))
        return tinker.SampleResponse(sequences=seqs)


class OfflineTrainingClient:
    def __init__(self, policy: TokenCompleter, record: OfflineRecord, run: str) -> None:
        self.policy = policy
        self.record = record
        self.run = run

    async def forward_backward_async(self, data: list[tinker.Datum], loss_fn: str, loss_fn_config: Any = None,
                                     **_: Any) -> _Done:
        self.record.forward_backward_data.append(len(data))
        outs = [{"logprobs": d.loss_fn_inputs["logprobs"]} for d in data]
        return _Done(tinker.ForwardBackwardOutput(loss_fn_output_type=str(loss_fn), loss_fn_outputs=outs, metrics={}))

    async def optim_step_async(self, adam_params: tinker.AdamParams, **_: Any) -> _Done:
        fail = self.record.fail_after_steps
        if fail is not None and self.record.optim_steps >= fail:
            raise RuntimeError(f"offline service: simulated crash after {fail} optimizer steps")
        self.record.optim_steps += 1
        return _Done(tinker.OptimStepResponse(metrics=None))

    async def save_state_async(self, name: str, ttl_seconds: int | None = None, **_: Any) -> _Done:
        return _Done(SimpleNamespace(path=f"tinker://offline/{self.run}/state/{name}"))

    async def save_weights_for_sampler_async(self, name: str, ttl_seconds: int | None = None, **_: Any) -> _Done:
        return _Done(SimpleNamespace(path=f"tinker://offline/{self.run}/sampler/{name}"))

    def create_sampling_client(self, model_path: str, **_: Any) -> OfflineSamplingClient:
        return OfflineSamplingClient(self.policy)

    async def save_weights_and_get_sampling_client_async(self, name: str | None = None,
                                                         **_: Any) -> OfflineSamplingClient:
        return OfflineSamplingClient(self.policy)


def offline_service_client(policy_factory: Callable[[], TokenCompleter], record: OfflineRecord) -> type:
    """A drop-in for ``tinker.ServiceClient`` (patch it in for ``train.main``); see the module docstring."""

    class OfflineServiceClient:
        def __init__(self, base_url: str | None = None, **_: Any) -> None:
            self.run = uuid.uuid4().hex[:8]

        def _client(self, how: str, what: str) -> OfflineTrainingClient:
            record.created.append((how, what))
            return OfflineTrainingClient(policy_factory(), record, self.run)

        async def create_lora_training_client_async(self, base_model: str, rank: int = 32, **_: Any) -> Any:
            return self._client("lora", base_model)

        async def create_training_client_from_state_async(self, path: str, **_: Any) -> Any:
            return self._client("weights", path)

        async def create_training_client_from_state_with_optimizer_async(self, path: str, **_: Any) -> Any:
            return self._client("resume", path)

        def create_sampling_client(self, base_model: str | None = None, model_path: str | None = None,
                                   **_: Any) -> OfflineSamplingClient:
            return OfflineSamplingClient(policy_factory())

        def create_rest_client(self) -> Any:
            async def get_run(path: str) -> Any:
                return SimpleNamespace(user_metadata={})

            async def delete(path: str) -> None:
                return None

            return SimpleNamespace(get_training_run_by_tinker_path_async=get_run,
                                   get_training_run_by_tinker_path=lambda p: SimpleNamespace(user_metadata={}),
                                   delete_checkpoint_from_tinker_path_async=delete)

    return OfflineServiceClient
