"""The command line. When it is the program being run, Ctrl-C while the rest of it loads
ends the process quietly, as a signal (the shell shows 130), instead of with a traceback
from whatever module was being imported; main() restores Python's KeyboardInterrupt once it
can turn one into a clean exit. Imported by anything else (tests, other programs), it leaves
their SIGINT alone. Only modules the interpreter has already loaded come before the handler
(the `localinfer` console script imports localinfer.cli.app directly, not through __main__):
each import before it would be a moment where Ctrl-C still printed a traceback."""

import os
import signal
import sys

_program = sys.argv[0] if sys.argv else ""
if "localinfer" in (os.path.basename(_program), os.path.basename(os.path.dirname(_program))):
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:  # imported on a thread other than the main one: SIGINT is not ours to set
        pass
