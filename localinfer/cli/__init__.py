"""The command line. When it is the program being run, Ctrl-C while the rest of it loads
ends the process quietly, as a signal (the shell shows 130), instead of with a traceback
from whatever module was being imported; main() restores Python's KeyboardInterrupt once it
can turn one into a clean exit. Imported by anything else (tests, other programs), it leaves
their SIGINT alone."""

import signal
import sys
import threading
from pathlib import Path

_program = Path(sys.argv[0] if sys.argv else "")
if threading.current_thread() is threading.main_thread() and "localinfer" in (_program.name, _program.parent.name):
    signal.signal(signal.SIGINT, signal.SIG_DFL)
