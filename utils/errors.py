"""The one base class of errors in what a user asked for (a config value, a path, a backend this machine
cannot run, a data file): the command-line entry points print them as `error: ...` without a traceback,
since the message already says what to do. Anything else is a bug and keeps its traceback."""
from __future__ import annotations


class UserError(Exception):
    pass
