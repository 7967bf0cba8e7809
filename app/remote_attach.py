"""Attaching the window to a run whose rank 0 is on another machine, through its forwarded
telemetry port and its token (the toolbar's "Attach to remote rank 0...")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.dialogs import RemoteAttachDialog, warn
from app.run_model import remote_refusal
from ddp_engine.common.protocol import check_address

if TYPE_CHECKING:
    from app.main_window import MainWindow

ATTACH_CHECK_S = 4.0


def show_dialog(window: MainWindow) -> RemoteAttachDialog:
    """Ask for a remote rank 0's host, port and token (not modal-blocking: open())."""
    dialog = RemoteAttachDialog(window)
    dialog.accepted.connect(lambda: attach(window, *dialog.values()))
    window.attach_dialog = dialog
    dialog.open()
    return dialog


def attach(window: MainWindow, host: str, port: int, token: str) -> bool:
    """Watch (and make Stop work on) a run whose rank 0 is on another machine, through
    ``host:port`` (its forwarded ``--monitor-port``) and its monitor.json's ``token``.
    The address and the token are tried first (a few seconds at most); only when rank 0
    welcomes the window does it leave the run it is watching (training on). False, with
    the reason in the status bar (and a message box when the connection failed), for bad
    input, a connection that fails, or while a Stop is under way."""
    host, token = host.strip(), token.strip()
    try:
        check_address(host, port, token)
    except ValueError as e:
        window.message_label.setText(f"not attached: {e}")
        return False
    refused = remote_refusal(host, port, token, ATTACH_CHECK_S)
    if refused is not None:
        window.message_label.setText(f"not attached: {refused[0]}")
        window.attach_failed_box = warn(window, "Not attached", refused[1])
        return False
    if not window._leave_current():
        return False
    window.dashboard.reset()
    window.controller.attach_remote(host, port, token)
    window._viewing(None, title=f"{host}:{port}")
    return True
