"""User-facing errors.

Library code raises these; only the CLI edge turns them into one line on stderr, as it
does an OSError (a file or disk the machine refused). Anything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """Something the user can fix; the message says what to do next."""

    exit_code = 1


class ModelNotFound(UserError):
    """A model reference matched nothing local, in the catalog, or on the hub."""


class InvalidModelFile(UserError):
    """A file that is not a GGUF, or a GGUF that is truncated or corrupt."""


class ContextOverflow(UserError):
    """The prompt does not fit in the context window."""


class OutOfMemory(UserError):
    """The model and its KV cache would not fit in free memory."""


class DownloadError(UserError):
    """A pull failed: no network, a missing file, or a checksum mismatch."""


class TemplateError(UserError):
    """The model's chat template failed to render."""


class PathNotAllowed(UserError):
    """A server request named a file on the server's disk, which `serve` refuses unless --allow-paths."""


class ConstraintError(UserError):
    """A JSON schema, regex or grammar for structured output that cannot be used."""


class BackendError(UserError):
    """The inference backend refused to load or run the model."""


class BackendLost(BackendError):
    """The backend's process is gone (a lost RPC worker aborted it): every request on it ends,
    and the model must be loaded again."""


class OutputClosed(Exception):
    """Whoever read our stdout has gone (`localinfer run ... | head`): stop quietly.
    Not an OSError, so that click does not turn it into its own exit 1."""
