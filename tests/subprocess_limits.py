"""How long a test lets a child process run (torch imported, a graph compiled) before it calls
it hung. Not a speed bound: a cold, loaded machine took over 60 s to start torch and compile a
small graph (issue 52), so the bound sits just under pytest-timeout's 600 s per test, which
still catches a hang, with the child's own error instead of pytest's."""

SUBPROCESS_TIMEOUT_S = 540
