"""Where the tracebacks of bugs go: the screen shows one line per failed turn, the log file the rest."""
from __future__ import annotations

import logging
import os
from pathlib import Path

LOGGER = "s5"


def log_path() -> Path:
    """$S5_LOG, else ~/.cache/s5/s5.log."""
    return Path(os.environ.get("S5_LOG") or Path.home() / ".cache" / "s5" / "s5.log").expanduser()


def log_to_file() -> Path:
    """Send the `s5` loggers' records to the log file (once per process); returns its path."""
    logger, path = logging.getLogger(LOGGER), log_path()
    if not any(isinstance(h, logging.FileHandler) for h in logger.handlers):
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False  # the screen gets the one-line error, not the traceback
    return path


def where_logged() -> str:
    logger = logging.getLogger(LOGGER)
    files = [h.baseFilename for h in logger.handlers if isinstance(h, logging.FileHandler)]
    return f"traceback in {files[0]}" if files else "traceback on stderr"
