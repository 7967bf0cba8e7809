"""Run on another host (node 1's namespace): the app's remote attach, headless, as the toolbar's
"Attach to remote rank 0..." drives it (app/remote_attach.py): the address and a wrong token
tried first (remote_refusal), then the run controller attached with the right token; once two
reports have arrived, the window's Stop. Prints one JSON line: the refusal, the steps seen,
and the controller's final result.

    python -m tests.ddp_engine.launch.remote_viewer HOST PORT TOKEN
"""

from __future__ import annotations

import json
import sys

from PySide6.QtCore import QCoreApplication, QTimer

from app.run_controller import RunController
from app.run_model import remote_refusal

LIMIT_S = 150


def main() -> None:
    host, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    out: dict = {"refused": remote_refusal(host, port, token + "x", 10.0),
                 "taken": remote_refusal(host, port, token, 10.0), "steps": []}
    app = QCoreApplication([])
    controller = RunController()
    notices: list[str] = []
    controller.notice.connect(notices.append)

    def seen(batch: list[dict]) -> None:
        out["steps"] += [m["step"] for m in batch if m.get("type") == "metrics"]
        if len(out["steps"]) >= 2 and not controller.stop_requested:
            controller.stop()

    def finished(result: dict) -> None:
        out["finished"] = result
        app.quit()

    controller.welcomed.connect(lambda w: out.update(world_size=w.get("world_size")))
    controller.messages.connect(seen)
    controller.finished.connect(finished)
    controller.attach_remote(host, port, token)
    QTimer.singleShot(LIMIT_S * 1000, app.quit)
    app.exec()
    out["notices"] = notices
    if controller.client is not None:
        controller.client.request_stop()
        controller.client.wait(5000)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
