"""Progress for the long commands (bench, stress, the fuzzer): a tqdm bar with what is left when the output is a
terminal; otherwise no bar at all, only one line per stage (what finished, and how), so logs stay readable."""

from __future__ import annotations

import sys

__all__ = ["Progress"]


class Progress:
    """``total`` steps in stages. ``step()`` after each step; ``stage(line)`` when a stage ends."""

    def __init__(self, total: int, desc: str, stream=None, enabled: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.bar = None
        if enabled and total and getattr(self.stream, "isatty", lambda: False)():
            try:
                from tqdm import tqdm
            except ImportError:  # the bar is a nicety: without tqdm the stage lines remain
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=desc, file=self.stream, dynamic_ncols=True, leave=False)

    def step(self, detail: str = "", n: int = 1) -> None:
        """``n`` steps done; ``detail`` (if given) is shown beside the bar from now on: pass what runs next, or the
        numbers of what just finished. ``step(detail, n=0)`` only changes the label."""
        if self.bar is None:
            return
        if detail and detail != self.bar.postfix:
            self.bar.set_postfix_str(detail, refresh=False)
            self.bar.update(n)
            self.bar.refresh()  # update() redraws only every so often: the new label shows at once
        else:
            self.bar.update(n)

    def stage(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
