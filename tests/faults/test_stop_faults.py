"""Stop pressed at awkward moments."""

from __future__ import annotations

from pathlib import Path

from ddp_engine.common.run_dir import read_status
from tests.conftest import processes_mentioning, run_engine
from tests.faults.conftest import fault_case


@fault_case("Stop pressed during start-up (before the process group is up), twice in a row, "
            "then again after the run has ended",
            "no error; the run ends stopped with no process left; later presses and "
            "`ddp_engine stop` say it already ended")
def test_stop_during_start_up_twice_and_after_the_end(qtbot, open_window, tmp_path: Path,
                                                      observed: list[str]) -> None:
    w = open_window(tmp_path / "runs")
    w.panel.max_steps.setValue(100_000)
    with qtbot.waitSignal(w.controller.finished, timeout=120_000) as sig:
        run_dir = w.start_run()
        assert w.controller.state == "starting"
        w.controller.stop()
        w.controller.stop()  # the second press while the first is under way: nothing new
        w.stop_action.trigger()
    result = sig.args[0]
    assert result["state"] == "stopped" and result["leftover_pids"] == []
    assert not processes_mentioning(str(run_dir))
    w.controller.stop()  # after the end: nothing to do, no error
    assert w.controller.state == "stopped" and not w.stop_action.isEnabled()
    late = run_engine("stop", str(run_dir))
    assert late.returncode == 0 and late.stdout.strip() == "run already ended: stopped"
    observed.append(f"ended {result['state']} at step {result.get('step')} "
                    f"({read_status(run_dir).get('reason')}); 0 processes left; "
                    f"`ddp_engine stop` afterwards: {late.stdout.strip()!r}")
