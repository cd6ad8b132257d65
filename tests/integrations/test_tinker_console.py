"""The Tinker outer loop's compact console: a line per step, evaluation and logged trajectory group,
no colour codes off a terminal, every detail still in the run's logs.log."""

from __future__ import annotations

import io
import logging

import pytest

pytest.importorskip("tinker_cookbook", reason="install the outer-loop extra: pip install -e '.[tinker]'")
from tinker_cookbook.utils import ml_log  # noqa: E402

from ait_env.integrations import tinker_console as tc  # noqa: E402

STEP = {"step": 0, "env/all/total_episodes": 8, "env/all/ait/reward": 0.5994,
        "env/all/ait/status/scored": 0.875, "env/all/ait/status/invalid": 0.125,
        "env/all/ait/status/job_failed": 0.0,
        "env/all/ait/validated": 0.875, "env/all/ait/uplift": 0.1589, "env/all/ait/llm_usd": 0.00054,
        "time/total": 0.1}
EVAL = {"step": 2, "test/env/train/total_episodes": 10, "test/env/train/ait/reward": 0.381,
        "test/env/train/ait/status/scored": 0.6, "test/env/train/ait/status/invalid": 0.4,
        "test/env/heldout/total_episodes": 2, "test/env/heldout/ait/reward": 0.214,
        "test/env/heldout/ait/status/scored": 0.5, "test/env/heldout/ait/status/invalid": 0.5,
        "test/env/triage/total_episodes": 2}
DUMP = ("\n====== Trajectory Group ======\n****** trajectory idx=0, reward=0 ******\nTrajectory metrics:\n"
        "  ait/reward: 0.0\n  ait/status/scored: 0.0\n  ait/status/invalid: 1.0\n---- datum ----\n"
        "<|im_start|>system\nYou are an ML engineer ...\n" + "a whole environment file\n" * 500 +
        "****** trajectory idx=1, reward=0.907 ******\nTrajectory metrics:\n  ait/status/scored: 1.0\n"
        "  ait/status/invalid: 0.0\n---- datum ----\n...\n====== End Trajectory Group ======")


def test_a_step_an_evaluation_and_a_group_each_take_one_line() -> None:
    assert tc.step_line(STEP, 0, elapsed=12.4) == (
        "step 0: 8 episodes, reward 0.599 (scored 7, invalid 1), validated 88%, uplift +0.159, "
        "LLM $0.0005/episode, 12s elapsed")
    assert tc.eval_line(EVAL, 2) == (
        "eval at step 2: training families 10 episodes, reward 0.381 (scored 6, invalid 4); "
        "held-out family 2 episodes, reward 0.214 (scored 1, invalid 1)")
    assert tc.group_line(DUMP) == ("trajectory group of 2: rewards 0.000 invalid, 0.907 scored "
                                   "(transcripts in logs.log)")
    assert tc.group_line("====== Trajectory Group ====== (another layout)").startswith("trajectory group")


def _record(msg: str, level: int = logging.INFO, name: str = "tinker_cookbook.rl.train") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


def test_the_console_formatter_colours_only_a_terminal_and_shortens_the_dump() -> None:
    plain, coloured = tc.ConsoleFormatter(colour=False), tc.ConsoleFormatter(colour=True)
    assert plain.format(_record("Will train on 2 batches")) == "Will train on 2 batches"
    assert plain.format(_record("disk nearly full", logging.WARNING)) == "[WARNING] disk nearly full"
    assert "\x1b[" in coloured.format(_record("disk nearly full", logging.WARNING))
    assert plain.format(_record(DUMP)).count("\n") == 0
    assert not tc._not_chatter(_record("[training_loop] Terminated"))
    assert not tc._not_chatter(_record("Wrote metrics to /x/metrics.jsonl"))
    assert tc._not_chatter(_record("[training_loop] Step 1: Will train on batch, num groups: 2"))
    assert tc._not_chatter(_record("[training_loop] Terminated", logging.WARNING))


def test_within_compact_console_the_file_keeps_the_dump_and_the_console_gets_one_line(tmp_path,
                                                                                     monkeypatch) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        with tc.compact_console():
            assert ml_log.PrettyPrintLogger is tc.CompactMetricsLogger
            ml_log.configure_logging_module(str(tmp_path / "logs.log"))
            logging.getLogger("tinker_cookbook.rl.train").info(DUMP)
            ml_log.PrettyPrintLogger().log_metrics(STEP, step=0)
            ml_log.PrettyPrintLogger().log_hparams({"learning_rate": 4e-5})  # config.json has it
        assert ml_log.PrettyPrintLogger is not tc.CompactMetricsLogger  # restored
        for h in root.handlers:
            h.flush()
        console = stderr.getvalue().splitlines()
        assert console[0].startswith("trajectory group of 2: rewards 0.000 invalid")
        assert console[1].startswith("step 0: 8 episodes, reward 0.599") and len(console) == 2
        assert "\x1b" not in stderr.getvalue()
        saved_log = (tmp_path / "logs.log").read_text()
        assert "a whole environment file" in saved_log and "command line:" in saved_log
    finally:
        for h in root.handlers[:]:
            root.removeHandler(h)
            h.close()
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])


def test_a_dry_runs_lines_say_so_and_show_no_llm_cost() -> None:
    line = tc.step_line(STEP, 0, elapsed=12.4, dry_run=True)
    assert line.startswith("DRY RUN step 0: 8 episodes") and "LLM" not in line and "$" not in line
    assert tc.eval_line(EVAL, 2, dry_run=True).startswith("DRY RUN eval at step 2: ")
    with tc.compact_console(dry_run=True):
        assert ml_log.PrettyPrintLogger is tc.DryRunMetricsLogger
    with tc.compact_console():
        assert ml_log.PrettyPrintLogger is tc.CompactMetricsLogger


def test_a_fresh_runs_no_checkpoint_message_stays_off_the_console() -> None:
    assert not tc._not_chatter(_record("No checkpoints found at /tmp/x/checkpoints.jsonl",
                                       name="tinker_cookbook.checkpoint_utils"))
    assert tc._not_chatter(_record("Resuming from checkpoint ...", name="tinker_cookbook.checkpoint_utils"))
