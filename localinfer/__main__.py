"""`python -m localinfer`. Ctrl-C while the command line loads must end the process as the
signal does (the shell shows 130), not with a traceback from whatever module was being
imported: so SIGINT's default action goes in before this module imports anything else, and
main() turns it back into KeyboardInterrupt once it can catch one. (Loading the CLI takes
tens of milliseconds, far longer on a slow machine; localinfer/cli/__init__.py did this too,
but only after its own imports, which left a window open.)"""

import signal

try:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
except ValueError:  # run (by runpy) in a thread other than the main one: SIGINT is not ours to set
    pass

from localinfer.cli.app import main  # noqa: E402 - after the handler, on purpose

main()
