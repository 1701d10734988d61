"""Labelled trajectories for SFT: the teachers that write replies (``teachers.py``: the privileged
oracle, a Hugging Face model, an OpenAI-compatible server) and the labelling run that plays episodes
with them and writes ``trajectories.jsonl`` (``labeling.py``), which ``SFT/data.py`` turns into
samples. Evaluation reuses the teachers as agents."""
