"""The errors of a wrong option value, and the checks that raise them.

An option is checked once, where its dataclass is built (__post_init__); the front door that built
it from keywords (config/keywords.py) prefixes the call the user wrote (OptionError.naming)."""


class OptionError(Exception):
    """A wrong option value; the message says what was expected. Raised as OptionTypeError (a value
    of the wrong type) or OptionValueError (one out of range), which are TypeError / ValueError."""

    def naming(self, call: str) -> "OptionError":
        """The same error, its message starting with the call that gave the option."""
        return type(self)(f"{call}: {self}")


class OptionTypeError(OptionError, TypeError):
    pass


class OptionValueError(OptionError, ValueError):
    pass


def check_int(name: str, value, minimum: int = 0) -> None:
    if type(value) is not int:  # bool is not an int here
        raise OptionTypeError(f"{name}={value!r}; expected an int >= {minimum}")
    if value < minimum:
        raise OptionValueError(f"{name}={value!r}; expected an int >= {minimum}")


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise OptionTypeError(f"{name}={value!r}; expected True or False")
