"""The one exception type that means "the user's input or machine is not right"."""


class TracekitError(Exception):
    """A problem the user can fix: printed as one line by the CLI, never as a traceback.

    The message says what is wrong and what to do about it.
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
