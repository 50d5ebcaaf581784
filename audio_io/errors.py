"""The one error type for what a user can fix (a flag, a file, a missing package, model or device).

The CLI prints a `UserError` as one line; any other exception is a bug and keeps its traceback. It subclasses
`ValueError` so that library callers catching bad input the usual way still do. It lives in the lowest package,
which every other one may import (`agent -> llm, tts, audio_io`; `llm, tts -> audio_io`), so no package cycle.
"""


class UserError(ValueError):
    pass
