"""VSI-PPO: PPO for vision-language agents on VSI-Bench-style questions and gym-cards games.

Sub-packages, lowest layer first (the import rule is in docs/CONTRACTS.md): ``common`` (names,
errors, files, statistics, the scorer, the prompt format), ``config`` (the run config and its
command line), ``run`` (run directories, checkpoints, processes, metrics), ``envs``, ``policy`` (models
and the policy), ``algo`` and ``rl`` (the PPO update and the training loop), ``eval`` and ``reports``
(evaluation, teachers, labelling, reports). The tiny models' build (``tiny``) and the command-line
tools (``python -m a2c_ppo_acktr.<tool>``) sit at the top.
"""
