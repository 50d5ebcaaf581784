"""The one error type for what a user can fix (a flag, a file, a missing package, model or device).

The CLI prints a `UserError` as one line; any other exception is a bug and keeps its traceback. It subclasses
`ValueError` so that library callers catching bad input the usual way still do.
"""


class UserError(ValueError):
    pass
