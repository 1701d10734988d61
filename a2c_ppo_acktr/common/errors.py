"""The marker of errors a user fixes: a setting, a file, a checkpoint, a server.

An entry script (:func:`a2c_ppo_acktr.config.cli.run_main`) prints such an error's message as one line,
``prog: error: ...``, and exits 2, instead of a traceback. Each module's own error class inherits
:class:`UserError` beside its usual base (``ValueError``, ``RuntimeError``), so the command line
needs to import none of them.
"""

from __future__ import annotations


class UserError(Exception):
    """An error whose message tells the user what to change."""
