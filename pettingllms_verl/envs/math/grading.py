"""Are two math answers equivalent? math-verify (sympy underneath), run in a child process.

Answers are model output: hostile text for a symbolic algebra system (``9^{9^{9^9}}`` makes
sympy compute for ever). math-verify bounds its work with ``SIGALRM``, which works only in a
process's main thread, while episodes step environments in worker threads. So answers are graded
in the main thread of a child process, where that alarm applies, and the caller also bounds its
wait: when the child does not answer in time (a C-level big-integer power ignores the alarm) it is
killed, restarted on the next call, and the answer counts as not equivalent. A process grades
through a small pool of such children, so that one hostile answer holds one child while the others
grade the rest of the episodes.

    python -m pettingllms_verl.envs.math.grading   # the child (started by AnswerGrader)
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading

from pettingllms_verl.sandbox.protocol import recv_frame, send_frame

MAX_ANSWER_CHARS = 200  # longer "answers" are not graded (competition answers are short)
GRADE_TIMEOUT_S = 5  # math-verify's own parse / verify budget, per call
_STARTUP_TIMEOUT_S = 120.0  # importing sympy + math-verify and its first parse, in the child
POOL_SIZE = 4  # children per process: a hostile answer holds one for up to 3 * GRADE_TIMEOUT_S + 1 s


def _gradable(gold: str | None, answer: str | None) -> bool:
    return bool(gold) and bool(answer) and len(answer) <= MAX_ANSWER_CHARS and len(gold) <= MAX_ANSWER_CHARS


class AnswerGrader:
    """Thread-safe; one child process per grader (started lazily, restarted after a fork or a kill)."""

    def __init__(self, timeout_s: int = GRADE_TIMEOUT_S):
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._conn: socket.socket | None = None
        self._pid = os.getpid()

    def equivalent(self, gold: str | None, answer: str | None) -> bool:
        """True when ``answer`` denotes the same value as ``gold`` (LaTeX or plain, without ``\\boxed``)."""
        if not _gradable(gold, answer):
            return False
        with self._lock:
            for _attempt in range(2):  # a child that died since the last call is replaced once
                conn = self._connection()
                try:
                    send_frame(conn, (gold, answer))
                    # parse gold, parse answer, verify: each has its own alarm in the child
                    conn.settimeout(3 * self.timeout_s + 1)
                    return bool(recv_frame(conn))
                except TimeoutError:  # the answer outlasted the alarm: wrong, and the child is stuck
                    self._stop()
                    return False
                except (OSError, EOFError, ValueError):  # the child is gone (or its reply was cut)
                    self._stop()
            return False

    def _connection(self) -> socket.socket:
        if self._pid != os.getpid():  # a forked copy must not share its parent's child
            self._process, self._conn, self._pid = None, None, os.getpid()
        if self._process is None or self._process.poll() is not None:
            self._stop()
            ours, theirs = socket.socketpair()
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), str(self.timeout_s)],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
            theirs.close()
            ours.settimeout(_STARTUP_TIMEOUT_S)
            recv_frame(ours)  # "ready": math-verify imported
            self._conn = ours
        return self._conn

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process, self._conn = None, None

    def close(self) -> None:
        with self._lock:
            self._stop()


class GraderPool:
    """Up to ``size`` graders, each with its child, for concurrent callers: a call takes an idle
    grader (waiting for one when all are busy). Last in, first out: calls that never overlap keep
    reusing one child, and another starts only when calls overlap (about 60 MiB each)."""

    def __init__(self, size: int = POOL_SIZE, timeout_s: int = GRADE_TIMEOUT_S):
        self._graders = [AnswerGrader(timeout_s) for _ in range(size)]
        self._idle: queue.LifoQueue[AnswerGrader] = queue.LifoQueue()
        for grader in self._graders:
            self._idle.put(grader)

    def equivalent(self, gold: str | None, answer: str | None) -> bool:
        """``AnswerGrader.equivalent`` on an idle grader."""
        if not _gradable(gold, answer):
            return False  # without waiting for a grader
        grader = self._idle.get()
        try:
            return grader.equivalent(gold, answer)
        finally:
            self._idle.put(grader)

    def close(self) -> None:
        for grader in self._graders:
            grader.close()


_pool = GraderPool()


def _new_pool_after_fork() -> None:
    """A forked copy grades through children of its own, and through a queue of its own: its
    parent's lock may have been held by another thread at the fork, and its graders in use."""
    global _pool
    _pool = GraderPool()


os.register_at_fork(after_in_child=_new_pool_after_fork)


def equivalent(gold: str | None, answer: str | None) -> bool:
    """``GraderPool.equivalent`` on this process's shared pool."""
    return _pool.equivalent(gold, answer)


def _serve(conn: socket.socket, timeout_s: int) -> None:
    import logging

    from math_verify import LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # a timeout is an outcome here, not news

    def parsed(text: str):
        # LaTeX extraction only: math-verify's default also reads plain expressions, which falls back
        # on the last number of a text it cannot parse whole ("\lambda=2\sqrt{2}, A(\pm 1, 0)" became
        # 0, equal to any answer ending in 0); unparsed, an answer is compared as text
        return parse(f"\\boxed{{{text}}}", extraction_config=[LatexExtractionConfig()], parsing_timeout=timeout_s)

    # math-verify builds its LaTeX grammar at the first parse (~0.2 s idle, several times that on a
    # busy machine): do it before "ready", so a caller's per-answer budget covers grading only
    one = parse("\\boxed{1}", parsing_timeout=None)  # None: no alarm; the parent's start-up wait bounds it
    verify(one, one)
    send_frame(conn, "ready")
    while True:
        try:
            gold, answer = recv_frame(conn)
        except (ConnectionError, EOFError, OSError):
            return  # the parent hung up or died
        try:
            result = bool(verify(parsed(gold), parsed(answer), timeout_seconds=timeout_s))
        except BaseException:  # math-verify's own timeout, or anything sympy throws at odd input
            result = False
        send_frame(conn, result)


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])), int(sys.argv[2]))
