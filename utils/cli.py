"""The `__main__` wrapper of the command-line scripts: a user's mistake (utils.errors.UserError, a missing or
existing path) prints one `error: ...` line, Ctrl-C one `interrupted` line, and any other exception keeps
its traceback, since that one is a bug to report.

    if __name__ == "__main__":
        run_cli(main)
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from utils.errors import UserError

USER_ERRORS = (UserError, FileNotFoundError, FileExistsError)


def run_cli(main: Callable[[], object]) -> NoReturn:
    """Run main() and exit: 0 after it returns, 1 after a user error, 130 (the shell's code for SIGINT) after Ctrl-C."""
    try:
        main()
    except USER_ERRORS as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt as e:
        # one line instead of a traceback through whatever code happened to be running; train.Interrupted
        # carries where the run stopped and how to continue it
        print(f"error: {e}" if str(e) else "interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(0)
