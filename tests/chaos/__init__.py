"""The chaos suite: faults injected into ``comfysup run`` and a checker that counts what the promise forbids.

docs/design.md's promise (nothing lost, nothing terminal twice, never two executions of one job at once, a
re-execution only when a fault destroyed the run, ``done`` only with complete files, secrets kept) is
shown here by figures, in the style of Jepsen's queue checkers:

- :mod:`chaos.faults`: the seed every run records (``CHAOS_SEED`` replays it) and the fault log in which
  a scenario writes each fault it injects, with its time and target.
- :mod:`chaos.checker`: after a run has drained, reads the submissions, the queue, the result store,
  fake_comfy's execution log, the logs and command outputs, and counts every violation.
- :mod:`chaos.harness`: ``comfysup run`` on ``cpu:2`` with fake servers that keep an execution log.
- :mod:`chaos.scenarios`: one function per row of the fault table, sized by its caller: the
  fast tests (tests/chaos/test_chaos.py) run them small, ``bench/chaos.py`` at full scale.
  :mod:`chaos.power_rows` holds the power cuts (P1, P2), on the lazy filesystem of tests/lazyfs.py.

Imported as ``chaos`` with ``tests/`` on ``sys.path`` (pytest puts it there; bench/chaos.py does it itself),
next to the helpers it reuses (``supervisor_support``, ``cli_support``).
"""
