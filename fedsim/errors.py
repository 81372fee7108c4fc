"""fedsim's error hierarchy: every user-facing failure is one of these, caught by the CLI."""

# Where the ``fedsim`` command records the type and message of the error it stops with, when set (how
# ``fedsim sweep`` learns why a cell's process failed)
ERROR_FILE_ENV = "FEDSIM_ERROR_FILE"
# Set (``fedsim --debug``, or by hand; inherited by every process fedsim starts): a plugin's exception goes
# up with its traceback instead of one line naming the plugin and its method
DEBUG_ENV = "FEDSIM_DEBUG"


def brief(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error message quotes what it got, never megabytes of it."""
    try:
        text = repr(value)
    except Exception:  # an int of more than 4,300 digits (a ValueError), an API caller's object whose repr fails
        text = f"<{type(value).__name__} without a printable form>"
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def one_line(problems: list[str]) -> str:
    """Several problems found at once as the one line an error is: ``2 errors: (1) a; (2) b`` (numbered, as a
    problem may hold a semicolon itself: ``unknown key; valid keys: ...``)."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} errors: " + "; ".join(f"({i}) {problem}" for i, problem in enumerate(problems, 1))


class FedsimError(Exception):
    """Base of every error fedsim raises on purpose; the CLI prints its message, no traceback."""


class FedsimWarning(UserWarning):
    """Base of fedsim's warnings: what fedsim reads and goes on with, but says (the CLI prints each as one line,
    ``fedsim: warning: ...``)."""


class ConfigError(FedsimError):
    """A config field has a bad value; the message names the field and what is allowed."""


class RegistryError(FedsimError):
    """An unknown or duplicate name in a registry, or a plugin that fails to load."""


class DataError(FedsimError):
    """A dataset cannot be found, read or partitioned as asked."""


class EnvironmentFault(FedsimError):
    """The process's environment cannot run fedsim: a deleted working directory, a temp directory that cannot be
    written, a library that does not load, an address-space limit too low; the message says what to change."""


class TrainingError(FedsimError):
    """Training diverged (NaN / inf) or a client failed beyond the failure policy."""


class ClusterLost(TrainingError):
    """The head of the Ray cluster a run's workers live on stopped answering mid-run: no round can go on."""


class PluginExit(FedsimError):
    """A plugin called ``sys.exit`` or ``os._exit``: a failure of the plugin, never a run ending as a success
    (:mod:`fedsim.plugin_guard`)."""


class ProtocolError(FedsimError):
    """A ServerApp or ClientApp message lacks what fedsim's protocol (docs/protocol.md) needs."""


class LinkError(FedsimError):
    """A symbolic or hard link where fedsim would write, truncate or delete in a directory of its own
    (:mod:`fedsim.files`): writing through it would change a file elsewhere."""


class WriteError(FedsimError):
    """A file or directory fedsim could not write, make or remove (a full disk, a read-only directory):
    ``path`` and the operating system's ``strerror``."""

    def __init__(self, message: str, path: object, strerror: str) -> None:
        super().__init__(message)
        self.path, self.strerror = path, strerror


class ChildExit(FedsimError):
    """A fedsim process this one ran for the same command ended with ``code`` and has said why itself."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exit status {code}")
        self.code = code
