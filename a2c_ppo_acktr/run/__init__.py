"""Processes and files of a run: run directories, checkpoint files, distributed set-up, metrics logging and preemption
signals."""
