"""Validate rl.toml files with prime-rl's own config loader (run it with the python of a venv that has
``prime-rl-configs`` from prime-rl v0.7.0 installed; it does not import this project).

    python primerl_validate.py validate A.toml B.toml ...   -> one JSON line per file: {"path", "ok", "error"}
    python primerl_validate.py facts                        -> one JSON object: defaults/fields/maps of v0.7.0

Used by tests/jobs/test_primerl.py when AIT_PRIMERL_CONFIGS_PYTHON points at such a python.
"""

from __future__ import annotations

import json
import sys
import warnings


def validate(paths: list[str]) -> None:
    from pydantic_config import cli
    from prime_rl.configs.rl import RLConfig

    for path in paths:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cfg = cli(RLConfig, args=["@", path])
            resolved = {
                "trainer.output_dir": str(cfg.trainer.output_dir),
                "trainer.ckpt.weights": cfg.trainer.ckpt is not None and cfg.trainer.ckpt.weights is not None,
                "trainer.ckpt.weights_only": cfg.trainer.ckpt.weights_only if cfg.trainer.ckpt else None,
                "orchestrator.renderer.name": cfg.orchestrator.renderer.name,
                "orchestrator.train.env.args": [e.args for e in cfg.orchestrator.train.env],
                "orchestrator.train.env.id": [e.id for e in cfg.orchestrator.train.env],
                "trainer.max_steps": cfg.trainer.max_steps,
                "orchestrator.seq_len": cfg.orchestrator.seq_len,
                "trainer.model.seq_len": cfg.trainer.model.seq_len,
                "wandb": cfg.wandb is not None or cfg.trainer.wandb is not None,
                "inference.model.name": cfg.inference.model.name if cfg.inference else None,
            }
            print(json.dumps({"path": path, "ok": True, "error": "", "resolved": resolved}), flush=True)
        except BaseException as exc:  # noqa: BLE001 - cli() may SystemExit on parse errors
            error = f"{type(exc).__name__}: {exc}"
            print(json.dumps({"path": path, "ok": False, "error": error}), flush=True)


def facts() -> None:
    import typing

    from renderers.base import MODEL_RENDERER_MAP
    from prime_rl.configs import algorithm, orchestrator, trainer

    def defaults(cls) -> dict:
        return {n: f.default for n, f in cls.model_fields.items()}

    def union_tags(alias) -> list[str]:
        args = typing.get_args(typing.get_args(alias)[0])
        return sorted(a.model_fields["type"].default for a in args)

    temp = orchestrator.TrainSamplingConfig.model_fields["temperature"]
    ge = [m.ge for m in temp.metadata if hasattr(m, "ge")]
    le = [m.le for m in temp.metadata if hasattr(m, "le")]
    out = {
        "renderer_map": dict(MODEL_RENDERER_MAP),
        "optim": {c.model_fields["type"].default: defaults(c) for c in
                  (trainer.AdamWConfig, trainer.MuonConfig, trainer.SGDConfig, trainer.SignSGDConfig)},
        "scheduler": {c.model_fields["type"].default: defaults(c) for c in
                      (trainer.ConstantSchedulerConfig, trainer.LinearSchedulerConfig,
                       trainer.CosineSchedulerConfig)},
        "loss": {c.model_fields["type"].default: defaults(c) for c in
                 (trainer.DefaultLossConfig, trainer.IPOLossConfig)},
        "algo_types": union_tags(algorithm.AlgoConfig),
        "temperature": {"default": temp.default, "ge": ge[0] if ge else None, "le": le[0] if le else None},
        "orchestrator_fields": sorted(orchestrator.OrchestratorConfig.model_fields),
        "trainer_ckpt": defaults(trainer.CheckpointConfig) | {"weights": None},
    }
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    if sys.argv[1:2] == ["facts"]:
        facts()
    elif sys.argv[1:2] == ["validate"]:
        validate(sys.argv[2:])
    else:
        sys.exit(__doc__)
