#    Licensed under the Apache License, Version 2.0 (the "License"); you may
#    not use this file except in compliance with the License. You may obtain
#    a copy of the License at
#
#         http://www.apache.org/licenses/LICENSE-2.0
#
#    Unless required by applicable law or agreed to in writing, software
#    distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
#    WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
#    License for the specific language governing permissions and limitations
#    under the License.

"""Run Python code "on node A" of the testbed: a worker process per node.

Node A is a network namespace of the one guest kernel.  Anything that must
act as node A (LIO binds a portal in the namespace of the process that
configures it; later the Cinder driver for node A) has to run in a process
inside that namespace, and a root helper cannot get it there: oslo's
processutils ignores ``root_helper`` when running as root.  So a
:class:`NodeProcess` starts a fresh Python interpreter on the node (through
the topology's ``exec`` prefix, ``on-node-a``, which also makes configfs
visible) and runs callables there, one at a time, returning their results::

    from tests.harness import workers

    with workers.NodeProcess('a') as node_a:
        node_a.call(os.getpid)                      # any importable callable
        node_a.run(['ip', '-o', 'addr'])            # a command, on node A
        driver = node_a.call(mymodule.make_driver)  # state lives in the worker
        node_a.call(mymodule.export, 'vol-1')

Callables and arguments travel by pickle: pass module-level functions (a test
module's own functions work, it is importable as ``tests.functional.x``),
not lambdas or closures.  Objects created in the worker stay there between
calls; keep them in module globals of a helper module, or use
:func:`remember`/:func:`recall`.  An exception raised on the node is raised
again in the caller (same type when it pickles, else :class:`RemoteError`)
with the node's traceback attached as a note.  The worker's stdout and
stderr go to the caller's stderr (so pytest shows them with a failure).

Node B is the initial network namespace, i.e. the pytest process itself;
``NodeProcess('b')`` still gives an isolated interpreter there when a test
needs one (e.g. separate oslo.config state).
"""

import multiprocessing.connection
import os
import pickle
import subprocess
import sys
import time
import traceback

from tests.harness import testbed

DEFAULT_CALL_TIMEOUT = 600
START_TIMEOUT = 120


class RemoteError(Exception):
    """An exception from the node that could not travel as itself."""


class NodeProcessDied(Exception):
    pass


