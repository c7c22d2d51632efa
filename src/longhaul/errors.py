"""The one user-facing error type.

A `LonghaulError` carries a single line that names what is wrong and how to fix it.
The CLI prints it without a traceback (unless `--debug`) and exits non-zero.
"""


class LonghaulError(Exception):
    """An error caused by the user's input or environment, with the fix in the message."""

    exit_code = 2
    label = "error"  # what the CLI prints before the message
