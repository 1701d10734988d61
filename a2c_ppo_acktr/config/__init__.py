"""The run config (one dataclass per section, with its validations) and its command line."""
