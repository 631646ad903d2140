"""The errors that end a run with one `error: ...` line (common/cli.py) instead of a traceback: each names what is
wrong and, where there is a choice, the valid choices."""


class ConfigError(ValueError):
    """A bad config, checkpoint or option: raised before any work starts, with the valid choices in the message."""


class ShardError(ValueError):
    """Data that cannot be read or prepared: a corrupt or foreign shard, too little data for one batch."""


class HubUnavailable(ShardError, RuntimeError):
    """Data or a tokenizer that needs the Hugging Face hub, which cannot be reached (offline)."""


class NonFinite(RuntimeError):
    """The loss or the weights stopped being finite: the run stops without checkpointing that state."""


USER_ERRORS = (ConfigError, ShardError, FileNotFoundError, NonFinite)
