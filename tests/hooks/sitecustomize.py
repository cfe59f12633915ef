"""Loaded at the start of every Python process whose PYTHONPATH begins with this folder
(``tests/_support.Pauses`` puts it there): where ``LM_TEST_PAUSE`` holds a JSON list of rules,
the ``lm`` process that a rule names stops at a named point, says so, and waits. A test that
must act on a process in a given state (kill it while a checkpoint is half-written, signal it
while it trains) waits for that line instead of polling on time.

A rule: ``where`` ``step`` (optimizer step ``at`` is about to start: its batches are asked for) or
``write`` (the first file of a checkpoint is written, the checkpoint is not); ``only`` (optional) a
text the process's command line must hold when it gets there (a job worker of ``lm compare --jobs``
sets ``sys.argv`` to each run's ``lm train`` command before training it); ``passes`` (optional) how
many times the point is reached and passed before it stops there (``lm bench`` trains its runs one
after another in one process: ``passes: 1`` stops the second run); then ``tell`` a FIFO to
write one line on (``WHERE AT PID``) and ``then`` ``forever`` (wait to be killed) or ``signal``
(wait for SIGINT or SIGTERM, then hand it to the process's own handler and go on); or ``wait_for`` a
FIFO to read one line from before going on."""

from __future__ import annotations

import json
import os
import select
import signal
import sys

STOPS = {signal.SIGINT, signal.SIGTERM}


def _stop(rule: dict) -> None:
    if "wait_for" in rule:
        with open(rule["wait_for"]) as fifo:
            fifo.readline()
        return
    if rule.get("then") == "forever":
        _tell(rule)
        while True:
            signal.pause()
    # Caught before the line is written, so a signal sent as soon as it is read is not lost. A
    # process-directed signal may reach any thread (torch's among them), so the main thread does
    # not wait for it in sigwait, which only takes a signal pending for itself: Python's C
    # handler, in whichever thread, writes to the wakeup pipe this thread waits on, and the
    # handler below then runs here.
    received: list[int] = []
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    wakeup = signal.set_wakeup_fd(write_end)
    handlers = {s: signal.signal(s, lambda n, _: received.append(n)) for s in STOPS}
    try:
        _tell(rule)
        while not received:
            # The timeout only re-reads the list should the handler run after the wakeup.
            if select.select([read_end], [], [], 1.0)[0]:
                os.read(read_end, 64)
    finally:
        for stop, handler in handlers.items():
            signal.signal(stop, handler)
        signal.set_wakeup_fd(wakeup)
        os.close(read_end)
        os.close(write_end)
    signal.raise_signal(received[0])  # now to lm's own handler


def _tell(rule: dict) -> None:
    with open(rule["tell"], "a") as fifo:
        fifo.write(f"{rule['where']} {rule.get('at', 0)} {os.getpid()}\n")


def _applies(rule: dict) -> bool:
    """Not yet done, named by this process's command line as it is now, and passed as often as
    the rule says."""
    if rule.get("done") or rule.get("only", "") not in " ".join(sys.argv):
        return False
    rule["passed"] = rule.get("passed", 0) + 1
    return rule["passed"] > rule.get("passes", 0)


def _install(rules: list[dict]) -> None:
    import lm.data.batches
    import lm.runs.checkpoint

    for rule in rules:
        if rule["where"] == "step":
            step_of = lm.data.batches.TrainBatches.step

            def step(self, i, _rule=rule, _step_of=step_of):
                if i == _rule["at"] and _applies(_rule):
                    _rule["done"] = True
                    _stop(_rule)
                return _step_of(self, i)

            lm.data.batches.TrainBatches.step = step
        elif rule["where"] == "write":
            for name in ("save_model", "save_file"):
                write = getattr(lm.runs.checkpoint, name)

                def written(*args, _rule=rule, _write=write, **kwargs):
                    result = _write(*args, **kwargs)
                    if _applies(_rule):
                        _rule["done"] = True
                        _stop(_rule)
                    return result

                setattr(lm.runs.checkpoint, name, written)


if os.environ.get("LM_TEST_PAUSE"):
    _install(json.loads(os.environ["LM_TEST_PAUSE"]))
