"""Evaluation and data: the evaluation command, validation, the benchmark's video protocol, teachers and trajectory
labelling."""
