"""Brick's command-line tools start and stop PyTorch's profilers on the user's behalf; Kineto
then writes "USDT: ... profiler_start / profiler_stop" notices to stderr (file descriptor 2, from
C++). Those two calls run with fd 2 captured: the notices are dropped, every other line is written
back to stderr unchanged. Profilers the user's own code starts are left alone."""

import contextlib
import os
import sys
import tempfile


@contextlib.contextmanager
def without_kineto_notices():
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode(errors="replace").splitlines(keepends=True):
                if not line.startswith("USDT:"):
                    sys.stderr.write(line)
            sys.stderr.flush()


class QuietProfile:
    """``with QuietProfile(prof):`` enters and exits ``prof`` without Kineto's notices."""

    def __init__(self, prof):
        self.prof = prof

    def __enter__(self):
        with without_kineto_notices():
            self.prof.__enter__()
        return self.prof

    def __exit__(self, *exc):
        with without_kineto_notices():
            return self.prof.__exit__(*exc)
