"""Settings: the Hydra config groups under ``conf/`` (shipped in the wheel as ``ait_env.conf``),
loaded with or without Hydra.

Groups: ``env`` (turn limit, attempts, quotas, ledger), ``family`` (one family or ``train`` = sample
among the families not marked ``held_out``), ``reward`` (weights), ``backend`` (catalog, bounds).

- Without Hydra: ``compose(family="arithmetic", backend="stub", overrides=["env.max_turns=10"])``;
  this is what ``gym.make("AIT/JobWriting-v0", family=..., backend=...)`` does.
- From a Hydra script: ``settings_from_cfg(cfg)`` on the composed ``DictConfig``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, Field, ValidationError

from ait_env.conf import ConfigError, conf_dir, default_runs_dir, load_group
from ait_env.jobs.settings import BackendSettings
from ait_env.observe.ledger import LedgerSettings
from ait_env.probe.dynamic import DynamicSettings
from ait_env.episode.reward import RewardSettings
from ait_env.sandbox.workspace import WorkspaceQuota


class EnvSettings(BaseModel):
    max_turns: int = Field(30, ge=2)
    max_attempts: int = Field(3, ge=1)
    #: jobs one episode may run; above 1 a research episode (results come back, a finish tool, see
    #: docs/env.md "Research episodes"); its USD budget is ledger.episode_budget_usd
    max_jobs_per_episode: int = Field(1, ge=1)
    max_action_chars: int = Field(100_000, ge=100)
    max_observation_chars: int = Field(200_000, ge=1000)
    #: where runs write (bundles, results, the ledger); None: the per-user ``<data_dir>/runs``
    #: (:func:`ait_env.conf.default_runs_dir`, ``$AIT_DATA_DIR``)
    runs_dir: str | None = None

    @property
    def runs_path(self) -> Path:
        """:attr:`runs_dir`, or the per-user default."""
        return Path(self.runs_dir).expanduser() if self.runs_dir else default_runs_dir()
    workspace: WorkspaceQuota = Field(default_factory=WorkspaceQuota)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    probe: DynamicSettings = Field(default_factory=DynamicSettings)


class FamilySettings(BaseModel):
    name: str = "train"
    held_out: bool = False
    #: whether ``family=train`` (or, with ``held_out``, the held-out evals) may draw the family; a family that
    #: is not is run only by name (``family=<name>``)
    sampled: bool = True
    difficulty: float | None = Field(None, ge=0.0, le=1.0)


class Settings(BaseModel):
    env: EnvSettings = Field(default_factory=EnvSettings)
    family: FamilySettings = Field(default_factory=FamilySettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    backend: BackendSettings


def family_settings(name: str) -> FamilySettings:
    """Settings of one concrete family (its ``held_out`` flag, difficulty)."""
    path = conf_dir() / "family" / f"{name}.yaml"
    if not path.is_file():
        return FamilySettings(name=name)
    return FamilySettings.model_validate(load_group("family", name))


def split_families(names: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(train, held_out) families among ``names`` by their config flags; a family with ``sampled: false`` is in
    neither (it runs only when named)."""
    settings = {n: family_settings(n) for n in names}
    train = [n for n in names if settings[n].sampled and not settings[n].held_out]
    held = [n for n in names if settings[n].sampled and settings[n].held_out]
    return train, held


def _validate(data: dict[str, Any]) -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid settings: {exc}") from None


def compose(*, env: str = "default", family: str = "train", reward: str = "default", backend: str = "stub",
            overrides: list[str] | dict[str, Any] | None = None) -> Settings:
    """Compose settings from the config groups plus overrides (dotlist strings or a nested dict)."""
    base = OmegaConf.create({
        "env": load_group("env", env),
        "family": load_group("family", family) if (conf_dir() / "family" / f"{family}.yaml").is_file()
        else {"name": family},
        "reward": load_group("reward", reward),
        "backend": load_group("backend", backend),
    })
    if overrides:
        extra = OmegaConf.from_dotlist(list(overrides)) if isinstance(overrides, list) \
            else OmegaConf.create(overrides)
        base = OmegaConf.merge(base, extra)
    return _validate(OmegaConf.to_container(base, resolve=True))  # type: ignore[arg-type]


def settings_from_cfg(cfg: DictConfig | dict[str, Any]) -> Settings:
    """Settings from a Hydra-composed config (extra top-level keys are ignored)."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    return _validate({k: data[k] for k in ("env", "family", "reward", "backend") if k in data})  # type: ignore[index]
