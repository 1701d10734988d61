"""The policy and what it is built of: model loading, the VLM policy with its value and temperature heads, references,
action distributions, rollout engines."""
