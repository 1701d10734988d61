"""What every layer shares: names and choice lists, errors, atomic files, JSONL, statistics, the benchmark's scorer, env
ids and the one prompt format."""
