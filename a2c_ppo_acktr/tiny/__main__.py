"""``python -m a2c_ppo_acktr.tiny``: build a tiny model (:func:`a2c_ppo_acktr.tiny.cli.main`)."""

import sys

from a2c_ppo_acktr.config.cli import run_main
from a2c_ppo_acktr.tiny.cli import main

sys.exit(run_main(main, "python -m a2c_ppo_acktr.tiny"))