class NodeProcess(object):
    """A Python worker process running on testbed node ``node``."""

    def __init__(self, node='a', call_timeout=DEFAULT_CALL_TIMEOUT,
                 env=None, stderr_path=None):
        """``stderr_path``: the worker's stderr goes there, not ours."""
        self.node = testbed.topology().node(node)
        self.call_timeout = call_timeout
        self.env = env
        self.stderr_path = stderr_path
        self.proc = None
        self._conn_in = self._conn_out = None
        self.info = None

    # ---- life cycle ----
    def start(self):
        topo = testbed.topology()
        env = dict(os.environ)
        env['PYTHONPATH'] = os.pathsep.join(
            [topo.src] + [p for p in env.get('PYTHONPATH', '').split(
                os.pathsep) if p and p != topo.src])
        env.update(self.env or {})
        argv = list(self.node.exec_prefix) + [
            sys.executable, '-m', 'tests.harness.workers', '--serve']
        stderr = None
        if self.stderr_path:
            stderr = open(self.stderr_path, 'ab')
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE,
                                         stderr=stderr, env=env,
                                         cwd=topo.src)
        finally:
            if stderr is not None:
                stderr.close()
        # the worker owns the other ends; we talk through these two pipes
        self._conn_out = multiprocessing.connection.Connection(
            os.dup(self.proc.stdin.fileno()), readable=False)
        self._conn_in = multiprocessing.connection.Connection(
            os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        t0 = time.monotonic()
        self.info = self._receive(START_TIMEOUT, 'start')
        testbed.LOG.info('worker on %s started in %.1f s: %s', self.node.name,
                         time.monotonic() - t0, self.info)
        return self

    def close(self, timeout=30):
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                try:
                    self._conn_out.send(None)
                except OSError:
                    pass
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            for conn in (self._conn_in, self._conn_out):
                if conn is not None:
                    conn.close()
            self._conn_in = self._conn_out = None
            self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # ---- calls ----
    def call(self, fn, *args, **kwargs):
        """Run ``fn(*args, **kwargs)`` on the node and return its result."""
        return self.call_with_timeout(self.call_timeout, fn, *args, **kwargs)

    def call_with_timeout(self, timeout, fn, *args, **kwargs):
        if self.proc is None:
            raise NodeProcessDied('worker on %s is not running'
                                  % self.node.name)
        self._conn_out.send((fn, args, kwargs))
        ok, value, remote_tb = self._receive(timeout, _describe(fn))
        if ok:
            return value
        value.add_note('--- raised on %s (worker pid %s):\n%s' % (
            self.node.name, self.info.get('pid'), remote_tb))
        raise value

    def run(self, cmd, check=True, input=None, timeout=300):
        """Run a command on the node; return the CompletedProcess."""
        return self.call_with_timeout(timeout + 30, _run_command, cmd, check,
                                      input, timeout)

    def _receive(self, timeout, what):
        deadline = time.monotonic() + timeout
        while not self._conn_in.poll(1):
            rc = self.proc.poll()
            if rc is not None:
                self.kill()
                raise NodeProcessDied('worker on %s exited (status %s) during '
                                      '%s' % (self.node.name, rc, what))
            if time.monotonic() > deadline:
                self.kill()
                raise NodeProcessDied('worker on %s: no answer to %s within '
                                      '%d s; killed' % (self.node.name, what,
                                                        timeout))
        try:
            return self._conn_in.recv()
        except EOFError:
            self.kill()
            raise NodeProcessDied('worker on %s closed its pipe during %s'
                                  % (self.node.name, what))

    def answers(self, timeout=60):
        """True while the worker runs and answers a call within ``timeout``.

        A worker whose node was powered off or rebooted does not (its
        local end notices only when it next sends): it is killed then.
        """
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            self.call_with_timeout(timeout, os.getpid)
        except NodeProcessDied:
            return False
        return True

    def kill(self):
        """Kill the worker (if it still runs) and let it go.

        For a worker that does not answer, or one on a node that was
        powered off: nothing is asked of it.
        """
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.close()


class NodeCalls(object):
    """Functions run on a node's kernel: here, or in a worker on it.

    In the one-kernel layout, and for the caller's own node, a call is a
    plain call; on another kernel it runs in a :class:`NodeProcess` on
    that node, one per node, kept until :meth:`forget` or :meth:`close`.
    For the harness's views of a node (its LVs, LIO targets, devices'
    data), not for a node's services, whose workers are their own.
    """

    def __init__(self, stderr_path=None):
        """``stderr_path``: the workers' stderr (see NodeProcess)."""
        self.stderr_path = stderr_path
        self._workers = {}

    def call(self, node_key, fn, *args):
        """``fn(*args)`` on node ``node_key``'s kernel; its result."""
        if not testbed.topology().separate \
                or node_key == testbed.local_node():
            return fn(*args)
        worker = self._workers.get(node_key)
        if worker is None:
            worker = NodeProcess(node_key,
                                 stderr_path=self.stderr_path).start()
            self._workers[node_key] = worker
        return worker.call(fn, *args)

    def forget(self, node_key):
        """Drop the worker on a node that was powered off."""
        worker = self._workers.pop(node_key, None)
        if worker is not None:
            worker.kill()

    def forget_silent(self):
        """Drop the workers that no longer answer.

        (Their node was powered off or rebooted since they started.)
        """
        for key, worker in list(self._workers.items()):
            if not worker.answers():
                self.forget(key)

    def close(self):
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()


def _describe(fn):
    return '%s.%s' % (getattr(fn, '__module__', '?'),
                      getattr(fn, '__qualname__', repr(fn)))


def _run_command(cmd, check, input, timeout):
    proc = subprocess.run([str(c) for c in cmd], input=input,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode:
        raise testbed.CommandError(proc.returncode, proc.args, proc.stdout,
                                   proc.stderr)
    return proc


# ---- state kept in the worker between calls ----
_MEMORY = {}


def remember(key, value):
    """Keep ``value`` in the worker under ``key`` (call this on the node)."""
    _MEMORY[key] = value


def recall(key):
    return _MEMORY[key]


# ---- the worker side ----
def netns_inode(pid='self'):
    return os.stat('/proc/%s/ns/net' % pid).st_ino


def _serve():
    # The protocol owns the original stdin/stdout; anything the code under
    # test prints (or a child process inherits) goes to stderr instead.
    conn_in = multiprocessing.connection.Connection(os.dup(0),
                                                    writable=False)
    conn_out = multiprocessing.connection.Connection(os.dup(1),
                                                     readable=False)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    conn_out.send({'pid': os.getpid(), 'netns_inode': netns_inode(),
                   'configfs': os.path.isdir(testbed.LIO_ROOT)})
    while True:
        try:
            request = conn_in.recv()
        except EOFError:
            return
        if request is None:
            return
        fn, args, kwargs = request
        try:
            reply = (True, fn(*args, **kwargs), None)
            payload = pickle.dumps(reply)
        except BaseException as exc:  # everything goes back to the caller
            tb = traceback.format_exc()
            try:
                payload = pickle.dumps((False, exc, tb))
                pickle.loads(payload)
            except Exception:
                payload = pickle.dumps(
                    (False, RemoteError('%s: %s' % (type(exc).__name__, exc)),
                     tb))
        conn_out.send_bytes(payload)


if __name__ == '__main__' and sys.argv[1:] == ['--serve']:
    _serve()
