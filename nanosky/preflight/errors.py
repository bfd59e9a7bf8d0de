"""The one error of the start-up checks: a bad flag or input, said in one line."""


class UsageError(Exception, SystemExit):
    """A bad flag or input: run.py prints it as one line and exits with status 2. An Exception, and also a
    SystemExit, as argparse's and tyro's parse errors are: a caller of `parse_args` that stops on those stops on
    this too, and uncaught it prints its line and exits (status 1) without a traceback."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.code = msg
